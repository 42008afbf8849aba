"""Content-addressed media store on the local filesystem.

Layout under ``root``::

    videos/ab/<sha256><ext>            one file per distinct content (ext lower-case, e.g. .mp4)
    frames/<video_id>/<policy_hash>/   frame JPEGs written by media/frames.py
    uploads/                           raw uploads and archives parked before ingest
    resumable/                         resumable (tus) uploads still arriving, one file each
    tmp/                               in-flight writes (same filesystem, so rename is atomic)

A video is streamed into ``tmp/`` while its sha256 is computed, fsync'ed, then renamed onto
its final name and the directory fsync'ed. A crash or a full disk therefore never leaves a
half-written file under ``videos/``: either the complete file is there under its hash name, or
only an orphan ``tmp/*.part`` is (removed on the error path, and by ``cleanup_temp`` after a
hard crash). Nothing is ever read into memory whole; reads go in ``CHUNK_BYTES`` pieces.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

CHUNK_BYTES = 1024 * 1024

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
# Suffixes come from untrusted file names; they become part of a path, so allow only a dot and
# a short alphanumeric tail (".mp4", ".mkv", ".3gp"); "" is allowed for suffix-less content.
_SUFFIX_RE = re.compile(r"^(\.[a-z0-9]{1,16})?$")
_POLICY_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_TMP_PREFIX = "put-"
_TMP_SUFFIX = ".part"


class StoreError(Exception):
    """The media store could not take the file (disk full, unwritable, bad layout)."""


class TooLarge(StoreError):
    """The stream produced more than ``max_bytes``; nothing was stored."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"content exceeds the limit of {limit} bytes")
        self.limit = limit


@dataclass(frozen=True)
class StoredFile:
    sha256: str
    path: Path
    size: int
    existed: bool  # True: identical content was already stored; this call wrote nothing new


def _check_suffix(suffix: str) -> str:
    suffix = suffix.lower()
    if not _SUFFIX_RE.match(suffix):
        raise ValueError(f"invalid file suffix {suffix!r}")
    return suffix


