"""Member-by-member, streaming extraction of untrusted archives into the media store.

Every archive is treated as hostile. Nothing is ever extracted by name: member names are only
validated and used for display, content goes into the content-addressed store, so a name can
never choose where bytes land. Members are read as streams (``zipfile.open`` /
``tarfile.extractfile``), never with ``extractall``, and never held in memory whole.

Limits (all from ``Settings``), and what happens when one is hit:

* ``max_video_bytes``  -- per member. Refused up front when the header says so, and enforced on
  the bytes actually produced while streaming. Member ``rejected`` (``too_large``).
* ``archive_max_ratio`` -- per member, uncompressed bytes produced / compressed bytes actually
  read from the archive file so far for that member (headers are not trusted). Checked on
  every chunk once a member has produced more than ``RATIO_GRACE_BYTES`` (tiny members can
  legitimately compress far better). Member ``rejected`` (``ratio_exceeded``).
* ``archive_max_total_bytes`` -- uncompressed bytes the ingest has to read for the whole
  archive, nested archives included (zip: members actually read; tar: every member's data,
  because a tar stream can only be skipped by reading through it). The member that would
  cross it is ``rejected`` (``total_too_large``) and the archive stops with a final
  ``<archive>`` outcome; members stored before it are kept.
* ``archive_max_members`` -- entries of every kind (directories included), nested archives
  included. zip: the central directory is counted before anything is extracted, so an
  over-full zip yields only the ``<archive>`` rejection. tar: the first N entries are
  processed, then the archive stops with an ``<archive>`` rejection.
* ``archive_nested`` -- "reject": archive members are ``rejected`` (``nested_archive``);
  "extract": they are spooled to a temp file in the store and ingested one level deep
  (names become ``inner.zip/clip.mp4``); deeper archives are rejected.

A corrupt or truncated archive keeps whatever members were stored before the damage and ends
with an outcome named ``<archive>`` (or the nested archive's own name) with status
``rejected``. ``ingest_archive`` never raises for bad input; only ``StoreError`` (the media
store itself is full or unwritable) propagates, since retrying later can fix that.

Reasons are ``"<code>: <detail>"``; ``MemberOutcome.code`` gives the stable code.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import lzma
import stat
import tarfile
import zipfile
import zlib
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Iterator

from vidlora.config import Settings
from vidlora.ingest.dvd import Joined as JoinedParts
from vidlora.ingest.dvd import Title as DvdTitle
from vidlora.ingest.dvd import ifo_title_bytes
from vidlora.ingest.dvd import incomplete as incomplete_title
from vidlora.ingest.dvd import is_ifo as is_dvd_ifo
from vidlora.ingest.dvd import is_part as is_dvd_part
from vidlora.ingest.dvd import titles as dvd_titles
from vidlora.ingest.kinds import Kind, is_archive_name, kind_of, not_video_reason, numbered
from vidlora.ingest.store import MediaStore, StoredFile, StoreError, TooLarge
from vidlora.lifecycle import ItemStatus

ARCHIVE_LABEL = "<archive>"
# Below this many produced bytes the ratio is not checked: a few KB of padding or a tiny test
# clip can compress 1000:1 harmlessly, and read-ahead makes small-member ratios noisy.
RATIO_GRACE_BYTES = 1024 * 1024
# pax / GNU long-name headers are read into memory whole by tarfile; real ones are tiny.
TAR_META_MAX_BYTES = 1024 * 1024
MAX_NAME_CHARS = 1024
MEMBER_READ_BYTES = 64 * 1024

# Stable reason codes.
UNSAFE_PATH = "unsafe_path"
SYMLINK = "symlink"
HARDLINK = "hardlink"
SPECIAL_FILE = "special_file"
UNSUPPORTED = "unsupported"
TOO_LARGE = "too_large"
TOTAL_TOO_LARGE = "total_too_large"
RATIO_EXCEEDED = "ratio_exceeded"
TOO_MANY_MEMBERS = "too_many_members"
NESTED_ARCHIVE = "nested_archive"
ENCRYPTED = "encrypted"
CORRUPT = "corrupt"
HIDDEN = "hidden"
MACOS_METADATA = "macos_metadata"
DUPLICATE = "duplicate"
RENAMED = "renamed"

# Read-side failures that mean "this archive (or member) is damaged or hostile".
_READ_ERRORS = (
    zipfile.BadZipFile, zipfile.LargeZipFile, tarfile.TarError, zlib.error, lzma.LZMAError,
    EOFError, OSError, ValueError, RuntimeError, NotImplementedError, UnicodeError,
)


@dataclass(frozen=True)
class MemberOutcome:
    name: str
    status: ItemStatus
    reason: str | None
    stored: StoredFile | None

    @property
    def code(self) -> str | None:
        """The stable part of ``reason`` (e.g. ``"unsafe_path"``), or None."""
        return None if self.reason is None else self.reason.split(":", 1)[0]


# -- plumbing ---------------------------------------------------------------------------------
class _RatioExceeded(Exception):
    pass


class _Stop(Exception):
    """Abort the whole archive (limit reached); becomes the final ``<archive>`` outcome."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _CountingFile(io.RawIOBase):
    """Wraps the archive file and counts bytes actually read from disk (compressed bytes)."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self.count = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self.count += len(data)
        return data

    def readinto(self, b) -> int:  # type: ignore[no-untyped-def]
        n = self._f.readinto(b)
        self.count += n or 0
        return n

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()


class _MemberReader:
    """Stream over one member that enforces the compression ratio on real bytes."""

    def __init__(self, inner: BinaryIO, raw: _CountingFile, max_ratio: float) -> None:
        self._inner = inner
        self._raw = raw
        self._raw_start = raw.count
        self._max_ratio = max_ratio
        self.produced = 0

    def read(self, n: int = -1) -> bytes:
        # Small reads: zipfile pulls about as many compressed bytes as output requested, so
        # huge reads would make the "compressed bytes read" side of the ratio look inflated.
        data = self._inner.read(MEMBER_READ_BYTES if n < 0 else min(n, MEMBER_READ_BYTES))
        self.produced += len(data)
        if self.produced > RATIO_GRACE_BYTES:
            consumed = max(self._raw.count - self._raw_start, 1)
            if self.produced > self._max_ratio * consumed:
                raise _RatioExceeded(
                    f"{self.produced} bytes out of {consumed} compressed bytes read "
                    f"(limit {self._max_ratio:g}:1)")
        return data


@dataclass
class _Budget:
    members: int = 0
    total: int = 0


class _Ctx:
    def __init__(self, store: MediaStore, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.budget = _Budget()


def _printable(name: str) -> str:
    """Display form of an untrusted name: control characters and surrogates escaped."""
    if not name.isprintable():
        name = name.encode("unicode_escape", "backslashreplace").decode("ascii")
    return name[:MAX_NAME_CHARS]


def _safe_name(raw: str) -> str:
    """Normalise a member name to a relative POSIX path or raise ValueError (hostile)."""
    if not raw:
        raise ValueError("empty name")
    if len(raw) > MAX_NAME_CHARS:
        raise ValueError("name too long")
    if any(ord(c) < 32 or ord(c) == 127 for c in raw):
        raise ValueError("control character in name")
    # Windows tools write backslash separators; treat them as separators so "..\\x" is caught.
    name = raw.replace("\\", "/")
    if name.startswith("/"):
        raise ValueError("absolute path")
    if len(name) >= 2 and name[1] == ":" and name[0].isalpha():
        raise ValueError("drive letter")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise ValueError("path traversal")
    if not parts:
        raise ValueError("empty name")
    return "/".join(parts)


def _classify_name(name: str, ctx: _Ctx, depth: int) -> tuple[str, str] | None:
    """Name-based decision for a regular file: (status, reason) or None to ingest it."""
    parts = name.split("/")
    if parts[0] == "__MACOSX":
        return ItemStatus.SKIPPED, f"{MACOS_METADATA}: __MACOSX resource fork"
    if any(p.startswith(".") for p in parts):
        return ItemStatus.SKIPPED, f"{HIDDEN}: dotfile"
    kind = kind_of(name, ctx.settings.video_extensions)
    if kind == Kind.ARCHIVE:
        if ctx.settings.archive_nested != "extract":
            return ItemStatus.REJECTED, f"{NESTED_ARCHIVE}: nested archives are not accepted"
        if depth >= 1:
            return ItemStatus.REJECTED, f"{NESTED_ARCHIVE}: only one level of nesting is extracted"
        return None
    if kind == Kind.OTHER:
        return ItemStatus.SKIPPED, not_video_reason(name)
    return None


def _count_member(ctx: _Ctx) -> None:
    ctx.budget.members += 1
    if ctx.budget.members > ctx.settings.archive_max_members:
        raise _Stop(f"{TOO_MANY_MEMBERS}: more than {ctx.settings.archive_max_members} entries; "
                    "remaining entries not processed")


def _store_member(
    ctx: _Ctx, display: str, stream: BinaryIO, raw: _CountingFile, max_bytes: int,
    total_limited: bool, depth: int, count_produced: bool = True,
) -> Iterator[MemberOutcome]:
    """Read one member into the store (or descend into it); yields its outcome(s).

    ``max_bytes`` is the smaller of the per-member and the remaining total budget;
    ``total_limited`` says the total budget was the smaller one.
    """
    reader = _MemberReader(stream, raw, ctx.settings.archive_max_ratio)
    try:
        if is_archive_name(display):
            with ctx.store.temp_copy(reader, max_bytes) as tmp:  # type: ignore[arg-type]
                yield from _ingest(tmp, display, ctx, depth + 1)
            return
        stored = ctx.store.put_stream(reader, PurePosixPath(display).suffix, max_bytes)  # type: ignore[arg-type]
    except TooLarge:
        if total_limited:
            outcome = MemberOutcome(display, ItemStatus.REJECTED, f"{TOTAL_TOO_LARGE}: archive total over "
                                    f"{ctx.settings.archive_max_total_bytes} bytes", None)
            yield outcome
            raise _Stop(outcome.reason or "") from None
        yield MemberOutcome(display, ItemStatus.REJECTED, f"{TOO_LARGE}: member over "
                            f"{ctx.settings.max_video_bytes} bytes", None)
        return
    except _RatioExceeded as exc:
        yield MemberOutcome(display, ItemStatus.REJECTED, f"{RATIO_EXCEEDED}: {exc}", None)
        return
    except (StoreError, _Stop):
        raise
    except _READ_ERRORS as exc:
        yield MemberOutcome(display, ItemStatus.REJECTED, f"{CORRUPT}: {type(exc).__name__}: {exc}", None)
        return
    finally:
        if count_produced:
            ctx.budget.total += reader.produced
    if stored.existed:
        yield MemberOutcome(display, ItemStatus.STORED, f"{DUPLICATE}: content already stored", stored)
    else:
        yield MemberOutcome(display, ItemStatus.STORED, None, stored)


# -- zip --------------------------------------------------------------------------------------
def _zip_declared_entries(raw: _CountingFile) -> int | None:
    # Read the entry count from the end record before ZipFile parses (and allocates) the
    # whole central directory. Private helper, stable for 15+ years; skipped if it goes away.
    end_rec = getattr(zipfile, "_EndRecData", None)
    if end_rec is None:
        return None
    try:
        rec = end_rec(raw)
    except (OSError, ValueError, zipfile.BadZipFile):
        return None
    return None if rec is None else int(rec[4])


def _ingest_zip(raw: _CountingFile, prefix: str, ctx: _Ctx, depth: int) -> Iterator[MemberOutcome]:
    s = ctx.settings
    declared = _zip_declared_entries(raw)
    if declared is not None and ctx.budget.members + declared > s.archive_max_members:
        raise _Stop(f"{TOO_MANY_MEMBERS}: {declared} entries, limit {s.archive_max_members}; "
                    "nothing extracted")
    raw.seek(0)
    with zipfile.ZipFile(raw) as zf:
        infos = zf.infolist()
        if ctx.budget.members + len(infos) > s.archive_max_members:
            raise _Stop(f"{TOO_MANY_MEMBERS}: {len(infos)} entries, limit "
                        f"{s.archive_max_members}; nothing extracted")
        plain = {i.filename: i for i in infos if not i.is_dir() and not i.flag_bits & 0x1
                 and stat.S_IFMT(i.external_attr >> 16) in (0, stat.S_IFREG) and _is_safe(i.filename)}
        dvd = dvd_titles(list(plain))
        joined: set[str] = set()
        for info in infos:
            _count_member(ctx)
            try:
                name = _safe_name(info.filename)
            except ValueError as exc:
                yield MemberOutcome(prefix + _printable(info.filename), ItemStatus.REJECTED,
                                    f"{UNSAFE_PATH}: {exc}", None)
                continue
            display = prefix + name
            if info.is_dir():
                continue
            title = dvd.get(info.filename)
            if title is not None:  # one part of a DVD title: the parts are stored joined, once
                yield MemberOutcome(display, ItemStatus.SKIPPED, title.part_reason(info.filename), None)
                if title.name not in joined:
                    joined.add(title.name)
                    yield from _store_title(ctx, zf, plain, title, prefix, raw, depth)
                continue
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                yield MemberOutcome(display, ItemStatus.REJECTED, f"{SYMLINK}: symbolic link member", None)
                continue
            if mode and stat.S_IFMT(mode) and not stat.S_ISREG(mode):
                yield MemberOutcome(display, ItemStatus.REJECTED,
                                    f"{SPECIAL_FILE}: not a regular file (mode {mode:o})", None)
                continue
            decision = _classify_name(name, ctx, depth)
            if decision is not None:
                yield MemberOutcome(display, decision[0], decision[1], None)
                continue
            if info.flag_bits & 0x1:
                yield MemberOutcome(display, ItemStatus.REJECTED, f"{ENCRYPTED}: encrypted member", None)
                continue
            if info.file_size > s.max_video_bytes:
                yield MemberOutcome(display, ItemStatus.REJECTED, f"{TOO_LARGE}: header size "
                                    f"{info.file_size} over {s.max_video_bytes} bytes", None)
                continue
            if (info.file_size > RATIO_GRACE_BYTES
                    and info.file_size > s.archive_max_ratio * max(info.compress_size, 1)):
                yield MemberOutcome(display, ItemStatus.REJECTED, f"{RATIO_EXCEEDED}: header claims "
                                    f"{info.file_size}/{info.compress_size} bytes "
                                    f"(limit {s.archive_max_ratio:g}:1)", None)
                continue
            remaining = s.archive_max_total_bytes - ctx.budget.total
            if info.file_size > remaining:
                outcome = MemberOutcome(display, ItemStatus.REJECTED, f"{TOTAL_TOO_LARGE}: archive total "
                                        f"over {s.archive_max_total_bytes} bytes", None)
                yield outcome
                raise _Stop(outcome.reason or "")
            try:
                member = zf.open(info)
            except (StoreError, _Stop):
                raise
            except _READ_ERRORS as exc:
                yield MemberOutcome(display, ItemStatus.REJECTED,
                                    f"{CORRUPT}: {type(exc).__name__}: {exc}", None)
                continue
            with member:
                yield from _store_member(ctx, display, member, raw,  # type: ignore[arg-type]
                                         min(s.max_video_bytes, remaining),
                                         remaining < s.max_video_bytes, depth)


def _is_safe(name: str) -> bool:
    try:
        return _safe_name(name) == name
    except ValueError:
        return False


def _store_title(ctx: _Ctx, zf: zipfile.ZipFile, infos: dict[str, zipfile.ZipInfo], title: DvdTitle,
                 prefix: str, raw: _CountingFile, depth: int) -> Iterator[MemberOutcome]:
    """A DVD title's parts, read one after another into one stored video. Each part may be as
    large as one video may be (a DVD title is up to 9 GB in 1 GB parts); the archive's total
    budget bounds the whole."""
    s = ctx.settings
    display = prefix + title.name
    parts = [infos[p] for p in title.parts]
    declared = None
    if title.ifo in infos and infos[title.ifo].file_size <= TAR_META_MAX_BYTES:
        try:
            declared = ifo_title_bytes(zf.read(infos[title.ifo])[:0x100])
        except _READ_ERRORS:
            declared = None
    remaining = s.archive_max_total_bytes - ctx.budget.total
    note = incomplete_title(title, [p.file_size for p in parts], declared)
    stream = JoinedParts([lambda p=p: zf.open(p) for p in parts])
    try:
        for outcome in _store_member(ctx, display, stream, raw,  # type: ignore[arg-type]
                                     min(len(parts) * s.max_video_bytes, remaining),
                                     remaining < len(parts) * s.max_video_bytes, depth):
            if note and outcome.status == ItemStatus.STORED:
                outcome = replace(outcome, reason=note if outcome.reason is None else f"{outcome.reason}; {note}")
            yield outcome
    finally:
        stream.close()


# -- tar --------------------------------------------------------------------------------------
class _BoundedTarInfo(tarfile.TarInfo):
    """Refuses oversized pax / GNU long-name headers, which tarfile would read into memory."""

    def _proc_member(self, tarfile_obj):  # type: ignore[no-untyped-def]
        if (self.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE,
                          tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)
                and self.size > TAR_META_MAX_BYTES):
            raise tarfile.HeaderError(f"metadata header of {self.size} bytes")
        return super()._proc_member(tarfile_obj)


def _tar_decompressor(raw: _CountingFile, kind: str) -> BinaryIO:
    # The stdlib file wrappers decompress with a bounded output size per call, unlike
    # tarfile's own "r|gz" stream which inflates whole input blocks at once (bz2 bombs).
    if kind == "gz":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if kind == "bz2":
        return bz2.BZ2File(raw, mode="rb")  # type: ignore[return-value]
    if kind == "xz":
        return lzma.LZMAFile(raw, mode="rb")  # type: ignore[return-value]
    return raw  # type: ignore[return-value]


class _TailReader:
    """Counts the (decompressed) tar bytes handed to tarfile and keeps the last few blocks.

    tarfile treats a short or garbled header after the first member as a normal end of
    archive; with this we can tell a real end marker (a zero block) from truncation/damage.
    """

    _KEEP = 64 * 1024

    def __init__(self, inner: BinaryIO) -> None:
        self._inner = inner
        self.delivered = 0
        self._tail = bytearray()

    def read(self, n: int = -1) -> bytes:
        data = self._inner.read(n)
        self.delivered += len(data)
        self._tail += data
        if len(self._tail) > 2 * self._KEEP:
            del self._tail[:-self._KEEP]
        return data

    def block_at(self, offset: int) -> bytes | None:
        start = offset - (self.delivered - len(self._tail))
        if start < 0 or start + tarfile.BLOCKSIZE > len(self._tail):
            return None
        return bytes(self._tail[start:start + tarfile.BLOCKSIZE])


def _check_tar_end(tf: tarfile.TarFile, tail: _TailReader) -> None:
    if tail.delivered < tf.offset + tarfile.BLOCKSIZE:
        raise tarfile.ReadError(f"truncated at byte {tail.delivered} (no end-of-archive marker)")
    block = tail.block_at(tf.offset)
    if block is not None and block.count(0) != len(block):
        raise tarfile.ReadError(f"invalid header at byte {tf.offset}")


class _StagedParts:
    """DVD title parts met in a tar, kept in the store's temp area until the archive ends.

    A tar is read once, front to back, and tools write a folder in directory order (not by
    name), so a title's parts may come in any order with other members between them. Each
    part is copied aside as it passes (counted against the archive's budget once, as any tar
    member); at the end the parts are joined in part order, as a zip's are."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self._stack = stack
        self.parts: dict[str, tuple[str, Path, int]] = {}  # name -> (display, temp copy, size)
        self.declared: dict[str, int | None] = {}  # an IFO's name -> the title bytes it declares

    def stage(self, ctx: _Ctx, display: str, name: str, stream: BinaryIO,
              raw: _CountingFile) -> MemberOutcome | None:
        """Copy one part aside; a rejection if it cannot be (its bytes are then lost to the tar)."""
        reader = _MemberReader(stream, raw, ctx.settings.archive_max_ratio)
        try:
            tmp = self._stack.enter_context(ctx.store.temp_copy(reader, ctx.settings.max_video_bytes))  # type: ignore[arg-type]
        except TooLarge:
            return MemberOutcome(display, ItemStatus.REJECTED, f"{TOO_LARGE}: member over "
                                 f"{ctx.settings.max_video_bytes} bytes", None)
        except _RatioExceeded as exc:
            return MemberOutcome(display, ItemStatus.REJECTED, f"{RATIO_EXCEEDED}: {exc}", None)
        self.parts[name] = (display, tmp, reader.produced)
        return None

    def store(self, ctx: _Ctx, prefix: str, depth: int) -> Iterator[MemberOutcome]:
        """Every staged part: joined into its title, or alone where its set has no other part."""
        dvd = dvd_titles(list(self.parts) + list(self.declared))
        done: set[str] = set()
        for name, (display, tmp, _size) in list(self.parts.items()):
            title = dvd.get(name)
            if title is None:
                with tmp.open("rb") as fh:
                    yield from _store_member(ctx, display, fh, _CountingFile(fh),  # type: ignore[arg-type]
                                             ctx.settings.max_video_bytes, False, depth, count_produced=False)
                continue
            yield MemberOutcome(display, ItemStatus.SKIPPED, title.part_reason(name), None)
            if title.name in done:
                continue
            done.add(title.name)
            paths = [self.parts[p][1] for p in title.parts]
            note = incomplete_title(title, [self.parts[p][2] for p in title.parts],
                                    self.declared.get(title.ifo) if title.ifo else None)
            stream = JoinedParts([lambda p=p: p.open("rb") for p in paths])  # type: ignore[misc]
            joined = _CountingFile(stream)  # type: ignore[arg-type]  # read from disk: ratio 1
            try:
                for outcome in _store_member(ctx, prefix + title.name, joined, joined,  # type: ignore[arg-type]
                                             len(paths) * ctx.settings.max_video_bytes, False, depth,
                                             count_produced=False):
                    if note and outcome.status == ItemStatus.STORED:
                        outcome = replace(outcome, reason=note if outcome.reason is None
                                          else f"{outcome.reason}; {note}")
                    yield outcome
            finally:
                stream.close()


