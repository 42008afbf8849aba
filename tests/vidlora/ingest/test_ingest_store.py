"""MediaStore: content addressing, streaming, atomic placement, and failure clean-up."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from vidlora.config import PROJECT_ROOT
from vidlora.ingest import store as store_mod
from vidlora.ingest.store import CHUNK_BYTES, MediaStore, StoreError, TooLarge


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


class ChunkSpy(io.RawIOBase):
    """A stream of ``total`` pseudo-random bytes that records the read sizes asked for."""

    def __init__(self, total: int, fail_after: int | None = None) -> None:
        self.remaining = total
        self.sizes: list[int] = []
        self.fail_after = fail_after
        self.digest = hashlib.sha256()
        self.snapshots: list[list[Path]] = []
        self.watch: Path | None = None

    def read(self, n: int = -1) -> bytes:
        self.sizes.append(n)
        if self.watch is not None:
            self.snapshots.append(_files(self.watch))
        if self.fail_after is not None and len(self.sizes) > self.fail_after:
            raise ConnectionResetError("client went away")
        k = self.remaining if n < 0 else min(n, self.remaining)
        self.remaining -= k
        data = os.urandom(k)
        self.digest.update(data)
        return data


def test_put_stream_content_addressed_and_deduplicated(store: MediaStore) -> None:
    payload = b"not really a video" * 1000
    first = store.put_stream(io.BytesIO(payload), ".MP4", max_bytes=1 << 20)
    sha = hashlib.sha256(payload).hexdigest()
    assert first.sha256 == sha and first.size == len(payload) and not first.existed
    assert first.path == store.root / "videos" / sha[:2] / f"{sha}.mp4"
    assert first.path == store.video_path(sha, ".mp4")
    assert first.path.read_bytes() == payload
    again = store.put_stream(io.BytesIO(payload), ".mp4", max_bytes=1 << 20)
    assert again.existed and again.path == first.path
    assert _files(store.root / "videos") == [first.path]
    assert _files(store.root / "tmp") == []


def test_put_stream_reads_in_bounded_chunks_and_publishes_only_when_complete(
        store: MediaStore) -> None:
    spy = ChunkSpy(5 * CHUNK_BYTES + 123)
    spy.watch = store.root / "videos"
    result = store.put_stream(spy, ".mkv", max_bytes=10 * CHUNK_BYTES)  # type: ignore[arg-type]
    assert result.sha256 == spy.digest.hexdigest() and result.size == 5 * CHUNK_BYTES + 123
    assert all(0 < n <= CHUNK_BYTES for n in spy.sizes)  # never read(-1)
    # While bytes were still arriving, nothing was visible under videos/.
    assert all(snap == [] for snap in spy.snapshots)


def test_repairs_a_damaged_existing_file(store: MediaStore) -> None:
    payload = b"abc" * 100
    first = store.put_stream(io.BytesIO(payload), ".mp4", 1 << 20)
    first.path.write_bytes(b"abc")  # truncated by something outside the store
    again = store.put_stream(io.BytesIO(payload), ".mp4", 1 << 20)
    assert not again.existed and again.path.read_bytes() == payload


def test_too_large_leaves_nothing(store: MediaStore) -> None:
    with pytest.raises(TooLarge) as info:
        store.put_stream(io.BytesIO(b"x" * 2000), ".mp4", max_bytes=1999)
    assert isinstance(info.value, StoreError) and info.value.limit == 1999
    assert _files(store.root) == []
    # Exactly at the limit is fine.
    assert store.put_stream(io.BytesIO(b"x" * 1999), ".mp4", max_bytes=1999).size == 1999


def test_source_error_propagates_and_temp_is_removed(store: MediaStore) -> None:
    spy = ChunkSpy(10 * CHUNK_BYTES, fail_after=2)
    with pytest.raises(ConnectionResetError):
        store.put_stream(spy, ".mp4", max_bytes=100 * CHUNK_BYTES)  # type: ignore[arg-type]
    assert _files(store.root) == []


def test_unwritable_root_raises_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the media root's parent should be")
    bad = MediaStore(blocker / "media")
    with pytest.raises(StoreError, match="cannot create"):
        bad.put_stream(io.BytesIO(b"data"), ".mp4", 1 << 20)
    with pytest.raises(StoreError):
        bad.uploads_dir()


def test_disk_full_raises_store_error_and_cleans_up(
        store: MediaStore, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    calls = {"n": 0}

    def full_after_first(fd: int, data: object) -> int:
        calls["n"] += 1
        if calls["n"] > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)  # type: ignore[arg-type]

    monkeypatch.setattr(store_mod.os, "write", full_after_first)
    with pytest.raises(StoreError, match="media store is full"):
        store.put_stream(io.BytesIO(b"y" * (3 * CHUNK_BYTES)), ".mp4", 10 * CHUNK_BYTES)
    monkeypatch.undo()
    assert _files(store.root) == []


def test_file_size_limit_in_subprocess(tmp_path: Path) -> None:
    """A real kernel-enforced write failure (RLIMIT_FSIZE -> EFBIG), as root cannot chmod-block."""
    root = tmp_path / "media"
    script = textwrap.dedent(f"""
        import io, resource, sys
        from pathlib import Path
        from vidlora.ingest.store import MediaStore, StoreError
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024 * 1024, 1024 * 1024))
        store = MediaStore(Path({str(root)!r}))
        try:
            store.put_stream(io.BytesIO(b"z" * (3 * 1024 * 1024)), ".mp4", 1 << 30)
        except StoreError as exc:
            print("STORE_ERROR", exc)
            sys.exit(0)
        sys.exit(1)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=PROJECT_ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "STORE_ERROR" in proc.stdout and "file size limit" in proc.stdout
    assert _files(root) == []


