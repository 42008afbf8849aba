"""The GPU worker's engine thread: analyses stream into the engine, each result is stored the
moment its request finishes.

Work still reaches the worker as ``analyze_batch`` messages (dispatch keeps grouping by adapter
and adapter affinity across workers). The task no longer runs the batch: ``take`` waits until
the stream has room for it (back-pressure: unclaimed messages stay in the broker, where another
worker can take them), claims the analyses (RUNNING on this worker, attempt counted) and offers
them to the stream; the message is acknowledged when the task returns. From then on the
database is the record: whatever this process holds when it dies is RUNNING on a worker whose
heartbeat stops, which the reconciler gives back; a worker that restarts under the same name
gives back what its predecessor held before it consumes (``release_abandoned``).

This thread is the only one that touches the engine. It hands each finished result to the
result writer (``ResultWriter``, a thread of its own that stores it, retrying while the database
is away), publishes registrations, beats the heartbeat and counts metrics every ``flush_s``. A
graceful stop drains what is in flight (``drain_s``), waits for the writer and gives the rest
back; an engine that must be replaced gives everything back and stops the worker with exit 75.

Why a writer thread: the GPU waits on the engine thread between steps, and storing one result
is a few PostgreSQL round trips and a commit (bench/results/engine_thread_cpu.md). In the writer
the waits leave the engine thread entirely; the Python part shares the interpreter lock with it.
A result waiting in the writer is as safe as one in flight: its analysis is RUNNING on this
worker until stored, and the reconciler gives it back if the process dies first.
"""
from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from typing import Any

from sqlalchemy import select, update

from tasks import messages
from tasks.analysis_rows import claim, reclaim, release, store_or_fail
from tasks.base import TRANSIENT_ERRORS
from vidlora.config import Settings
from vidlora.db import reset_engine, session_scope
from vidlora.engine_io import AnalysisOutput, AnalysisRequest
from vidlora.lifecycle import AnalysisStatus
from vidlora.models import Analysis, utcnow

log = logging.getLogger(__name__)

# Exit status of a GPU worker that stopped to have its engine replaced (EX_TEMPFAIL): a
# supervisor restarts it; the work it held is back in the database already.
EXIT_ENGINE_REPLACED = 75


