"""ingest_archive against a corpus of hostile zip and tar archives built here."""

from __future__ import annotations

import hashlib
import io
import os
import struct
import tarfile
import tracemalloc
import zipfile
from pathlib import Path
from typing import Callable, Iterable

import pytest

from tests.support.archives import zip_bytes
from vidlora.config import Settings
from vidlora.ingest.archive import ARCHIVE_LABEL, MemberOutcome, ingest_archive
from vidlora.ingest.kinds import is_archive_name
from vidlora.ingest.store import MediaStore, StoreError

MiB = 1024 * 1024
GOOD_A = b"\x00\x00\x00\x18ftypmp42 fake video A " + os.urandom(4000)
GOOD_B = b"\x00\x00\x00\x18ftypmp42 fake video B " + os.urandom(6000)


# -- corpus builders --------------------------------------------------------------------------
def write_zip(path: Path, members: Iterable[tuple[str, bytes] | zipfile.ZipInfo | tuple[zipfile.ZipInfo, bytes]],
              compression: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression) as zf:
        for m in members:
            if isinstance(m, tuple) and isinstance(m[0], zipfile.ZipInfo):
                m[0].compress_type = compression
                zf.writestr(m[0], m[1])
            else:
                name, data = m  # type: ignore[misc]
                info = zipfile.ZipInfo(name)
                info.compress_type = compression
                zf.writestr(info, data)
    return path


def patch_zip_entry(path: Path, name: str, *, flag_or: int = 0, cd_compress_size: int | None = None) -> None:
    """Rewrite header fields of one entry in place (what a hostile tool would emit)."""
    data = bytearray(path.read_bytes())
    raw = name.encode()
    pos = 0
    while (pos := data.find(b"PK\x03\x04", pos)) != -1:
        if data[pos + 30:pos + 30 + len(raw)] == raw:
            flags = struct.unpack_from("<H", data, pos + 6)[0]
            struct.pack_into("<H", data, pos + 6, flags | flag_or)
        pos += 4
    pos = 0
    while (pos := data.find(b"PK\x01\x02", pos)) != -1:
        if data[pos + 46:pos + 46 + len(raw)] == raw:
            flags = struct.unpack_from("<H", data, pos + 8)[0]
            struct.pack_into("<H", data, pos + 8, flags | flag_or)
            if cd_compress_size is not None:
                struct.pack_into("<I", data, pos + 20, cd_compress_size)
        pos += 4
    path.write_bytes(bytes(data))


