"""Heartbeat rows for GPU workers: device, versions, resident adapters, last canary.

The dispatcher reads them for adapter affinity; the UI, `vidlora status` and `vidlora doctor`
read them to show which worker holds which adapter and whether it is healthy.
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy import select

from vidlora.db import session_scope
from vidlora.lifecycle import WorkerStatus
from vidlora.models import Worker, utcnow

log = logging.getLogger(__name__)


def upsert(name: str, queue: str, **fields) -> None:
    with session_scope() as session:
        row = session.scalar(select(Worker).where(Worker.name == name))
        if row is None:
            row = Worker(name=name, queue=queue)
            session.add(row)
        row.queue = queue
        for key, value in fields.items():
            setattr(row, key, value)
        row.heartbeat_at = utcnow()


def mark_stopped(name: str) -> None:
    with session_scope() as session:
        row = session.scalar(select(Worker).where(Worker.name == name))
        if row is not None:
            row.status = WorkerStatus.STOPPED


class Heartbeat:
    """Refreshes the worker's row every ``interval_s`` from a daemon thread.

    A thread, not a Celery beat: the row must say "alive" while a long batch keeps the
    solo pool busy, and go stale when the process dies.
    """

    def __init__(self, name: str, queue: str, snapshot, interval_s: float):
        self.name, self.queue, self.snapshot, self.interval_s = name, queue, snapshot, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vidlora-heartbeat", daemon=True)

    def beat(self) -> None:
        try:
            upsert(self.name, self.queue, **self.snapshot())
        except Exception:  # the database may be restarting; the next beat will tell
            log.warning("heartbeat for %s failed", self.name, exc_info=True)

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.beat()

    def stop(self, mark: bool = True) -> None:
        """Stop beating; ``mark``: the worker is going away (not only changing what it says)."""
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 5)
        if mark:
            mark_stopped(self.name)
