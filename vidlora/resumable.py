"""Resumable uploads (the tus 1.0 protocol's state, independent of HTTP).

A file is created with its name and length, then arrives in chunks, each appended at the
offset the server holds; a dropped connection keeps every byte that reached the disk, and the
client resumes from the offset a HEAD reports. Bytes go straight from the request stream to
one file in the media store's ``resumable/`` folder in ``CHUNK_BYTES`` blocks: nothing is held
in memory whole. The row (``ResumableUpload``) is the truth: a file longer than its offset
(a process killed mid-chunk) is cut back to it before the next chunk is written.

Once complete, a batch takes the file (``tasks.submit.submit_received``) and it is ingested
like any upload. An upload nobody touched for ``resumable_expire_after_s`` is deleted, bytes
and row, by the reconciler (``expire_stalled``).
"""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from vidlora.config import Settings
from vidlora.db import session_scope
from vidlora.ingest.kinds import Kind, accepted_suffixes, kind_of, not_video_reason
from vidlora.ingest.sniff import SNIFF_BYTES, refusal
from vidlora.ingest.store import CHUNK_BYTES, MediaStore
from vidlora.lifecycle import ResumableStatus
from vidlora.locks import try_lock
from vidlora.models import ResumableUpload, utcnow

CHECKSUMS: dict[str, Callable[[], "hashlib._Hash"]] = {"sha1": hashlib.sha1, "sha256": hashlib.sha256}
# Without a checksum, the offset is made durable this often inside one long chunk, so a web
# process killed mid-chunk loses at most this much.
COMMIT_EVERY = 64 * 1024**2
MAX_NAME = 255


class ResumableError(ValueError):
    """A request the client can act on; the web layer answers it with its status."""


class Refused(ResumableError):
    pass


class NotFound(ResumableError):
    pass


class TooLarge(ResumableError):
    pass


class WrongType(ResumableError):
    pass


class NoSpace(ResumableError):
    pass


class OffsetMismatch(ResumableError):
    pass


class Busy(ResumableError):
    pass


class ChecksumMismatch(ResumableError):
    pass


@dataclass(frozen=True)
class Progress:
    key: str
    offset: int
    length: int
    status: str
    interrupted: bool = False  # the client's body ended early; what arrived is kept