def _ingest_tar(raw: _CountingFile, kind: str, prefix: str, ctx: _Ctx,
                depth: int) -> Iterator[MemberOutcome]:
    with contextlib.ExitStack() as stack:
        staged = _StagedParts(stack)
        try:
            yield from _ingest_tar_members(raw, kind, prefix, ctx, depth, staged)
        except StoreError:
            raise
        except (_Stop, *_READ_ERRORS):
            # The archive ends here (a limit, or damage): the parts that arrived whole are kept,
            # as every member stored before the damage is.
            yield from staged.store(ctx, prefix, depth)
            raise
        yield from staged.store(ctx, prefix, depth)


def _ingest_tar_members(raw: _CountingFile, kind: str, prefix: str, ctx: _Ctx, depth: int,
                        staged: _StagedParts) -> Iterator[MemberOutcome]:
    s = ctx.settings
    tail = _TailReader(_tar_decompressor(raw, kind))
    # "r|": strictly sequential, never seeks, so a skipped member is read through (counted).
    with tarfile.open(fileobj=tail, mode="r|", tarinfo=_BoundedTarInfo) as tf:  # type: ignore[call-overload]
        while True:
            member = tf.next()
            if member is None:
                _check_tar_end(tf, tail)
                return
            _count_member(ctx)
            try:
                name = _safe_name(member.name)
            except ValueError as exc:
                name = None
                bad = (prefix + _printable(member.name), f"{UNSAFE_PATH}: {exc}")
            # Every data byte must be read to get past this member, stored or not (tarfile
            # skips data for regular files and for types it does not know).
            data_size = (member.size if member.isreg() or member.type not in tarfile.SUPPORTED_TYPES
                         else 0)
            if ctx.budget.total + data_size > s.archive_max_total_bytes:
                reason = (f"{TOTAL_TOO_LARGE}: archive total over {s.archive_max_total_bytes} "
                          "bytes")
                yield MemberOutcome(prefix + (name or _printable(member.name)), ItemStatus.REJECTED,
                                    reason, None)
                raise _Stop(reason)
            if name is None:
                yield MemberOutcome(bad[0], ItemStatus.REJECTED, bad[1], None)
                ctx.budget.total += data_size
                continue
            display = prefix + name
            if member.isdir():
                continue
            rejection = None
            if member.issym():
                rejection = f"{SYMLINK}: symbolic link member"
            elif member.islnk():
                rejection = f"{HARDLINK}: hard link member"
            elif member.ischr() or member.isblk():
                rejection = f"{SPECIAL_FILE}: device file"
            elif member.isfifo():
                rejection = f"{SPECIAL_FILE}: fifo"
            elif not member.isreg():
                rejection = f"{UNSUPPORTED}: tar member type {member.type!r}"
            if rejection is not None:
                yield MemberOutcome(display, ItemStatus.REJECTED, rejection, None)
                continue
            if is_dvd_ifo(name) and member.size <= TAR_META_MAX_BYTES:
                head = tf.extractfile(member)
                staged.declared[name] = ifo_title_bytes(head.read(0x100)) if head is not None else None
            decision = _classify_name(name, ctx, depth)
            if decision is None and member.size > s.max_video_bytes:
                decision = (ItemStatus.REJECTED, f"{TOO_LARGE}: header size {member.size} over "
                            f"{s.max_video_bytes} bytes")
            if decision is not None:
                yield MemberOutcome(display, decision[0], decision[1], None)
                ctx.budget.total += data_size
                continue
            fileobj = tf.extractfile(member)
            if fileobj is None:  # cannot happen for isreg(); be defensive
                yield MemberOutcome(display, ItemStatus.REJECTED, f"{UNSUPPORTED}: no data", None)
                ctx.budget.total += data_size
                continue
            # Counted up front (above the check): tarfile reads the whole member through
            # whatever happens, so _store_member must not count the produced bytes again.
            ctx.budget.total += data_size
            if is_dvd_part(name):
                with fileobj:
                    refused = staged.stage(ctx, display, name, fileobj, raw)  # type: ignore[arg-type]
                if refused is not None:
                    yield refused
                continue
            with fileobj:
                yield from _store_member(ctx, display, fileobj, raw,  # type: ignore[arg-type]
                                         s.max_video_bytes, False, depth, count_produced=False)
            # A member that failed mid-read leaves the tar stream unusable: the next header
            # read raises, and the archive ends as corrupt, keeping what was stored.


