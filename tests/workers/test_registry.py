"""workers.registry: a GPU worker's heartbeat row. While its engine is being built (minutes
with a large model) the row keeps beating "starting", so the Scenarios page never shows a
worker coming up as a red "stale" (issue 32); a worker that stops beating does go stale."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone

from vidlora.db import session_scope
from vidlora.lifecycle import WorkerStatus
from vidlora.models import Worker
from web.scenarios.health import classify
from workers import registry


def _health(name: str, heartbeat_s: float, later_s: float = 0.0) -> str:
    with session_scope() as session:
        row = session.query(Worker).filter(Worker.name == name).one()
        return classify(row, datetime.now(timezone.utc) + timedelta(seconds=later_s), heartbeat_s).health


def test_a_worker_building_its_engine_reads_starting_not_stale(database):
    name, beat_s = f"starting-{uuid.uuid4().hex[:6]}", 0.2
    starting = registry.Heartbeat(name, f"gpu.{name}", lambda: {"status": WorkerStatus.STARTING}, beat_s)
    starting.start()
    try:
        time.sleep(5 * beat_s)  # longer than the three missed beats that make a row stale
        assert _health(name, beat_s) == "starting"
    finally:
        starting.stop(mark=False)
    with session_scope() as session:
        assert session.query(Worker.status).filter(Worker.name == name).scalar() == WorkerStatus.STARTING
    assert _health(name, beat_s, later_s=5 * beat_s) == "stale"  # no longer beating: gone
