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

from sqlalchemy import or_, select

from tasks.base import VidloraTask
from tasks.celery_app import app
from vidlora.config import get_settings
from vidlora.db import session_scope
from vidlora.models import Analysis, Upload, Video, Worker, utcnow

log = logging.getLogger(__name__)


def find_orphans(session, stale_s: float, heartbeat_s: float) -> dict[str, list[int]]:
    now = utcnow()
    stale = now - timedelta(seconds=stale_s)
    dead_after = now - timedelta(seconds=3 * heartbeat_s)
    live = set(session.scalars(select(Worker.name).where(Worker.status == "ready", Worker.heartbeat_at >= dead_after)))
    uploads = list(session.scalars(select(Upload.id).where(Upload.status == "pending", Upload.created_at < stale)))
    videos = list(session.scalars(
        select(Video.id).where(Video.status.in_(("registered", "probing")), Video.updated_at < stale)
    ))
    # Analyses still waiting for frames although their video is ready (prepare was lost).
    videos += list(session.scalars(
        select(Analysis.video_id).join(Video, Video.id == Analysis.video_id)
        .where(Analysis.status == "pending", Video.status == "ready", Video.updated_at < stale).distinct()
    ))
    in_flight = session.scalars(
        select(Analysis).where(
            Analysis.status.in_(("queued", "running")),
            or_(Analysis.queued_at < stale, Analysis.queued_at.is_(None)),
        )
    ).all()
    lost = [a.id for a in in_flight if a.worker is None or a.worker not in live]
    ready = list(session.scalars(select(Analysis.id).where(Analysis.status == "ready")))
    return {"uploads": uploads, "videos": sorted(set(videos)), "analyses": lost, "ready": ready}


@app.task(base=VidloraTask, bind=True, name="tasks.reconcile.reconcile")
def reconcile(self: VidloraTask, stale_s: float | None = None) -> dict[str, int]:
    from tasks.dispatch import dispatch_ready
    from tasks.ingest import ingest_upload
    from tasks.prepare import prepare_video

    settings = get_settings()
    with session_scope() as session:
        orphans = find_orphans(session, stale_s if stale_s is not None else settings.stale_after_s, settings.heartbeat_s)
        for analysis in session.scalars(select(Analysis).where(Analysis.id.in_(orphans["analyses"]))):
            analysis.status, analysis.ready_at, analysis.worker = "ready", utcnow(), None
    for upload_id in orphans["uploads"]:
        ingest_upload.delay(upload_id)
    for video_id in orphans["videos"]:
        prepare_video.delay(video_id)
    if orphans["analyses"] or orphans["ready"]:
        dispatch_ready.delay()
    counts = {k: len(v) for k, v in orphans.items()}
    if any(counts.values()):
        log.warning("reconcile re-sent orphaned work: %s", counts)
    return counts