def tar_info(name: str, type_: bytes = tarfile.REGTYPE, size: int = 0, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = type_, size, linkname
    return info


def write_tar(path: Path, members: Iterable[tuple[str, bytes] | tarfile.TarInfo], mode: str = "w") -> Path:
    with tarfile.open(path, mode, format=tarfile.PAX_FORMAT) as tf:
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                tf.addfile(m)
            else:
                name, data = m
                tf.addfile(tar_info(name, size=len(data)), io.BytesIO(data))
    return path


class Zeros(io.RawIOBase):
    def __init__(self, n: int) -> None:
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[no-untyped-def]
        k = min(len(b), self.left)
        b[:k] = bytes(k)
        self.left -= k
        return k


# -- helpers ----------------------------------------------------------------------------------
def run(path: Path, store: MediaStore, settings: Settings) -> dict[str, MemberOutcome]:
    outcomes = list(ingest_archive(path, store, settings))
    names = [o.name for o in outcomes]
    assert len(names) == len(set(names)), names
    return {o.name: o for o in outcomes}


def assert_clean(tmp_path: Path, store: MediaStore) -> None:
    """Only the inputs and content-addressed videos exist; no temp files; nothing escaped."""
    allowed = (tmp_path / "in", store.root / "videos")
    for p in tmp_path.rglob("*"):
        if p.is_file() or p.is_symlink():
            assert any(p.is_relative_to(a) for a in allowed), f"unexpected file {p}"
    for p in (store.root / "videos").rglob("*") if (store.root / "videos").exists() else []:
        if p.is_file():
            assert p.stem == hashlib.sha256(p.read_bytes()).hexdigest()
    assert not (store.root / "tmp").exists() or not any((store.root / "tmp").iterdir())
    for escaped in ("evil.mp4", "win.mp4", "abs.mp4"):
        assert not (tmp_path / escaped).exists() and not (tmp_path.parent / escaped).exists()
        assert not Path(os.getcwd(), escaped).exists()
    assert not Path("/etc/abs.mp4").exists()


def expect(outcomes: dict[str, MemberOutcome], name: str, status: str, code: str | None) -> MemberOutcome:
    o = outcomes[name]
    assert (o.status, o.code) == (status, code), o
    assert (o.stored is not None) == (status == "stored"), o
    return o


# -- the hostile corpus -----------------------------------------------------------------------
def test_hostile_zip(tmp_path: Path, indir: Path, store: MediaStore, settings: Settings) -> None:
    link = zipfile.ZipInfo("link.mp4")
    link.external_attr = (0o120777 << 16)
    fifo = zipfile.ZipInfo("pipe.mp4")
    fifo.external_attr = (0o010644 << 16)
    inner = zip_bytes([("inner.mp4", b"inner video")])
    archive = write_zip(indir / "hostile.zip", [
        ("good/a.mp4", GOOD_A),
        ("../evil.mp4", b"escape"),
        ("/etc/abs.mp4", b"absolute"),
        ("..\\win.mp4", b"backslash traversal"),
        ("C:\\win.mp4", b"drive letter"),
        ("C:/drive.mp4", b"drive letter"),
        ("ok\\windows-sep.mp4", GOOD_B),
        (link, b"/etc/passwd"),
        (fifo, b""),
        ("nested.zip", inner),
        ("secret.mp4", b"pretend ciphertext"),
        ("notes.txt", b"not a video"),
        ("__MACOSX/good/._a.mp4", b"resource fork"),
        (".DS_Store", b"finder"),
        ("dup/a-again.mp4", GOOD_A),
        ("dir/", b""),
        ("term\x1b[31m.mp4", b"escape sequence in a name"),
    ])
    patch_zip_entry(archive, "secret.mp4", flag_or=0x1)
    with zipfile.ZipFile(archive) as zf:  # the builder really wrote the hostile names
        assert {"../evil.mp4", "/etc/abs.mp4", "..\\win.mp4"} <= set(zf.namelist())

    out = run(archive, store, settings)

    a = expect(out, "good/a.mp4", "stored", None)
    assert a.stored and a.stored.path.read_bytes() == GOOD_A and not a.stored.existed
    b = expect(out, "ok/windows-sep.mp4", "stored", None)
    assert b.stored and b.stored.path.read_bytes() == GOOD_B
    dup = expect(out, "dup/a-again.mp4", "stored", "duplicate")
    assert dup.stored and dup.stored.existed and dup.stored.path == a.stored.path
    assert "path traversal" in (expect(out, "../evil.mp4", "rejected", "unsafe_path").reason or "")
    assert "absolute" in (expect(out, "/etc/abs.mp4", "rejected", "unsafe_path").reason or "")
    expect(out, "..\\win.mp4", "rejected", "unsafe_path")
    expect(out, "C:\\win.mp4", "rejected", "unsafe_path")
    expect(out, "C:/drive.mp4", "rejected", "unsafe_path")
    expect(out, "link.mp4", "rejected", "symlink")
    expect(out, "pipe.mp4", "rejected", "special_file")
    expect(out, "nested.zip", "rejected", "nested_archive")
    expect(out, "secret.mp4", "rejected", "encrypted")
    expect(out, "notes.txt", "skipped", "not_video")
    expect(out, "__MACOSX/good/._a.mp4", "skipped", "macos_metadata")
    expect(out, ".DS_Store", "skipped", "hidden")
    expect(out, "term\\x1b[31m.mp4", "rejected", "unsafe_path")  # shown escaped
    assert "dir" not in out and "dir/" not in out  # directories produce no outcome
    assert ARCHIVE_LABEL not in out
    assert len(list((store.root / "videos").rglob("*.mp4"))) == 2
    assert_clean(tmp_path, store)


def test_hostile_tar(tmp_path: Path, indir: Path, store: MediaStore, settings: Settings) -> None:
    archive = write_tar(indir / "hostile.tar", [
        ("good/a.mp4", GOOD_A),
        ("../evil.mp4", b"escape"),
        ("/etc/abs.mp4", b"absolute"),
        ("..\\win.mp4", b"backslash"),
        ("a/../../evil.mp4", b"sneaky"),
        tar_info("link.mp4", tarfile.SYMTYPE, linkname="/etc/passwd"),
        tar_info("hard.mp4", tarfile.LNKTYPE, linkname="good/a.mp4"),
        tar_info("dev.mp4", tarfile.CHRTYPE),
        tar_info("blk.mp4", tarfile.BLKTYPE),
        tar_info("fifo.mp4", tarfile.FIFOTYPE),
        tar_info("subdir", tarfile.DIRTYPE),
        ("inner.tar.gz", b"whatever"),
        ("readme.md", b"text"),
        ("._b.mp4", b"appledouble"),
        ("b.MP4", GOOD_B),
        ("copy-of-a.mp4", GOOD_A),
    ])
    out = run(archive, store, settings)
    expect(out, "good/a.mp4", "stored", None)
    b = expect(out, "b.MP4", "stored", None)
    assert b.stored and b.stored.path.suffix == ".mp4"
    expect(out, "copy-of-a.mp4", "stored", "duplicate")
    for name in ("../evil.mp4", "/etc/abs.mp4", "..\\win.mp4", "a/../../evil.mp4"):
        expect(out, name, "rejected", "unsafe_path")
    expect(out, "link.mp4", "rejected", "symlink")
    expect(out, "hard.mp4", "rejected", "hardlink")
    for name in ("dev.mp4", "blk.mp4", "fifo.mp4"):
        expect(out, name, "rejected", "special_file")
    expect(out, "inner.tar.gz", "rejected", "nested_archive")
    expect(out, "readme.md", "skipped", "not_video")
    expect(out, "._b.mp4", "skipped", "hidden")
    assert "subdir" not in out and ARCHIVE_LABEL not in out
    assert_clean(tmp_path, store)


@pytest.mark.parametrize("mode,suffix", [("w:gz", ".tar.gz"), ("w:bz2", ".tar.bz2"),
                                         ("w:xz", ".tar.xz"), ("w:gz", ".tgz")])
def test_compressed_tars(tmp_path: Path, indir: Path, store: MediaStore, settings: Settings,
                         mode: str, suffix: str) -> None:
    archive = write_tar(indir / f"ok{suffix}", [("a.mp4", GOOD_A), ("b.mkv", GOOD_B)], mode)
    assert is_archive_name(archive.name)
    out = run(archive, store, settings)
    assert [o.status for o in out.values()] == ["stored", "stored"]
    assert_clean(tmp_path, store)


def test_is_archive() -> None:
    for name in ("a.zip", "A.TAR", "x.tar.gz", "x.tgz", "x.tar.bz2", "x.tar.xz", "x.txz"):
        assert is_archive_name(name), name
    for name in ("a.mp4", "a.gz", "zip", "a.zip.mp4"):
        assert not is_archive_name(name), name


# -- bombs and limits -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def zip_bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """200 MiB of zeros named .mp4, deflated to ~200 KiB (ratio ~1000:1)."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        zf.writestr("first.mp4", GOOD_A)
        with zf.open("bomb.mp4", "w") as w:
            chunk = bytes(MiB)
            for _ in range(200):
                w.write(chunk)
        zf.writestr("after.mp4", GOOD_B)
    assert path.stat().st_size < 1 * MiB
    return path


def test_zip_bomb_rejected_by_header_ratio(tmp_path: Path, zip_bomb: Path, store: MediaStore,
                                           make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(max_video_bytes=400 * MiB, archive_max_total_bytes=1024 * MiB)
    out = run(zip_bomb, store, settings)
    expect(out, "first.mp4", "stored", None)
    expect(out, "bomb.mp4", "rejected", "ratio_exceeded")
    expect(out, "after.mp4", "stored", None)
    assert_clean(tmp_path, store)


def test_zip_bomb_with_lying_header_caught_while_streaming(
        tmp_path: Path, indir: Path, zip_bomb: Path, store: MediaStore,
        make_settings: Callable[..., Settings]) -> None:
    lying = indir / "lying.zip"
    lying.write_bytes(zip_bomb.read_bytes())
    # The central directory now claims a 1:1 ratio; only counting real bytes can catch it.
    patch_zip_entry(lying, "bomb.mp4", cd_compress_size=200 * MiB)
    with zipfile.ZipFile(lying) as zf:
        info = zf.getinfo("bomb.mp4")
        assert info.compress_size == info.file_size == 200 * MiB
    settings = make_settings(max_video_bytes=400 * MiB, archive_max_total_bytes=1024 * MiB)
    tracemalloc.start()
    try:
        out = run(lying, store, settings)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    expect(out, "first.mp4", "stored", None)
    bomb = expect(out, "bomb.mp4", "rejected", "ratio_exceeded")
    assert "compressed bytes read" in (bomb.reason or "")
    assert peak < 16 * MiB, f"peak traced memory {peak} bytes"
    assert_clean(tmp_path, store)


def test_tar_gz_bomb_caught_while_streaming(tmp_path: Path, indir: Path, store: MediaStore,
                                            make_settings: Callable[..., Settings]) -> None:
    path = indir / "bomb.tar.gz"
    with tarfile.open(path, "w:gz", compresslevel=9) as tf:
        tf.addfile(tar_info("bomb.mp4", size=64 * MiB), Zeros(64 * MiB))  # type: ignore[arg-type]
        tf.addfile(tar_info("after.mp4", size=len(GOOD_B)), io.BytesIO(GOOD_B))
    settings = make_settings(max_video_bytes=100 * MiB, archive_max_total_bytes=1024 * MiB)
    tracemalloc.start()
    try:
        out = run(path, store, settings)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    expect(out, "bomb.mp4", "rejected", "ratio_exceeded")
    expect(out, "after.mp4", "stored", None)  # the stream stays usable after the rejection
    assert peak < 16 * MiB, f"peak traced memory {peak} bytes"
    assert_clean(tmp_path, store)


def test_member_over_max_video_bytes(tmp_path: Path, indir: Path, store: MediaStore,
                                     make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(max_video_bytes=5000)
    for writer, name in ((write_zip, "big.zip"), (write_tar, "big.tar")):
        big, small = os.urandom(5001), os.urandom(5000)
        out = run(writer(indir / name, [("big.mp4", big), ("small.mp4", small)]), store, settings)
        expect(out, "big.mp4", "rejected", "too_large")
        expect(out, "small.mp4", "stored", None)
    assert_clean(tmp_path, store)


def test_total_limit_stops_the_archive(tmp_path: Path, indir: Path, store: MediaStore,
                                       make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(max_video_bytes=10_000, archive_max_total_bytes=25_000)
    for archive in (indir / "t.zip", indir / "t.tar"):
        members = [(f"m{i}.mp4", os.urandom(9_000)) for i in range(4)]
        if archive.suffix == ".zip":
            write_zip(archive, members, zipfile.ZIP_STORED)
        else:
            write_tar(archive, members)
        out = run(archive, store, settings)
        assert [(o.name, o.status, o.code) for o in out.values()] == [
            ("m0.mp4", "stored", None), ("m1.mp4", "stored", None),
            ("m2.mp4", "rejected", "total_too_large"),
            (ARCHIVE_LABEL, "rejected", "total_too_large"),
        ]
    assert_clean(tmp_path, store)


def test_skipped_tar_members_count_towards_total(tmp_path: Path, indir: Path, store: MediaStore,
                                                 make_settings: Callable[..., Settings]) -> None:
    # tar can only be skipped by reading through it, so skipped data is work that counts.
    settings = make_settings(archive_max_total_bytes=20_000)
    archive = write_tar(indir / "s.tar", [("junk.bin", bytes(15_000)), ("junk2.bin", bytes(15_000)),
                                          ("a.mp4", GOOD_A)])
    out = run(archive, store, settings)
    expect(out, "junk.bin", "skipped", "not_video")
    expect(out, "junk2.bin", "rejected", "total_too_large")
    expect(out, ARCHIVE_LABEL, "rejected", "total_too_large")
    assert "a.mp4" not in out


def test_too_many_members(tmp_path: Path, indir: Path, store: MediaStore,
                          make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(archive_max_members=3)
    members = [(f"m{i}.mp4", f"video {i}".encode()) for i in range(5)]
    # zip: the central directory is counted first; nothing is extracted.
    out = run(write_zip(indir / "many.zip", members), store, settings)
    assert list(out) == [ARCHIVE_LABEL]
    expect(out, ARCHIVE_LABEL, "rejected", "too_many_members")
    assert not (store.root / "videos").exists()
    # tar: processed as a stream; the first three are kept.
    out = run(write_tar(indir / "many.tar", members), store, settings)
    assert [o.name for o in out.values() if o.status == "stored"] == ["m0.mp4", "m1.mp4", "m2.mp4"]
    expect(out, ARCHIVE_LABEL, "rejected", "too_many_members")
    # Exactly at the limit is fine.
    out = run(write_zip(indir / "three.zip", members[:3]), store, settings)
    assert [o.status for o in out.values()] == ["stored"] * 3
    assert_clean(tmp_path, store)


def test_oversized_pax_header_is_corrupt(tmp_path: Path, indir: Path, store: MediaStore,
                                         settings: Settings) -> None:
    path = indir / "pax.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        tf.addfile(tar_info("a.mp4", size=len(GOOD_A)), io.BytesIO(GOOD_A))
        huge = tar_info("b.mp4", size=len(GOOD_B))
        huge.pax_headers = {"comment": "x" * (2 * MiB)}
        tf.addfile(huge, io.BytesIO(GOOD_B))
    out = run(path, store, settings)
    expect(out, "a.mp4", "stored", None)
    assert "metadata header" in (expect(out, ARCHIVE_LABEL, "rejected", "corrupt").reason or "")
    assert "b.mp4" not in out


# -- nesting ----------------------------------------------------------------------------------
def test_nested_extract_descends_one_level(tmp_path: Path, indir: Path, store: MediaStore,
                                           make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(archive_nested="extract")
    deepest = zip_bytes([("deep.mp4", b"too deep")])
    inner = zip_bytes([("x.mp4", GOOD_B), ("deeper.zip", deepest), ("../evil.mp4", b"e")])
    tar_buf = io.BytesIO()
    with tarfile.open(fileobj=tar_buf, mode="w:gz") as tf:
        tf.addfile(tar_info("t.mp4", size=5), io.BytesIO(b"t-vid"))
    archive = write_zip(indir / "outer.zip", [
        ("a.mp4", GOOD_A), ("inner.zip", inner), ("sub/inner2.tgz", tar_buf.getvalue()),
        ("broken.zip", b"PK\x03\x04 not really"),
    ])
    out = run(archive, store, settings)
    expect(out, "a.mp4", "stored", None)
    assert expect(out, "inner.zip/x.mp4", "stored", None).stored.path.read_bytes() == GOOD_B  # type: ignore[union-attr]
    expect(out, "inner.zip/deeper.zip", "rejected", "nested_archive")
    expect(out, "inner.zip/../evil.mp4", "rejected", "unsafe_path")
    expect(out, "sub/inner2.tgz/t.mp4", "stored", None)
    expect(out, "broken.zip", "rejected", "corrupt")  # named after the nested archive
    assert "inner.zip" not in out and ARCHIVE_LABEL not in out
    assert_clean(tmp_path, store)


def test_nested_members_share_the_budget(tmp_path: Path, indir: Path, store: MediaStore,
                                         make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(archive_nested="extract", archive_max_members=4)
    inner = zip_bytes([(f"i{i}.mp4", f"inner {i}".encode()) for i in range(3)])
    archive = write_zip(indir / "outer.zip", [("a.mp4", GOOD_A), ("inner.zip", inner)])
    out = run(archive, store, settings)
    expect(out, "a.mp4", "stored", None)
    expect(out, ARCHIVE_LABEL, "rejected", "too_many_members")
    assert not any(name.startswith("inner.zip/") for name in out)
    assert_clean(tmp_path, store)


# -- damage -----------------------------------------------------------------------------------
def test_truncated_zip(tmp_path: Path, indir: Path, store: MediaStore, settings: Settings) -> None:
    full = write_zip(indir / "full.zip", [("a.mp4", GOOD_A), ("b.mp4", GOOD_B)]).read_bytes()
    cut = indir / "cut.zip"
    cut.write_bytes(full[: len(full) // 2])
    out = run(cut, store, settings)
    assert list(out) == [ARCHIVE_LABEL]
    expect(out, ARCHIVE_LABEL, "rejected", "corrupt")
    assert_clean(tmp_path, store)


def test_corrupt_zip_member_does_not_stop_the_rest(tmp_path: Path, indir: Path, store: MediaStore,
                                                   settings: Settings) -> None:
    path = write_zip(indir / "bad.zip", [("a.mp4", GOOD_A), ("b.mp4", GOOD_B)], zipfile.ZIP_STORED)
    data = bytearray(path.read_bytes())
    at = data.find(GOOD_A[:40]) + 100
    data[at:at + 10] = bytes(x ^ 0xFF for x in data[at:at + 10])  # CRC no longer matches
    path.write_bytes(bytes(data))
    out = run(path, store, settings)
    assert "CRC" in (expect(out, "a.mp4", "rejected", "corrupt").reason or "")
    expect(out, "b.mp4", "stored", None)
    assert_clean(tmp_path, store)


@pytest.mark.parametrize("mode,suffix", [("w", ".tar"), ("w:gz", ".tar.gz"), ("w:xz", ".tar.xz")])
def test_truncated_tar_keeps_earlier_members(tmp_path: Path, indir: Path, store: MediaStore,
                                             settings: Settings, mode: str, suffix: str) -> None:
    tail = os.urandom(300_000)  # incompressible, so a cut lands inside it
    full = write_tar(indir / f"full{suffix}", [("a.mp4", GOOD_A), ("b.mp4", GOOD_B),
                                               ("c.mp4", tail)], mode).read_bytes()
    cut = indir / f"cut{suffix}"
    cut.write_bytes(full[: len(full) - 150_000])
    out = run(cut, store, settings)
    expect(out, "a.mp4", "stored", None)
    expect(out, "b.mp4", "stored", None)
    expect(out, ARCHIVE_LABEL, "rejected", "corrupt")
    assert out.get("c.mp4") is None or out["c.mp4"].code == "corrupt"
    assert_clean(tmp_path, store)


def test_truncated_tar_keeps_the_dvd_parts_that_arrived(tmp_path: Path, indir: Path, store: MediaStore,
                                                       settings: Settings) -> None:
    """The parts of a DVD title wait aside until the tar ends (a tar is read once); a tar cut
    inside the third part still stores the first two, joined, and leaves no temp file."""
    first, second = b"\x00\x00\x01\xba" + os.urandom(9000), b"\x00\x00\x01\xba" + os.urandom(7000)
    full = write_tar(indir / "disc.tar", [("VTS_01_1.VOB", first), ("VTS_01_2.VOB", second),
                                          ("VTS_01_3.VOB", os.urandom(300_000))]).read_bytes()
    cut = indir / "cut.tar"
    cut.write_bytes(full[: len(full) - 150_000])
    out = run(cut, store, settings)
    title = expect(out, "VTS_01_1-2.VOB", "stored", None)
    assert title.stored is not None and title.stored.path.read_bytes() == first + second
    expect(out, "VTS_01_1.VOB", "skipped", "joined")
    expect(out, ARCHIVE_LABEL, "rejected", "corrupt")
    assert_clean(tmp_path, store)


def test_tar_cut_at_a_header_boundary_is_not_a_clean_end(
        tmp_path: Path, indir: Path, store: MediaStore, settings: Settings) -> None:
    full = write_tar(indir / "f.tar", [("a.mp4", b"a" * 512), ("b.mp4", b"b" * 512)]).read_bytes()
    with tarfile.open(indir / "f.tar") as tf:
        second = tf.getmember("b.mp4").offset
    cut = indir / "cut.tar"
    cut.write_bytes(full[:second])  # tarfile itself would report a normal end here
    out = run(cut, store, settings)
    expect(out, "a.mp4", "stored", None)
    expect(out, ARCHIVE_LABEL, "rejected", "corrupt")


@pytest.mark.parametrize("content", [b"", b"hello", os.urandom(4096)])
def test_garbage_is_rejected(tmp_path: Path, indir: Path, store: MediaStore, settings: Settings,
                             content: bytes) -> None:
    path = indir / "junk.zip"
    path.write_bytes(content)
    out = run(path, store, settings)
    assert list(out) == [ARCHIVE_LABEL]
    expect(out, ARCHIVE_LABEL, "rejected", "corrupt")


def test_missing_archive_file(tmp_path: Path, store: MediaStore, settings: Settings) -> None:
    out = run(tmp_path / "nope.zip", store, settings)
    expect(out, ARCHIVE_LABEL, "rejected", "corrupt")


# -- store failures propagate -----------------------------------------------------------------
def test_unwritable_store_propagates_store_error(tmp_path: Path, indir: Path,
                                                 settings: Settings) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("file where a directory should be")
    store = MediaStore(blocker / "media")
    archive = write_zip(indir / "ok.zip", [("a.mp4", GOOD_A)])
    with pytest.raises(StoreError):
        list(ingest_archive(archive, store, settings))


def test_already_stored_content_is_deduplicated(tmp_path: Path, indir: Path, store: MediaStore,
                                                settings: Settings) -> None:
    before = store.put_stream(io.BytesIO(GOOD_A), ".mp4", MiB)
    out = run(write_zip(indir / "d.zip", [("again.mp4", GOOD_A)]), store, settings)
    again = expect(out, "again.mp4", "stored", "duplicate")
    assert again.stored == type(before)(before.sha256, before.path, before.size, True)


def test_small_compressible_member_is_within_grace(tmp_path: Path, indir: Path, store: MediaStore,
                                                   settings: Settings) -> None:
    # 512 KiB of zeros compresses ~1000:1, but below RATIO_GRACE_BYTES that is harmless.
    out = run(write_zip(indir / "z.zip", [("quiet.mp4", bytes(512 * 1024))]), store, settings)
    expect(out, "quiet.mp4", "stored", None)


def test_names_without_a_name_are_skipped_alike(tmp_path: Path, indir: Path, store: MediaStore,
                                                 settings: Settings) -> None:
    out = run(write_zip(indir / "n.zip", [(".mp4", GOOD_A), ("   .mp4", GOOD_B), ("..mp4", GOOD_A),
                                          ("real.mp4", GOOD_B)]), store, settings)
    assert {n: o.status for n, o in out.items()} == {".mp4": "skipped", "   .mp4": "skipped", "..mp4": "skipped",
                                                    "real.mp4": "stored"}
    assert out["   .mp4"].code == "unnamed" and {out[".mp4"].code, out["..mp4"].code} == {"hidden"}
