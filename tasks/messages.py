"""Every message vidlora sends, sent by task name: ids and plain values only.

Senders do not import the task they send to (Celery's "call a task by name"), so task
modules do not import each other, and a process that only sends (the web app, the CLI)
never loads a task's dependencies. Routing (which queue) stays in `tasks.celery_app`; the
names here are the ones the task modules register.
"""
from __future__ import annotations

from collections.abc import Iterable

from tasks.celery_app import get_app

INGEST_UPLOAD = "tasks.ingest.ingest_upload"
PREPARE_VIDEO = "tasks.prepare.prepare_video"
DISPATCH_READY = "tasks.dispatch.dispatch_ready"
ANALYZE_BATCH = "tasks.analyze.analyze_batch"
RECONCILE = "tasks.reconcile.reconcile"


def ingest_uploads(upload_ids: Iterable[int]) -> None:
    for upload_id in upload_ids:
        get_app().send_task(INGEST_UPLOAD, (int(upload_id),))


def prepare_videos(video_ids: Iterable[int]) -> None:
    for video_id in video_ids:
        get_app().send_task(PREPARE_VIDEO, (int(video_id),))


def dispatch_ready(countdown: float | None = None) -> None:
    get_app().send_task(DISPATCH_READY, countdown=countdown)


def analyze_batch(analysis_ids: list[int], queue: str) -> None:
    """One engine batch to a GPU queue (``gpu`` or a worker's own ``gpu.<name>``)."""
    get_app().send_task(ANALYZE_BATCH, ([int(i) for i in analysis_ids],), queue=queue)
