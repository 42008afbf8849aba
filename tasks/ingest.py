"""Ingest one parked upload: a single video, or an archive unpacked member by member.

Each member is recorded in its own transaction, so a worker killed mid-archive loses
nothing: the redelivered task walks the archive again, members already recorded are
skipped by their unique (batch, name) key and the store deduplicates content by hash.
"""

from __future__ import annotations

import logging
from pathlib import Path

from celery import shared_task
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from tasks import messages
from tasks.base import VidloraTask
from vidlora.attempts import begin_attempt
from vidlora.batches import finish_batch_if_done, record_member
from vidlora.config import get_settings
from vidlora.db import session_scope
from vidlora.ingest.archive import MemberOutcome, ingest_archive
from vidlora.ingest.kinds import Kind, kind_of, not_video_reason
from vidlora.ingest.store import MediaStore, StoreError
from vidlora.lifecycle import ItemStatus, UploadStatus, VideoStatus
from vidlora.locks import try_lock
from vidlora.models import BatchItem, Upload, Video

log = logging.getLogger(__name__)


def _record(batch_id: int, outcome: MemberOutcome, media_root: Path) -> tuple[int | None, bool]:
    for attempt in range(2):
        try:
            with session_scope() as session:
                return record_member(
                    session, batch_id, outcome.name, outcome.status, outcome.reason,
                    outcome.stored, media_root,
                )
        except IntegrityError:
            # Another worker registered the same content at the same moment; the second
            # pass finds its row.
            if attempt:
                raise
    raise AssertionError("unreachable")


def _outcomes(upload: Upload, path: Path, store: MediaStore):
    settings = get_settings()
    kind = kind_of(upload.name, settings.video_extensions)
    if kind == Kind.ARCHIVE:
        yield from ingest_archive(path, store, settings)
        return
    if kind == Kind.OTHER:
        yield MemberOutcome(upload.name, ItemStatus.REJECTED, not_video_reason(upload.name), None)
        return
    try:
        stored = store.adopt_upload(path, settings.max_video_bytes)
    except StoreError as exc:
        yield MemberOutcome(upload.name, ItemStatus.REJECTED, str(exc), None)
        return
    yield MemberOutcome(upload.name, ItemStatus.STORED, None, stored)


@shared_task(base=VidloraTask, bind=True, name=messages.INGEST_UPLOAD)
def ingest_upload(self: VidloraTask, upload_id: int) -> dict[str, int]:
    with try_lock(f"ingest:{upload_id}") as mine:
        if not mine:  # another live worker is ingesting this upload
            return {"skipped": 1}
        return _ingest(self, upload_id)


def _ingest(task: VidloraTask, upload_id: int) -> dict[str, int]:
    settings = get_settings()
    assert settings.media_root is not None
    store = MediaStore(settings.media_root)
    with session_scope() as session:
        upload = session.get(Upload, upload_id)
        if upload is None or upload.status != UploadStatus.PENDING:
            return {"skipped": 1}
        if not begin_attempt(upload, settings.max_attempts, counts=task.is_first_delivery):
            finish_batch_if_done(session, upload.batch_id)
            return {"failed": 1}
        batch_id, name, rel = upload.batch_id, upload.name, upload.path
        redelivered = upload.attempts > 1
    path = settings.media_root / rel
    to_prepare: list[int] = []
    counts = {s.value: 0 for s in ItemStatus}
    try:
        for outcome in _outcomes(upload, path, store):
            video_id, needs_prepare = _record(batch_id, outcome, settings.media_root)
            counts[outcome.status] += 1
            if needs_prepare and video_id is not None:
                to_prepare.append(video_id)
    except StoreError as exc:
        # The media store itself failed (full, unwritable): the batch says so; what was
        # recorded so far stays; the parked upload is kept so it can be retried.
        log.error("ingest of upload %s stopped: %s", upload_id, exc)
        with session_scope() as session:
            upload = session.get(Upload, upload_id)
            upload.status, upload.reason = UploadStatus.FAILED, f"media store error: {exc}"
            finish_batch_if_done(session, batch_id)
        _send_prepare(to_prepare)
        return counts
    with session_scope() as session:
        if redelivered:
            # Videos recorded by the killed delivery may never have had their prepare sent.
            earlier = session.scalars(
                select(Video.id).join(BatchItem, BatchItem.video_id == Video.id)
                .where(BatchItem.batch_id == batch_id, Video.status == VideoStatus.REGISTERED)
            )
            to_prepare = list(dict.fromkeys([*to_prepare, *earlier]))
        upload = session.get(Upload, upload_id)
        upload.status = UploadStatus.DONE
        finish_batch_if_done(session, batch_id)
    _send_prepare(to_prepare)
    path.unlink(missing_ok=True)
    log.info("ingested upload %s (%s): %s", upload_id, name, counts)
    return counts


def _send_prepare(video_ids: list[int]) -> None:
    messages.prepare_videos(video_ids)
