"""Analyses on this GPU worker's engine: claim them, run them, store each output.

Runs only in a GPU worker process (solo pool), where ``workers.runtime`` holds the engine
built at start-up. In the default streaming mode (``gpu_worker_mode=stream``) the task hands
its analyses to the engine thread (``tasks.gpu_stream``), which stores each one as it finishes;
in ``batch`` mode the task runs them as one guarded ``generate`` call and waits for the slowest.
Every output passes engine_patch's health guard before it may be stored: a degenerate output is
never recorded as a result. ``claim``, ``store``, ``fail`` and ``release`` are the one way an
analysis row moves on a GPU worker, in both modes.
"""

from __future__ import annotations

import logging

from celery import shared_task
from celery.exceptions import WorkerShutdown

from tasks import messages
from tasks.analysis_rows import claim, release, store_or_fail
from tasks.base import VidloraTask
from tasks.gpu_stream import EXIT_ENGINE_REPLACED
from vidlora.config import get_settings
from vidlora.db import session_scope
from vidlora.scenarios import record_registrations
from workers import runtime

log = logging.getLogger(__name__)


@shared_task(base=VidloraTask, bind=True, name=messages.ANALYZE_BATCH)
def analyze_batch(self: VidloraTask, analysis_ids: list[int]) -> int:
    # Here, not at module level: CPU-image processes load this module and have no engine_patch.
    from engine_patch.guard import EngineReplaceRequired

    stream = runtime.get_stream()
    if stream is not None:
        return stream.take(self, analysis_ids)  # the engine thread runs them (tasks.gpu_stream)
    host = runtime.get_host()
    settings = get_settings()
    requests = claim(self, analysis_ids, runtime.worker_name())
    if not requests:
        return 0
    try:
        outputs = host.generate(requests, deadline_s=settings.gpu_batch_deadline_s)
    except EngineReplaceRequired as exc:
        # The engine cannot be rebuilt in this process: give the work back and exit non-zero;
        # the supervisor (compose restart policy) starts a fresh worker with a fresh engine.
        log.error("engine must be replaced: %s; releasing %d analyses and exiting", exc, len(requests))
        release(requests, f"engine replaced: {exc}"[:2000])
        messages.dispatch_ready(countdown=settings.dispatch_max_wait_s)
        raise WorkerShutdown(EXIT_ENGINE_REPLACED) from exc
    except Exception as exc:  # the engine itself failed; the guard could not recover it
        log.exception("batch %s failed in the engine", analysis_ids)
        release(requests, f"engine error: {type(exc).__name__}: {exc}"[:2000])
        messages.dispatch_ready(countdown=settings.dispatch_max_wait_s)
        return 0
    # Which analyses shared this engine batch, in order: batch composition changes low-order
    # numerics, so an output is reproduced exactly (and a cross-request effect is traced) only
    # with its batch-mates.
    identity = {**host.identity(), "engine_batch": [int(r.request_key) for r in requests]}
    with session_scope() as session:  # an adapter registered (or refused) during this batch
        record_registrations(session, host.registrations())
    for output in outputs:
        # The database going away raises: Celery retries the batch; finished rows are skipped.
        store_or_fail(output, identity)
    runtime.after_batch()
    return sum(1 for o in outputs if not o.error)