def test_path_validation(store: MediaStore) -> None:
    with pytest.raises(ValueError):
        store.video_path("../" + "a" * 61, ".mp4")
    with pytest.raises(ValueError):
        store.video_path("A" * 64, ".mp4")
    for bad_suffix in ("/../x", ".mp4/..", "mp4", ". mp4"):
        with pytest.raises(ValueError):
            store.put_stream(io.BytesIO(b"x"), bad_suffix, 10)
    assert store.frames_dir(7, "abc123") == store.root / "frames" / "7" / "abc123"
    assert store.frames_dir(7, "abc123").is_dir()
    for bad_id, bad_hash in ((-1, "ok"), (1, "../x"), (1, ""), (True, "ok")):
        with pytest.raises(ValueError):
            store.frames_dir(bad_id, bad_hash)  # type: ignore[arg-type]
    assert store.uploads_dir() == store.root / "uploads" and store.uploads_dir().is_dir()


def test_put_file(store: MediaStore, tmp_path: Path) -> None:
    src = tmp_path / "Clip.MOV"
    src.write_bytes(b"m" * 5000)
    result = store.put_file(src, 10_000)
    assert result.path.suffix == ".mov" and result.path.read_bytes() == b"m" * 5000
    with pytest.raises(TooLarge):
        store.put_file(src, 4999)
    fifo = tmp_path / "pipe.mp4"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        store.put_file(fifo, 10_000)  # must not block waiting for a writer


def test_park_upload_keeps_only_a_safe_suffix(store: MediaStore) -> None:
    parked = store.park_upload(io.BytesIO(b"tarball"), "..\\..\\evil/Holiday.TAR.GZ", 1 << 20)
    assert parked.parent == store.uploads_dir() and parked.name.endswith(".tar.gz")
    assert parked.read_bytes() == b"tarball"
    odd = store.park_upload(io.BytesIO(b"x"), "weird.<script>", 1 << 20)
    assert odd.parent == store.uploads_dir() and "<" not in odd.name
    with pytest.raises(TooLarge):
        store.park_upload(io.BytesIO(b"x" * 11), "a.zip", 10)
    assert _files(store.root / "tmp") == []


def test_cleanup_temp_removes_only_stale_parts(store: MediaStore) -> None:
    tmp = store.root / "tmp"
    tmp.mkdir(parents=True)
    stale, fresh = tmp / "put-old.part", tmp / "put-new.part"
    stale.write_bytes(b"crashed writer")
    fresh.write_bytes(b"in flight")
    old = time.time() - 3 * 86400
    os.utime(stale, (old, old))
    assert store.cleanup_temp(older_than_s=86400) == 1
    assert not stale.exists() and fresh.exists()


def test_adopt_upload_stores_a_parked_file_without_writing_it_again(store: MediaStore, monkeypatch) -> None:
    body = b"parked video bytes" * 1000
    parked = store.park_upload(io.BytesIO(body), "Clip.MP4", 1 << 20)
    writes = []
    real_write = os.write
    monkeypatch.setattr(store_mod.os, "write", lambda fd, b: writes.append(len(b)) or real_write(fd, b))
    stored = store.adopt_upload(parked, 1 << 20)
    assert writes == []  # hashed in place, linked: no byte written
    assert stored.sha256 == hashlib.sha256(body).hexdigest() and stored.path.read_bytes() == body
    assert os.stat(parked).st_ino == os.stat(stored.path).st_ino and not stored.existed
    assert parked.exists()  # kept until ingest has recorded the video (a redelivery needs it)
    again = store.adopt_upload(parked, 1 << 20)
    assert again.existed and again.path == stored.path


def test_adopt_upload_copies_where_the_store_cannot_link(store: MediaStore, monkeypatch) -> None:
    parked = store.park_upload(io.BytesIO(b"other bytes"), "x.mkv", 1 << 20)

    def no_links(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(store_mod.os, "link", no_links)
    stored = store.adopt_upload(parked, 1 << 20)
    assert stored.path.read_bytes() == b"other bytes" and os.stat(parked).st_ino != os.stat(stored.path).st_ino
    with pytest.raises(TooLarge):
        store.adopt_upload(parked, 4)