def _describe(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "media store is full"
    if exc.errno == errno.EFBIG:
        return "file size limit reached while writing to the media store"
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return "media store is not writable"
    return "media store write failed"


def _upload_suffix(filename: str) -> str:
    """The lower-cased archive/video suffix of an untrusted name, never its path."""
    name = filename.replace("\\", "/").rsplit("/", 1)[-1].lower()
    for candidate in (".tar.gz", ".tar.bz2", ".tar.xz"):
        if name.endswith(candidate):
            return candidate
    ext = os.path.splitext(name)[1]
    return ext if _SUFFIX_RE.match(ext) else ""


def _fsync_dir(path: Path) -> None:
    # Makes the rename itself durable; without it a crash can forget the new directory entry.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class MediaStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._videos = self.root / "videos"
        self._frames = self.root / "frames"
        self._uploads = self.root / "uploads"
        self._tmp = self.root / "tmp"

    # -- paths ---------------------------------------------------------------------------
    def video_path(self, sha256: str, suffix: str) -> Path:
        if not _SHA256_RE.match(sha256):
            raise ValueError(f"not a lower-case hex sha256: {sha256!r}")
        return self._videos / sha256[:2] / f"{sha256}{_check_suffix(suffix)}"

    def frames_dir(self, video_id: int, policy_key_hash: str) -> Path:
        """Directory for one video's frames under one sampling policy (created if missing)."""
        if isinstance(video_id, bool) or not isinstance(video_id, int) or video_id < 0:
            raise ValueError(f"invalid video id {video_id!r}")
        if not _POLICY_RE.match(policy_key_hash):
            raise ValueError(f"invalid policy key hash {policy_key_hash!r}")
        return self._ensure_dir(self._frames / str(video_id) / policy_key_hash)

    def uploads_dir(self) -> Path:
        """Directory for raw uploads/archives waiting for ingest (created if missing)."""
        return self._ensure_dir(self._uploads)

    def _ensure_dir(self, path: Path) -> Path:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"{_describe(exc)}: cannot create {path}: {exc}") from exc
        if not path.is_dir():
            raise StoreError(f"media store path {path} exists but is not a directory")
        return path

    # -- writing -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _spool(self, stream: BinaryIO, max_bytes: int) -> Iterator[tuple[Path, str, int]]:
        """Copy ``stream`` to a fsync'ed temp file; yield (path, sha256, size).

        The temp file is removed on exit unless the caller has renamed it away. Errors while
        *reading* ``stream`` propagate unchanged (the caller knows what its source is); errors
        while *writing* become ``StoreError``.
        """
        tmp_dir = self._ensure_dir(self._tmp)
        try:
            fd, name = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix=_TMP_SUFFIX, dir=tmp_dir)
        except OSError as exc:
            raise StoreError(f"{_describe(exc)}: cannot create a temp file in {tmp_dir}: {exc}") from exc
        tmp = Path(name)
        try:
            digest = hashlib.sha256()
            size = 0
            try:
                while True:
                    chunk = stream.read(CHUNK_BYTES)
                    if not chunk:
                        break
                    size += len(chunk)
                    if size > max_bytes:
                        raise TooLarge(max_bytes)
                    digest.update(chunk)
                    view = memoryview(chunk)
                    while view:
                        try:
                            written = os.write(fd, view)
                        except OSError as exc:
                            raise StoreError(f"{_describe(exc)}: writing {tmp}: {exc}") from exc
                        view = view[written:]
                try:
                    os.fsync(fd)
                except OSError as exc:
                    raise StoreError(f"{_describe(exc)}: fsync of {tmp}: {exc}") from exc
            finally:
                os.close(fd)
            yield tmp, digest.hexdigest(), size
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def put_stream(self, stream: BinaryIO, suffix: str, max_bytes: int) -> StoredFile:
        """Stream ``stream`` into the store under its sha256; return where it lives.

        Raises ``TooLarge`` if more than ``max_bytes`` arrive and ``StoreError`` if the store
        cannot be written; in both cases no file is left behind. Exceptions raised by
        ``stream.read`` propagate unchanged (also with nothing left behind).
        """
        suffix = _check_suffix(suffix)
        with self._spool(stream, max_bytes) as (tmp, sha, size):
            final = self.video_path(sha, suffix)
            try:
                st = final.stat()
            except FileNotFoundError:
                st = None
            except OSError as exc:
                raise StoreError(f"{_describe(exc)}: cannot stat {final}: {exc}") from exc
            if st is not None and stat.S_ISREG(st.st_mode) and st.st_size == size:
                # Same hash and size: identical content is already stored (the temp is dropped).
                return StoredFile(sha256=sha, path=final, size=size, existed=True)
            # Missing, or (after outside damage) the wrong size: (re)place it atomically.
            # Two writers racing on the same content both rename identical bytes: harmless.
            parent = self._ensure_dir(final.parent)
            try:
                os.replace(tmp, final)
                _fsync_dir(parent)
            except OSError as exc:
                raise StoreError(f"{_describe(exc)}: cannot move into place {final}: {exc}") from exc
            return StoredFile(sha256=sha, path=final, size=size, existed=False)

    def put_file(self, path: Path, max_bytes: int) -> StoredFile:
        """Store a regular file from the local filesystem (the suffix is taken from its name)."""
        path = Path(path)
        suffix = _check_suffix(path.suffix)
        # O_NONBLOCK: opening a FIFO must not hang the worker; it is refused just below.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{path} is not a regular file")
            if st.st_size > max_bytes:
                raise TooLarge(max_bytes)
            return self.put_stream(f, suffix, max_bytes)

    def adopt_upload(self, path: Path, max_bytes: int) -> StoredFile:
        """Store a parked upload (a file in this store's ``uploads/``) without writing its bytes
        again: it is hashed in place and hard-linked under its sha256. The parked file stays
        until the caller removes it, so a redelivered ingest still finds it. Where the store
        cannot link (another filesystem, no link support) it is copied as ``put_file`` does."""
        path = Path(path)
        suffix = _check_suffix(path.suffix)
        with path.open("rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{path} is not a regular file")
            if st.st_size > max_bytes:
                raise TooLarge(max_bytes)
            digest = hashlib.sha256()
            for chunk in iter(lambda: f.read(CHUNK_BYTES), b""):
                digest.update(chunk)
        sha = digest.hexdigest()
        final = self.video_path(sha, suffix)
        try:
            existing = final.stat()
        except FileNotFoundError:
            existing = None
        except OSError as exc:
            raise StoreError(f"{_describe(exc)}: cannot stat {final}: {exc}") from exc
        if existing is not None and stat.S_ISREG(existing.st_mode) and existing.st_size == st.st_size:
            return StoredFile(sha256=sha, path=final, size=st.st_size, existed=True)
        parent = self._ensure_dir(final.parent)
        try:
            final.unlink(missing_ok=True)  # damaged (wrong size): replaced
            os.link(path, final)
            _fsync_dir(parent)
        except FileExistsError:  # a concurrent ingest of the same content linked it first
            pass
        except OSError:
            return self.put_file(path, max_bytes)
        return StoredFile(sha256=sha, path=final, size=st.st_size, existed=False)

    def park_upload(self, stream: BinaryIO, filename: str, max_bytes: int) -> Path:
        """Stream a raw upload (typically an archive) into ``uploads/`` under a fresh name.

        Only the lower-cased archive/video suffix of ``filename`` is kept, never its path. The
        file appears under ``uploads/`` only once complete (temp file + fsync + rename).
        """
        suffix = _upload_suffix(filename)
        uploads = self.uploads_dir()
        with self._spool(stream, max_bytes) as (tmp, sha, _size):
            final = uploads / f"{int(time.time())}-{sha[:16]}-{os.urandom(4).hex()}{suffix}"
            try:
                os.replace(tmp, final)
                _fsync_dir(uploads)
            except OSError as exc:
                raise StoreError(f"{_describe(exc)}: cannot move into place {final}: {exc}") from exc
            return final

    def resumable_dir(self) -> Path:
        """Directory for resumable uploads still arriving (created if missing)."""
        return self._ensure_dir(self.root / "resumable")

    def park_received(self, path: Path, filename: str) -> Path:
        """Move a complete resumable upload (a file in ``resumable/``) into ``uploads/``, as
        ``park_upload`` leaves a streamed one: renamed, never copied (same filesystem)."""
        uploads = self.uploads_dir()
        final = uploads / f"{int(time.time())}-{os.urandom(8).hex()}{_upload_suffix(filename)}"
        try:
            os.replace(path, final)
            _fsync_dir(uploads)
        except OSError as exc:
            raise StoreError(f"{_describe(exc)}: cannot move into place {final}: {exc}") from exc
        return final

    def cleanup_temp(self, older_than_s: float = 24 * 3600.0) -> int:
        """Remove temp files a crashed writer left behind; returns how many were removed.

        Only files older than ``older_than_s`` go, so writes in flight are not disturbed.
        """
        if not self._tmp.is_dir():
            return 0
        cutoff = time.time() - older_than_s
        removed = 0
        for entry in os.scandir(self._tmp):
            if entry.name.startswith(_TMP_PREFIX) and entry.name.endswith(_TMP_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                        os.unlink(entry.path)
                        removed += 1
        return removed

    @contextlib.contextmanager
    def temp_copy(self, stream: BinaryIO, max_bytes: int) -> Iterator[Path]:
        """Spool ``stream`` to a temp file inside the store for the ``with`` block only.

        Used to descend into a nested archive without holding it in memory.
        """
        with self._spool(stream, max_bytes) as (tmp, _sha, _size):
            yield tmp
