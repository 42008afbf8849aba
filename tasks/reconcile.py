"""Reconcile the database with the queues: re-send work whose message was lost.

At-least-once delivery breaks in two places no task can see from inside: a broker that
restarts without persistence forgets queued messages, and a worker that dies holding
a batch in its private queue never comes back for it. The database knows what should be
happening, so a periodic sweep re-sends whatever has sat still for ``stale_after_s``. Every
task it re-sends is idempotent, so a duplicate message costs time, never a duplicate result.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from sqlalchemy import or_, select, update

from tasks import messages
from tasks.base import VidloraTask
from vidlora import resumable
from vidlora.config import get_settings
from vidlora.db import session_scope
from vidlora.batches import finish_batch_if_done
from vidlora.heartbeats import alive_since
from vidlora.lifecycle import (
    IN_FLIGHT_ANALYSIS,
    UNPROBED_VIDEO,
    AnalysisStatus,
    BatchStatus,
    UploadStatus,
    VideoStatus,
    WorkerStatus,
)
from vidlora.models import Analysis, Batch, Upload, Video, Worker, utcnow

log = logging.getLogger(__name__)


def find_orphans(session, stale_s: float, heartbeat_s: float) -> dict[str, list[int]]:
    now = utcnow()
    stale = now - timedelta(seconds=stale_s)
    dead_after = alive_since(now, heartbeat_s)
    live = set(session.scalars(
        select(Worker.name).where(Worker.status == WorkerStatus.READY, Worker.heartbeat_at >= dead_after)
    ))
    uploads = list(session.scalars(
        select(Upload.id).where(Upload.status == UploadStatus.PENDING, Upload.updated_at < stale)
    ))
    videos = list(session.scalars(
        select(Video.id).where(Video.status.in_(UNPROBED_VIDEO), Video.updated_at < stale)
    ))
    # Analyses still waiting for frames although their video is ready (prepare was lost).
    videos += list(session.scalars(
        select(Analysis.video_id).join(Video, Video.id == Analysis.video_id)
        .where(Analysis.status == AnalysisStatus.PENDING, Video.status == VideoStatus.READY, Video.updated_at < stale)
        .distinct()
    ))
    in_flight_query = select(Analysis).where(
        Analysis.status.in_(IN_FLIGHT_ANALYSIS),
        or_(Analysis.queued_at < stale, Analysis.queued_at.is_(None)),
    )
    if session.get_bind().dialect.name == "postgresql":
        # A row a GPU worker is claiming right now is skipped, and a row that turned final
        # since the snapshot is re-checked, so a finished analysis is never set back to ready.
        in_flight_query = in_flight_query.with_for_update(skip_locked=True)
    in_flight = session.scalars(in_flight_query).all()
    # "running" on a live worker is that worker's (its batch deadline bounds it). "queued" is
    # only a message: if the broker lost it (a restart without persistence, a failed publish)
    # a live worker never sees it, so a stale queued row is re-sent whoever it was meant for.
    # If the message was only waiting, the first delivery runs it and the other is skipped.
    lost = [a.id for a in in_flight
            if a.status == AnalysisStatus.QUEUED or a.worker is None or a.worker not in live]
    ready = list(session.scalars(select(Analysis.id).where(Analysis.status == AnalysisStatus.READY)))
    # A batch still "ingesting" although none of its uploads is pending: the ingest that
    # settled its last upload did not finish the batch (its transaction was lost, or an older
    # release raced two uploads). Settled for a stale period, so an ingest finishing it right
    # now is left to do so.
    pending_or_recent = (select(Upload.id).where(Upload.batch_id == Batch.id)
                         .where(or_(Upload.status == UploadStatus.PENDING, Upload.updated_at >= stale)))
    unfinished = list(session.scalars(
        select(Batch.id).where(Batch.status == BatchStatus.INGESTING, Batch.uploads.any(),
                               ~pending_or_recent.exists())
    ))
    return {"uploads": uploads, "videos": sorted(set(videos)), "analyses": lost, "ready": ready,
            "batches": unfinished}


def cpu_backlog() -> int | None:
    """Messages waiting in the cpu queue, or None if the broker cannot say."""
    from tasks.celery_app import CPU_QUEUE, get_app

    try:
        with get_app().connection_for_write() as conn:
            return int(conn.default_channel.queue_declare(CPU_QUEUE, passive=True).message_count)
    except Exception:  # the broker is down or cannot count: behave as if nothing is waiting
        log.debug("cannot read the cpu queue length", exc_info=True)
        return None


def claim_orphans(session, stale_s: float, heartbeat_s: float, resend_inputs: bool) -> dict[str, list[int]]:
    """Find orphaned work and mark it re-sent, in the caller's transaction; the caller sends
    the messages after commit. ``resend_inputs`` False leaves uploads and videos alone: their
    message may simply still be waiting in a long cpu queue (a bulk ingest), and re-sending
    them every sweep would add a duplicate per row per sweep while the backlog only grew."""
    orphans = find_orphans(session, stale_s, heartbeat_s)
    if not resend_inputs:
        orphans["uploads"], orphans["videos"] = [], []
    for analysis in session.scalars(select(Analysis).where(Analysis.id.in_(orphans["analyses"]))):
        analysis.status, analysis.ready_at, analysis.worker = AnalysisStatus.READY, utcnow(), None
    for batch_id in orphans["batches"]:
        finish_batch_if_done(session, batch_id)
    # Each upload and video is re-sent at most once per stale period, not once per sweep.
    if orphans["uploads"]:
        session.execute(update(Upload).where(Upload.id.in_(orphans["uploads"])).values(updated_at=utcnow()))
    if orphans["videos"]:
        session.execute(update(Video).where(Video.id.in_(orphans["videos"])).values(updated_at=utcnow()))
    session.flush()
    return orphans


@shared_task(base=VidloraTask, bind=True, name=messages.RECONCILE)
def reconcile(self: VidloraTask, stale_s: float | None = None) -> dict[str, int]:
    settings = get_settings()
    backlog = cpu_backlog()
    with session_scope() as session:
        orphans = claim_orphans(session, stale_s if stale_s is not None else settings.stale_after_s,
                                settings.heartbeat_s, resend_inputs=not backlog)
    with session_scope() as session:
        # Resumable uploads nobody sent a chunk to for resumable_expire_after_s: their bytes go.
        expired = resumable.expire_stalled(session, settings)
    messages.ingest_uploads(orphans["uploads"])
    messages.prepare_videos(orphans["videos"])
    if orphans["analyses"] or orphans["ready"]:
        messages.dispatch_ready()
    counts = {k: len(v) for k, v in orphans.items()}
    if expired:
        counts["expired_uploads"] = expired
    if any(counts.values()):
        log.warning("reconcile re-sent orphaned work: %s (cpu backlog %s)", counts, backlog)
    return counts