class StreamRunner:
    def __init__(self, host: Any, settings: Settings, worker_name: str, tokens_per_request: int, *,
                 flush_s: float = 2.0) -> None:
        from vidlora.admission import backlog, concurrency
        from workers.engine_stream import EngineStream

        self.host, self.settings, self.worker_name = host, settings, worker_name
        # How many analyses the engine runs at once: its sequence cap, bounded by the KV and
        # GDN-state blocks one analysis of the scenarios' shape holds (read from the engine;
        # gpu_worker sizes the shape from their sampling policies). Admitting more only queues
        # them inside vLLM, where no other worker can take them.
        memory = host.engine_memory()
        self.capacity = concurrency(settings.max_num_seqs, memory, tokens_per_request, settings.stream_max_in_flight)
        self.memory = memory.as_dict(tokens_per_request) if memory is not None else None
        if self.memory is not None:
            self.memory.update(weights=host.weights_format(), max_num_seqs=int(settings.max_num_seqs))
        self.backlog = backlog(self.capacity, settings.batch_max_requests)
        log.info("engine capacity: %d analyses at once (max_num_seqs %d; cache %s); claims up to %d more",
                 self.capacity, settings.max_num_seqs, self.memory or "not readable", self.backlog)
        self.stream = EngineStream(host, self._store, capacity=self.capacity, fair_wait_s=settings.stream_fair_wait_s,
                                   deadline_s=settings.gpu_batch_deadline_s)
        # As many results as the engine holds requests: past that (the database away) the
        # engine thread waits for the writer, as it waited for the database before.
        self.writer = ResultWriter(self._give_up, self.capacity)
        self.flush_s = flush_s
        self.exit_code: int | None = None
        self._drain_s = 0.0
        self._give_up_at = float("inf")
        self._stop = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="vidlora-engine", daemon=True)
        self._after_flush: list = []
        self._registrations: dict | None = None
        self._identity: tuple[Any, dict] = (None, {})
        self.tokens_per_s = 0.0

    # -- the Celery thread ------------------------------------------------------------------
    def take(self, task: Any, analysis_ids: list[int]) -> int:
        """Claim ``analysis_ids`` once the stream has room and hand them to it; the count taken."""
        from celery.exceptions import Reject


        while not self.stream.wait_for_room(len(analysis_ids), timeout=1.0, backlog=self.backlog):
            if self._stopping:
                break
        if self._stopping:
            raise Reject("the GPU worker is stopping", requeue=True)
        held = self.stream.held_keys()
        mine = [i for i in analysis_ids if str(i) in held]
        if mine:
            reclaim(mine, self.worker_name)
        requests = claim(task, [i for i in analysis_ids if str(i) not in held], self.worker_name)
        self.stream.offer(requests)
        return len(requests)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self.writer.start()
        self._thread.start()

    def on_flush(self, callback) -> None:
        """Run ``callback`` from the engine thread every ``flush_s`` (heartbeat, metrics)."""
        self._after_flush.append(callback)

    def begin_stop(self) -> None:
        """The worker is shutting down: claim nothing more (the engine goes on until ``stop``)."""
        self._stopping = True
        self.stream.wake()

    def stop(self, drain_s: float) -> None:
        """Graceful stop: no new work; finish what is in flight within ``drain_s``; give back the rest."""
        self._stopping = True
        self._drain_s = drain_s
        self._give_up_at = time.monotonic() + drain_s + 30.0
        self._stop.set()
        self._thread.join(timeout=drain_s + 60)

    # -- the engine thread ------------------------------------------------------------------
    def _run(self) -> None:
        from engine_patch.guard import EngineReplaceRequired

        last_flush, before = time.monotonic(), self.stream.stats.output_tokens
        try:
            while not self._stop.is_set():
                if not self.stream.step():
                    self.stream.wait_for_work(0.05)
                now = time.monotonic()
                if now - last_flush >= self.flush_s:
                    self.tokens_per_s = (self.stream.stats.output_tokens - before) / (now - last_flush)
                    last_flush, before = now, self.stream.stats.output_tokens
                    self._flush()
            self.stream.drain(self._drain_s)
            self._give_back("the GPU worker stopped before it finished")
        except EngineReplaceRequired as exc:
            log.error("engine must be replaced: %s; giving back %d analyses and exiting", exc, self.stream.held())
            self._give_back(f"engine replaced: {exc}"[:2000])
            self._exit(EXIT_ENGINE_REPLACED)
        except BaseException:  # noqa: BLE001 - a dead engine thread must not leave a live-looking worker
            log.exception("the engine loop died; giving back %d analyses and exiting", self.stream.held())
            self._give_back("the GPU worker's engine loop failed")
            self._exit(1)
        finally:
            self.writer.close()  # every result handed over is stored (or the stop's budget ran out)
            self._flush()

    def _give_back(self, reason: str) -> None:
        requests = self.stream.release()
        if requests:
            _retrying(lambda: release(requests, reason), self._give_up)
            messages.dispatch_ready(countdown=self.settings.dispatch_max_wait_s)

    def _exit(self, code: int) -> None:
        self.exit_code = code
        self._stopping = True
        self._give_up_at = time.monotonic() + 30.0
        os.kill(os.getpid(), signal.SIGTERM)  # Celery's warm shutdown; gpu_worker.run returns the code

    def _give_up(self) -> bool:
        """A finished result is retried until the database answers, except past a stop's
        budget: then the analysis stays RUNNING and is given back when the worker is gone."""
        return self._stopping and time.monotonic() > self._give_up_at

    def _store(self, req: AnalysisRequest, output: AnalysisOutput, mates: tuple[str, ...]) -> None:
        identity = {**self._current_identity(), "engine_batch": [int(k) for k in mates]}
        self.writer.put(output, identity)

    def _current_identity(self) -> dict:
        """host.identity(), recomputed when what it says of the engine changed (a rebuild, a
        quarantine, adapter loads) or every flush: it reads package metadata, too slow per result."""
        h = self.host
        key = (h.rebuilds, tuple(sorted(h.guard.quarantined)), h.adapter_loads, h.adapter_disk_loads,
               int(time.monotonic() // self.flush_s))
        if self._identity[0] != key:
            self._identity = (key, h.identity())
        return self._identity[1]

    def _flush(self) -> None:
        from vidlora.scenarios import record_registrations

        regs = self.host.registrations()
        if regs != self._registrations:
            try:
                with session_scope() as session:
                    record_registrations(session, regs)
                self._registrations = regs
            except TRANSIENT_ERRORS:
                log.warning("could not record adapter registrations; will retry", exc_info=True)
        for callback in self._after_flush:
            try:
                callback()
            except Exception:  # noqa: BLE001 - a metric or heartbeat must not stop the engine
                log.warning("flush callback failed", exc_info=True)

    def status(self) -> dict:
        """What the heartbeat publishes: analyses in flight (total and per adapter), waiting,
        admission wait and tokens/s."""
        s = self.stream.stats
        load = self.host.engine_load()
        return {"mode": "stream", "capacity": self.capacity, "held": self.stream.held(),
                "in_flight": self.stream.in_flight_by_adapter(), "storing": self.writer.pending(),
                # vLLM's own split of what was admitted: in its running batch, or queued inside
                # it (admission sized right keeps the second at 0; null where not readable)
                "engine_running": load[0] if load else None, "engine_waiting": load[1] if load else None,
                "memory": self.memory,
                "admitted": s.admitted, "delivered": s.delivered,
                "mean_admission_wait_s": round(s.admission_wait_s / s.admitted, 3) if s.admitted else None,
                "tokens_per_s": round(self.tokens_per_s, 1)}


class ResultWriter:
    """Stores finished results in a thread of its own, in the order they were handed over,
    each retried while the database is away (``give_up``: past a stop's budget, the analysis
    stays RUNNING and the reconciler gives it back once the worker is gone)."""

    def __init__(self, give_up, max_pending: int) -> None:
        self._give_up = give_up
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, int(max_pending)))
        self._thread = threading.Thread(target=self._run, name="vidlora-results", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, output: AnalysisOutput, identity: dict) -> None:
        """Queue one result; waits while ``max_pending`` are already waiting."""
        self._queue.put((output, identity))

    def pending(self) -> int:
        """Results handed over and not stored yet."""
        return self._queue.unfinished_tasks

    def close(self) -> None:
        """Store everything queued, then end the thread."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                _retrying(lambda: store_or_fail(*item), self._give_up)
            except Exception:  # noqa: BLE001 - given up (stop budget spent): the reconciler takes it back
                log.exception("result for analysis %s not stored", item[0].request_key)
            finally:
                self._queue.task_done()


def _retrying(action, give_up, first_wait_s: float = 0.5, max_wait_s: float = 30.0) -> None:
    """Run ``action`` until the database answers (a restart must not drop a finished result)."""
    wait = first_wait_s
    while True:
        try:
            action()
            return
        except TRANSIENT_ERRORS:
            if give_up():
                raise
            log.warning("database unavailable; retrying in %.1fs", wait, exc_info=True)
            time.sleep(wait)
            reset_engine()
            wait = min(max_wait_s, wait * 2)


def release_abandoned(worker_name: str) -> int:
    """Analyses RUNNING on this worker's name when it starts were held by a process that died
    under the same name (a supervisor restart): they go back to ready, the attempt cap still
    applies at their next claim. So do analyses QUEUED to this name: their message was sent to
    the dead process, which had it unacknowledged (prefetched, or taken from Redis but not yet
    claimed), and Redis hands it back only after its visibility timeout (hours), the reconciler
    only after ``stale_after_s``. If such a message was in fact still waiting in the queue, the
    re-sent one and it both arrive: the first claim runs the analysis, the other is skipped
    (the claim takes only what is still queued or ready). Called before the worker consumes."""
    with session_scope() as session:
        ids = list(session.scalars(select(Analysis.id).where(
            Analysis.status.in_((AnalysisStatus.RUNNING, AnalysisStatus.QUEUED)),
            Analysis.worker == worker_name)))
        if ids:
            session.execute(update(Analysis).where(Analysis.id.in_(ids)).values(
                status=AnalysisStatus.READY, ready_at=utcnow(), worker=None,
                reason="the GPU worker holding it restarted"))
    if ids:
        log.warning("gave back %d analyses held by an earlier %s", len(ids), worker_name)
        messages.dispatch_ready()
    return len(ids)