def human(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def check_filename(name: str, settings: Settings) -> str:
    """The file's own name, or why it is refused: a name, never a path."""
    if not name or not name.strip():
        raise Refused("Upload-Metadata needs the file's name (filename).")
    if "/" in name or "\\" in name or "\x00" in name or name.strip() in (".", ".."):
        raise Refused(f"The file name {name[:100]!r} is a path; send only the file's own name.")
    if len(name) > MAX_NAME:
        raise Refused(f"The file name is longer than {MAX_NAME} characters.")
    if kind_of(name, settings.video_extensions) == Kind.OTHER:
        kinds = ", ".join(accepted_suffixes(settings.video_extensions))
        raise WrongType(f"{name}: {not_video_reason(name)}. Accepted file types: {kinds}.")
    return name


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def _check_room(settings: Settings, folder: Path, needed: int) -> None:
    free = free_bytes(folder)
    if free - needed < settings.resumable_min_free_bytes:
        raise NoSpace(
            f"The server's media store has {human(free)} free; {human(needed)} more would leave less than "
            f"the {human(settings.resumable_min_free_bytes)} it keeps. Try again once space is freed "
            "(the upload keeps what it has).")


def create(session: Session, settings: Settings, user_id: int, filename: str, length: int) -> ResumableUpload:
    """A new upload of ``length`` bytes: name and size checked before any byte is taken."""
    assert settings.media_root is not None
    name = check_filename(filename, settings)
    if length <= 0:
        raise Refused(f"{name}: Upload-Length must be the file's size in bytes, more than 0.")
    if length > settings.resumable_max_bytes:
        raise TooLarge(f"{name} is {human(length)}, more than this server's limit of "
                       f"{human(settings.resumable_max_bytes)} per file.")
    folder = MediaStore(settings.media_root).resumable_dir()
    _check_room(settings, folder, length)
    key = secrets.token_urlsafe(24)
    path = folder / f"{key}.part"
    path.touch(mode=0o600)
    row = ResumableUpload(key=key, user_id=user_id, filename=name, length=length, offset=0,
                          path=path.relative_to(settings.media_root).as_posix())
    session.add(row)
    session.flush()
    return row


def owned(session: Session, key: str, user_id: int, lock: bool = False) -> ResumableUpload:
    query = select(ResumableUpload).where(ResumableUpload.key == key, ResumableUpload.user_id == user_id)
    row = session.scalar(query.with_for_update() if lock else query)
    if row is None:  # someone else's upload looks like no upload at all
        raise NotFound("No such upload: it was finished and used, deleted, or expired. Start it again.")
    return row


def parse_checksum(header: str | None) -> tuple[str, bytes] | None:
    """``Upload-Checksum: sha1 <base64>`` -> ("sha1", digest)."""
    if not header:
        return None
    algorithm, _, value = header.strip().partition(" ")
    if algorithm not in CHECKSUMS:
        raise Refused(f"Upload-Checksum algorithm {algorithm[:20]!r} is not supported; use one of "
                      f"{', '.join(CHECKSUMS)}.")
    try:
        digest = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise Refused("Upload-Checksum's value is not base64.") from None
    if len(digest) != CHECKSUMS[algorithm]().digest_size:
        raise Refused(f"Upload-Checksum's {algorithm} value has the wrong length.")
    return algorithm, digest


def receive(settings: Settings, key: str, user_id: int, offset: int, read: Callable[[int], bytes],
            content_length: int | None, checksum: tuple[str, bytes] | None) -> Progress:
    """Append one chunk at ``offset``. ``read(n)`` gives up to ``n`` bytes of the body and
    b"" at its end or when the client went away (both: keep what arrived)."""
    assert settings.media_root is not None
    with try_lock(f"resumable:{key}") as mine:
        if not mine:
            raise Busy("Another request is still writing this upload; ask for its offset (HEAD) "
                       "and send again in a moment.")
        with session_scope() as session:
            row = owned(session, key, user_id)
            start, length, status, name = row.offset, row.length, row.status, row.filename
            path = settings.media_root / row.path
        if status != ResumableStatus.RECEIVING:
            raise OffsetMismatch(f"{name} is already complete ({length} bytes); nothing more is taken.")
        if offset != start:
            raise OffsetMismatch(f"Upload-Offset {offset} is not where {name} stands: the server has "
                                 f"{start} bytes. Ask with HEAD and send from there.")
        remaining = length - start
        if content_length is not None and content_length > remaining:
            raise TooLarge(f"This chunk of {content_length} bytes goes past the end of {name}: "
                           f"{remaining} bytes remain of the {length} declared.")
        _check_room(settings, path.parent, remaining if content_length is None else content_length)
        end, interrupted = _write(settings, key, path, start, remaining, read, content_length, checksum, name)
        with session_scope() as session:
            row = owned(session, key, user_id)
            row.offset = end
            if end == length:
                row.status = ResumableStatus.COMPLETE
            row.updated_at = utcnow()
            return Progress(key, end, length, row.status, interrupted)


def _write(settings: Settings, key: str, path: Path, start: int, remaining: int, read: Callable[[int], bytes],
           content_length: int | None, checksum: tuple[str, bytes] | None, name: str) -> tuple[int, bool]:
    hasher = CHECKSUMS[checksum[0]]() if checksum else None
    expected = remaining if content_length is None else content_length
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        raise NotFound(f"The bytes of {name} are gone from the server (expired); start it again.") from None
    written, committed = 0, 0
    try:
        os.ftruncate(fd, start)  # bytes past the offset are from a chunk that never committed
        os.lseek(fd, start, os.SEEK_SET)
        first = start == 0
        while True:
            block = read(min(CHUNK_BYTES, expected - written + 1))
            if first and block:
                # The type check before the bytes are kept: the file's head against its name.
                while len(block) < SNIFF_BYTES and len(block) <= expected:
                    more = read(min(CHUNK_BYTES, expected - len(block) + 1))
                    if not more:
                        break
                    block += more
                first = False
                why = refusal(block[:SNIFF_BYTES], kind_of(name, settings.video_extensions))
                if why:
                    raise WrongType(f"{name}: {why}. Nothing was kept.")
            if not block:
                break
            if written + len(block) > expected:
                what = "its Content-Length" if content_length is not None else "the file's declared length"
                raise TooLarge(f"The body goes past {what}: {name} has {remaining} bytes left of "
                               f"{start + remaining}. Nothing of this chunk was kept.")
            _write_all(fd, block)
            written += len(block)
            if hasher is not None:
                hasher.update(block)
            elif written - committed >= COMMIT_EVERY:
                os.fsync(fd)
                committed = written
                _commit_offset(key, start + written)
        os.fsync(fd)
    except ResumableError:
        os.ftruncate(fd, start)
        raise
    except OSError as exc:
        os.ftruncate(fd, start + committed)
        _commit_offset(key, start + committed)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise NoSpace(f"The server's media store filled up while {name} was written; it keeps "
                          f"{start + committed} bytes. Try again once space is freed.") from exc
        raise
    finally:
        os.close(fd)
    interrupted = written < expected if content_length is not None else False
    if hasher is not None:
        if interrupted:
            # A partial chunk cannot be checked against the checksum of the whole: dropped.
            with open(path, "r+b") as fh:
                fh.truncate(start)
            return start, True
        if hasher.digest() != checksum[1]:
            with open(path, "r+b") as fh:
                fh.truncate(start)
            raise ChecksumMismatch(f"The chunk's {checksum[0]} does not match Upload-Checksum; it was "
                                   f"dropped and {name} stays at {start} bytes. Send it again.")
    return start + written, interrupted


def _write_all(fd: int, block: bytes) -> None:
    view = memoryview(block)
    while view:
        view = view[os.write(fd, view):]


def _commit_offset(key: str, offset: int) -> None:
    with session_scope() as session:
        row = session.scalar(select(ResumableUpload).where(ResumableUpload.key == key))
        if row is not None:
            row.offset, row.updated_at = offset, utcnow()


def terminate(session: Session, settings: Settings, key: str, user_id: int) -> None:
    """The tus termination extension: the upload and its bytes are gone."""
    assert settings.media_root is not None
    row = owned(session, key, user_id, lock=True)
    if row.status == ResumableStatus.SUBMITTED:
        raise OffsetMismatch(f"{row.filename} is already part of batch {row.batch_id}; delete it there.")
    (settings.media_root / row.path).unlink(missing_ok=True)
    session.delete(row)


def claim_complete(session: Session, keys: list[str], user_id: int) -> list[ResumableUpload]:
    """This user's complete uploads named by ``keys``, locked for a batch to take them."""
    rows = []
    for key in dict.fromkeys(keys):
        row = owned(session, key, user_id, lock=True)
        if row.status == ResumableStatus.SUBMITTED:
            raise Refused(f"{row.filename} was already sent to batch {row.batch_id}.")
        if row.status != ResumableStatus.COMPLETE:
            raise Refused(f"{row.filename} is not complete: {row.offset} of {row.length} bytes arrived. "
                          "Finish sending it first.")
        rows.append(row)
    return rows


def expire_stalled(session: Session, settings: Settings, now: datetime | None = None) -> int:
    """Delete every upload (and its bytes) untouched for ``resumable_expire_after_s``: stalled
    ones, complete ones never given to a batch, and the records of submitted ones."""
    assert settings.media_root is not None
    cutoff = (now or utcnow()) - timedelta(seconds=settings.resumable_expire_after_s)
    query = select(ResumableUpload).where(ResumableUpload.updated_at < cutoff)
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    expired = 0
    for row in session.scalars(query):
        if row.status != ResumableStatus.SUBMITTED:  # a submitted file belongs to its batch now
            (settings.media_root / row.path).unlink(missing_ok=True)
        session.delete(row)
        expired += 1
    session.flush()
    return expired + _sweep_strays(session, settings, cutoff)


def _sweep_strays(session: Session, settings: Settings, cutoff: datetime) -> int:
    """Files in ``resumable/`` no row names (their creation's transaction never committed),
    as old as an expired upload."""
    assert settings.media_root is not None
    folder = settings.media_root / "resumable"
    if not folder.is_dir():
        return 0
    known = set(session.scalars(select(ResumableUpload.path)))
    swept = 0
    for entry in os.scandir(folder):
        rel = f"resumable/{entry.name}"
        if rel not in known and entry.is_file(follow_symlinks=False) and entry.stat().st_mtime < cutoff.timestamp():
            Path(entry.path).unlink(missing_ok=True)
            swept += 1
    return swept
