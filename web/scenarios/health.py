"""Worker health from heartbeat rows: a worker is only as alive as its last heartbeat."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from vidlora.config import get_settings
from vidlora.heartbeats import alive_since
from vidlora.lifecycle import WorkerStatus
from vidlora.models import Worker, as_utc



@dataclass
class WorkerHealth:
    worker: Worker
    age_s: float
    health: str  # ok | starting | stale | stopped

    def as_dict(self) -> dict[str, Any]:
        w = self.worker
        return {
            "name": w.name, "queue": w.queue, "device": w.device, "status": w.status,
            "health": self.health, "heartbeat_at": w.heartbeat_at.isoformat(),
            "heartbeat_age_s": round(self.age_s, 1), "versions": w.versions,
            "adapters_resident": w.adapters_resident, "adapter_loads": w.adapter_loads,
            "last_canary": w.last_canary, "stream": w.stream, "started_at": w.started_at.isoformat(),
        }


def classify(worker: Worker, now: datetime, heartbeat_s: float) -> WorkerHealth:
    age = (now - as_utc(worker.heartbeat_at)).total_seconds()
    if worker.status == WorkerStatus.STOPPED:
        health = "stopped"
    elif as_utc(worker.heartbeat_at) < alive_since(now, heartbeat_s):
        health = "stale"
    elif worker.status == WorkerStatus.READY:
        health = "ok"
    else:
        health = worker.status or WorkerStatus.STARTING
    return WorkerHealth(worker, age, health)


def worker_health(session: Session) -> list[WorkerHealth]:
    now = datetime.now(timezone.utc)
    heartbeat_s = get_settings().heartbeat_s
    workers = session.scalars(select(Worker).order_by(Worker.name)).all()
    return [classify(w, now, heartbeat_s) for w in workers]


def holders(workers: list[WorkerHealth]) -> dict[str, list[WorkerHealth]]:
    """Scenario name -> live workers holding its adapter (adapters_resident lists names)."""
    out: dict[str, list[WorkerHealth]] = {}
    for wh in workers:
        if wh.health in ("stopped", "stale"):
            continue
        for name in wh.worker.adapters_resident or []:
            out.setdefault(str(name), []).append(wh)
    return out
