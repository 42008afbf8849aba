"""Dispatch: claim ready analyses, group them by adapter, send each batch to a GPU worker.

Rows are claimed with ``FOR UPDATE SKIP LOCKED`` (PostgreSQL), so concurrent dispatch tasks
never send one analysis twice. The claim is committed before the message is sent: a crash in
between leaves analyses ``queued`` with no message, which the reconciler returns to ``ready``;
the opposite order could run them twice.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timezone

from celery import shared_task
from sqlalchemy import func, select

from tasks import messages
from tasks.base import VidloraTask
from tasks.celery_app import GPU_QUEUE
from vidlora.config import get_settings
from vidlora.db import is_postgres, session_scope
from vidlora.heartbeats import alive_since
from vidlora.lifecycle import IN_FLIGHT_ANALYSIS, AdapterStatus, AnalysisStatus, WorkerStatus
from vidlora.models import Analysis, FrameSet, Scenario, Worker
from vidlora.scenarios import Generation
from vidlora.engine_batches import ReadyAnalysis, WorkerView, choose_worker, group_by_adapter, should_send

log = logging.getLogger(__name__)


def live_workers(session, now: datetime) -> list[WorkerView]:
    settings = get_settings()
    cutoff = alive_since(now, settings.heartbeat_s)
    in_flight = dict(
        session.execute(
            select(Analysis.worker, func.count())
            .where(Analysis.status.in_(IN_FLIGHT_ANALYSIS), Analysis.worker.is_not(None))
            .group_by(Analysis.worker)
        ).all()
    )
    return [
        WorkerView(w.name, w.queue, tuple(w.adapters_resident or ()), in_flight.get(w.name, 0))
        for w in session.scalars(
            select(Worker).where(Worker.status == WorkerStatus.READY, Worker.heartbeat_at >= cutoff)
        )
    ]


def _fail_refused(session, now: datetime) -> int:
    """Ready analyses of a scenario whose adapter the GPU workers refused fail at once with
    the refusal (module and why): no GPU time, no engine step, and the reason is theirs."""
    query = (select(Analysis, Scenario.adapter_reason).join(Scenario, Scenario.id == Analysis.scenario_id)
             .where(Analysis.status == AnalysisStatus.READY, Scenario.adapter_status == AdapterStatus.REFUSED))
    if is_postgres():
        query = query.with_for_update(of=Analysis, skip_locked=True)
    rows = session.execute(query).all()
    for analysis, reason in rows:
        analysis.status, analysis.finished_at = AnalysisStatus.FAILED, now
        analysis.reason = f"adapter refused: {reason}"[:2000]
    return len(rows)


def _aware(ts: datetime) -> datetime:
    return ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)


@shared_task(base=VidloraTask, bind=True, name=messages.DISPATCH_READY)
def dispatch_ready(self: VidloraTask) -> int:
    settings = get_settings()
    now = datetime.now(timezone.utc)
    sends: list[tuple[str, list[int]]] = []
    waiting = False
    with session_scope() as session:
        _fail_refused(session, now)
        query = (
            select(Analysis, Scenario.name, Scenario.generation, FrameSet)
            .join(Scenario, Scenario.id == Analysis.scenario_id)
            .join(FrameSet, FrameSet.id == Analysis.frame_set_id)
            .where(Analysis.status == AnalysisStatus.READY, Scenario.adapter_status != AdapterStatus.REFUSED)
            .order_by(Analysis.id)
        )
        if is_postgres():
            query = query.with_for_update(of=Analysis, skip_locked=True)
        rows = session.execute(query).all()
        if not rows:
            return 0
        by_id = {a.id: a for a, *_ in rows}
        ready = [
            ReadyAnalysis(
                id=a.id, adapter=name, frames=len(fs.files), width=fs.width or 0, height=fs.height or 0,
                max_tokens=Generation.of(gen).max_tokens, ready_since=_aware(a.ready_at or a.created_at),
            )
            for a, name, gen, fs in rows
        ]
        more_coming = set(
            session.scalars(
                select(Scenario.name).join(Analysis, Analysis.scenario_id == Scenario.id)
                .where(Analysis.status == AnalysisStatus.PENDING).distinct()
            )
        )
        workers = live_workers(session, now)
        for adapter, batches in group_by_adapter(
            ready, settings.batch_max_requests, settings.batch_max_tokens
        ).items():
            for batch in batches:
                if not should_send(batch, settings.batch_max_requests, adapter in more_coming,
                                   now, settings.dispatch_max_wait_s):
                    waiting = True
                    continue
                worker = choose_worker(adapter, workers)
                queue = worker.queue if worker else GPU_QUEUE
                if worker is not None:
                    # The chosen worker will hold this adapter and carry this load.
                    workers = [
                        replace(w, adapters=(*w.adapters, adapter), in_flight=w.in_flight + len(batch))
                        if w.name == worker.name else w
                        for w in workers
                    ]
                for item in batch:
                    analysis = by_id[item.id]
                    analysis.status, analysis.queued_at = AnalysisStatus.QUEUED, now
                    analysis.worker = worker.name if worker else None
                sends.append((queue, [item.id for item in batch]))
    for queue, ids in sends:
        messages.analyze_batch(ids, queue)
    if waiting:
        messages.dispatch_ready(countdown=settings.dispatch_max_wait_s)
    log.info("dispatched %d batches (%s)", len(sends), ", ".join(f"{q}:{len(i)}" for q, i in sends))
    return len(sends)
