"""Start a batch from local paths (CLI) or from uploaded streams (web, API).

The batch and its parked uploads are committed before any task is sent, so a worker never
receives an id the database does not know yet.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import BinaryIO

from vidlora import resumable
from vidlora.batches import BatchError, create_batch, park_file, park_received, park_stream, record_member
from vidlora.config import get_settings
from vidlora.db import session_scope
from vidlora.ingest.dvd import Joined as JoinedParts
from vidlora.ingest.dvd import Title as DvdTitle
from vidlora.ingest.dvd import ifo_title_bytes
from vidlora.ingest.dvd import incomplete as incomplete_title
from vidlora.ingest.dvd import titles as dvd_titles
from vidlora.ingest.kinds import Kind
from vidlora.ingest.settle import changing
from vidlora.ingest.store import StoreError
from vidlora.ingest.sources import expand_paths
from vidlora.lifecycle import ItemStatus

log = logging.getLogger(__name__)


def _send_ingest(upload_ids: list[int]) -> None:
    from tasks import messages

    messages.ingest_uploads(upload_ids)


def submit_paths(paths: list[Path], scenarios: list[str], name: str, source: str = "cli",
                 created_by: str | None = None) -> tuple[int, int]:
    """Returns (batch id, number of files parked for ingest)."""
    settings = get_settings()
    upload_ids: list[int] = []
    with session_scope() as session:
        batch = create_batch(session, name, source, scenarios, created_by)
        items = list(expand_paths(paths, settings))
        busy = changing([i.path for i in items if i.kind != Kind.OTHER], settings.ingest_settle_s)
        named = {i.name: i for i in items}
        dvd = dvd_titles([i.name for i in items if i.kind == Kind.VIDEO and i.path not in busy])
        joined: set[str] = set()
        for item in items:
            title = dvd.get(item.name)
            if title is not None:  # one part of a DVD title: the parts are parked joined, once
                reason = title.part_reason(item.name)
                ifo = named[title.ifo].path.read_bytes()[:256] if title.ifo in named else b""
                missing = incomplete_title(title, [named[p].path.stat().st_size for p in title.parts],
                                           ifo_title_bytes(ifo))
                reason = f"{reason}; {missing}" if missing else reason
                if title.name not in joined:
                    joined.add(title.name)
                    upload_ids.append(_park_title(session, settings, batch, title, named).id)
                record_member(session, batch.id, item.name, ItemStatus.SKIPPED, reason, None, settings.media_root)
                continue
            if item.kind == Kind.OTHER:
                record_member(session, batch.id, item.name, ItemStatus.SKIPPED, item.reason, None, settings.media_root)
                continue
            if item.path in busy:
                record_member(session, batch.id, item.name, ItemStatus.REJECTED, busy[item.path], None,
                              settings.media_root)
                continue
            upload_ids.append(park_file(session, settings, batch, item.path, item.name).id)
        if not upload_ids:
            raise BatchError(next(iter(busy.values())) if busy else "no video or archive found in the given paths")
        batch_id = batch.id
    _send_ingest(upload_ids)
    return batch_id, len(upload_ids)


def _park_title(session, settings, batch, title: DvdTitle, named: dict):
    """A DVD title's parts, read one after another into one parked upload."""
    paths = [named[p].path for p in title.parts]
    stream = JoinedParts([lambda p=p: open(p, "rb") for p in paths])
    try:
        return park_stream(session, settings, batch, title.name, stream, settings.archive_max_total_bytes)
    finally:
        stream.close()


def submit_streams(files: list[tuple[str, BinaryIO]], scenarios: list[str], name: str, source: str = "web",
                   created_by: str | None = None) -> int:
    """Park uploaded files (already size-checked by the web layer) and start their ingest."""
    settings = get_settings()
    if not files:
        raise BatchError("no files uploaded")
    with session_scope() as session:
        batch = create_batch(session, name, source, scenarios, created_by)
        upload_ids = [
            park_stream(session, settings, batch, filename, stream, settings.max_upload_bytes).id
            for filename, stream in files
        ]
        batch_id = batch.id
    _send_ingest(upload_ids)
    return batch_id


def submit_received(keys: list[str], user_id: int, scenarios: list[str], name: str, source: str = "api",
                    created_by: str | None = None) -> int:
    """Start a batch of complete resumable uploads (the page's, the API's, `vidlora upload`'s):
    each is parked and ingested exactly as a streamed upload is."""
    if not keys:
        raise BatchError("no files uploaded")
    settings = get_settings()
    assert settings.media_root is not None
    moved: list[tuple[Path, Path]] = []  # (where the bytes were, where they are now)
    try:
        with session_scope() as session:
            try:
                rows = resumable.claim_complete(session, keys, user_id)
            except resumable.ResumableError as exc:
                raise BatchError(str(exc)) from exc
            batch = create_batch(session, name, source, scenarios, created_by)
            upload_ids = []
            for row in rows:
                received = settings.media_root / row.path
                if not received.is_file():
                    raise BatchError(f"The bytes of {row.filename} are no longer on the server; nothing was "
                                     "started: send that file again.")
                try:
                    upload = park_received(session, settings, batch, row)
                except StoreError as exc:  # the server's paths stay in its log, not in the answer
                    log.error("batch of uploads %s: %s", keys, exc)
                    raise BatchError(f"The media store could not take {row.filename}; nothing was started: "
                                     "try again.") from exc
                moved.append((received, settings.media_root / upload.path))
                upload_ids.append(upload.id)
            batch_id = batch.id
    except BaseException:
        # The rows roll back to their resumable/ paths, so the files go back there too: the
        # uploads stay complete and can be sent to a batch again, nothing orphaned.
        for received, parked in reversed(moved):
            if parked.exists() and not received.exists():
                os.replace(parked, received)
        raise
    _send_ingest(upload_ids)
    return batch_id