# -- entry point ------------------------------------------------------------------------------
def _sniff(raw: _CountingFile) -> str | None:
    raw.seek(0)
    head = raw.read(512 + 8)
    raw.seek(0)
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08"):
        return "zip"
    if head[:2] == b"\x1f\x8b":
        return "gz"
    if head[:3] == b"BZh":
        return "bz2"
    if head[:6] == b"\xfd7zXZ\x00":
        return "xz"
    if len(head) >= 512:
        return "tar"  # ustar magic or an old v7 header; tarfile validates the checksum
    return None


def _ingest(path: Path, label: str, ctx: _Ctx, depth: int) -> Iterator[MemberOutcome]:
    """Ingest one archive file; a damaged archive ends with a rejection named ``label``."""
    prefix = "" if depth == 0 else label + "/"
    try:
        f = open(path, "rb")
    except OSError as exc:
        yield MemberOutcome(label, ItemStatus.REJECTED, f"{CORRUPT}: cannot open: {exc}", None)
        return
    with f:
        raw = _CountingFile(f)
        try:
            kind = _sniff(raw)
            if kind is None:
                yield MemberOutcome(label, ItemStatus.REJECTED, f"{CORRUPT}: not a recognised archive", None)
                return
            if kind == "zip":
                yield from _ingest_zip(raw, prefix, ctx, depth)
            else:
                yield from _ingest_tar(raw, kind, prefix, ctx, depth)
        except (StoreError, _Stop):
            raise
        except _READ_ERRORS as exc:
            yield MemberOutcome(label, ItemStatus.REJECTED, f"{CORRUPT}: {type(exc).__name__}: {exc}", None)


