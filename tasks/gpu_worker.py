"""Start a GPU worker: sync scenarios, build the engine, register, then consume.

The engine is built before Celery starts consuming (not in a worker_process_init hook,
which Celery kills after a few seconds), and the worker runs the solo pool so tasks execute
in this process, next to the engine. In streaming mode (the default) the engine belongs to
one engine thread (``tasks.gpu_stream``) and analysis tasks hand their work to it; on the way
out it drains what is in flight and gives the rest back, and the worker exits 75 when its
engine must be replaced.

Before consuming, the engine passes its start-up checks (engine_patch.startup_checks, after the
adapters are registered): an adapter that fails its own is refused; an engine that fails (and
that no mitigation fixed), or a LoRA kernel self-check that fails, makes the worker refuse to
start: it writes the reason on its heartbeat row (stopped, last canary failed) and exits 78.
"""

from __future__ import annotations

import logging

from tasks.celery_app import GPU_QUEUE, run_worker, worker_queue
from vidlora.config import get_settings
from vidlora.lifecycle import WorkerStatus
from workers import registry, runtime

log = logging.getLogger(__name__)

# EX_CONFIG: this engine on this device must not serve; a restart runs the checks again.
EXIT_STARTUP_REFUSED = 78


def run(loglevel: str = "INFO") -> int:
    from sqlalchemy import select

    from vidlora.admission import request_tokens
    from vidlora.db import session_scope
    from vidlora.models import Scenario
    from vidlora.scenarios import Generation, record_registrations, sync_from_settings
    from engine_patch.selfcheck import SelfCheckError
    from engine_patch.startup_checks import StartupCheckError
    from workers.engine_host import EngineHost

    settings = get_settings()
    name = settings.worker_name or runtime.default_worker_name()
    queue = worker_queue(name)
    with session_scope() as session:
        sync_from_settings(session, settings)
        active = session.execute(select(Scenario.name, Scenario.adapter_path, Scenario.sampling, Scenario.generation)
                                 .where(Scenario.active)).all()
    adapters = {n: path for n, path, *_ in active if path}
    # Building the engine and registering the adapters takes minutes with a large model: the
    # row keeps beating "starting" meanwhile, so no one sees a red "stale" for a worker coming up.
    starting = registry.Heartbeat(name, queue, lambda: {"status": WorkerStatus.STARTING}, settings.heartbeat_s)
    starting.start()
    refusal = None
    try:
        host = EngineHost(settings)
        try:
            host.start()
            # Every scenario's adapter through the one registration path, on this device, before
            # the first batch: a refused one is shown unavailable and its analyses fail with why.
            for scenario, path in sorted(adapters.items()):
                host.register_adapter(scenario, path)
            if settings.startup_checks:
                host.startup_checks()
        except (StartupCheckError, SelfCheckError) as exc:
            refusal = str(exc)
    finally:
        starting.stop(mark=False)
    if refusal is not None:
        # Never serve silently wrong output: say why where status, doctor and the Scenarios
        # page look, then stop.
        log.error("GPU worker %s refuses to start: %s", name, refusal)
        canary = host.last_canary() or {"ok": False, "detail": f"start-up checks: {refusal}",
                                        "reason": f"start-up checks: {refusal}", "step": "startup_checks"}
        registry.upsert(name, queue, status=WorkerStatus.STOPPED, last_canary=canary)
        return EXIT_STARTUP_REFUSED
    with session_scope() as session:
        record_registrations(session, host.registrations())
    runtime.install(host, name)
    stream = None
    if settings.gpu_worker_mode == "stream":
        from tasks.gpu_stream import StreamRunner, release_abandoned

        # The typical analysis: the mean of the scenarios' shapes sizes the running set.
        shapes = [request_tokens(sampling or {}, Generation.of(gen).max_tokens) for _, _, sampling, gen in active]
        stream = StreamRunner(host, settings, name, sum(shapes) // max(1, len(shapes)) if shapes else 1024)
        release_abandoned(name)  # what a predecessor under this name held when it died
        runtime.install_stream(stream)

    def snapshot() -> dict:
        identity = host.identity()
        return {
            "status": WorkerStatus.READY,
            "device": identity.get("device"),
            "versions": identity.get("versions", {}),
            "stream": stream.status() if stream else None,
            "adapters_resident": host.resident_adapters(),
            "adapter_loads": host.adapter_loads,
            "last_canary": host.last_canary(),
        }

    heartbeat = registry.Heartbeat(name, queue, snapshot, settings.heartbeat_s)
    heartbeat.start()
    runtime.on_batch(heartbeat.beat)
    _serve_metrics(host, settings.metrics_port, stream)
    if stream is not None:
        from celery.signals import worker_shutting_down

        stream.on_flush(runtime.after_batch)
        stream.start()
        # A task waiting for room must not hold the shutdown: it hands its message back.
        worker_shutting_down.connect(lambda **_: stream.begin_stop(), weak=False)
    code = 1
    try:
        code = run_worker([
            "worker", "--pool=solo", "--concurrency=1", "--prefetch-multiplier=1",
            "-Q", f"{GPU_QUEUE},{queue}", "-n", f"gpu-{name}@%h", f"--loglevel={loglevel}",
            "--without-gossip", "--without-mingle",
        ])
    finally:
        if stream is not None:
            stream.stop(settings.gpu_drain_s)  # drain in flight, give the rest back
            code = stream.exit_code or code
        heartbeat.stop()
    return code


def _serve_metrics(host, port: int, stream=None) -> None:
    """Registrations now; slot loads, LoRA paths, memory and the stream's gauges after every
    batch (or every flush of the streaming loop); the rest as results are stored."""
    from vidlora import metrics

    for verdict in host.registrations().values():
        metrics.ADAPTER_REGISTRATIONS.labels(str(verdict.get("status", "unknown"))).inc()
    seen = {"loads": host.adapter_loads}

    def after_batch() -> None:
        metrics.ADAPTER_LOADS.inc(max(0, host.adapter_loads - seen["loads"]))
        seen["loads"] = host.adapter_loads
        for path, n in (host.last_lora_paths or {}).items():
            metrics.LORA_PATH.labels(path).inc(max(0, n))
        metrics.record_engine_memory()
        if stream is not None:
            metrics.record_stream(stream.status())

    metrics.record_engine_memory()
    runtime.on_batch(after_batch)
    metrics.serve(port)