def ingest_archive(path: Path, store: MediaStore, settings: Settings) -> Iterator[MemberOutcome]:
    """Yield one outcome per archive entry (directories excepted), in archive order.

    See the module docstring for the limits. Raises only ``StoreError`` (store unusable).
    """
    ctx = _Ctx(store, settings)
    yield from unique_names(_all_outcomes(Path(path), ctx))


def _all_outcomes(path: Path, ctx: _Ctx) -> Iterator[MemberOutcome]:
    try:
        yield from _ingest(path, ARCHIVE_LABEL, ctx, 0)
    except _Stop as stop:
        yield MemberOutcome(ARCHIVE_LABEL, ItemStatus.REJECTED, stop.reason, None)


def unique_names(outcomes: Iterator[MemberOutcome]) -> Iterator[MemberOutcome]:
    """A zip may hold several members of one name (and a tar overwrites on extraction): each is
    kept under a name of its own, numbered in archive order (so a re-read names them alike),
    and the outcome says it was renamed."""
    seen: set[str] = set()
    for outcome in outcomes:
        name, n = outcome.name, 1
        while name in seen:
            n += 1
            name = numbered(outcome.name, n)
        seen.add(name)
        if name != outcome.name:
            note = f"{RENAMED}: another member of the archive is also named {_printable(outcome.name)}"
            outcome = replace(outcome, name=name, reason=note if outcome.reason is None else f"{outcome.reason}; {note}")
        yield outcome
