"""Prometheus metrics: what an operator alerts on (docs/operations.md has the dashboard and
the alert rules).

Two kinds:
- **Events**, counted where they happen: analyses finished by scenario and status, upload-to-
  result and engine seconds (histograms), prompt and output tokens, guard verdicts and
  recovery steps, adapter registrations and slot loads, decode CPU-seconds per video, engine
  memory. The GPU worker and the CPU worker serve them on ``VIDLORA_METRICS_PORT``. The CPU
  worker's prefork children write them to ``PROMETHEUS_MULTIPROC_DIR`` (set by ``vidlora
  worker cpu`` before anything imports prometheus_client), and the parent serves their sum.
- **State**, read when scraped (the web app's ``/metrics``): queue depth per Celery queue,
  analyses by status per scenario, GPU workers by status. Read from Redis and PostgreSQL, so
  every web replica reports the same truth and nothing is double counted.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Seconds: from a few seconds on a warm GPU to an hour behind a long queue.
LATENCY_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200)
ENGINE_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)
DECODE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)

ANALYSES_FINISHED = Counter("vidlora_analyses_finished_total", "Analyses the GPU workers finished",
                            ["scenario", "status"])
ANALYSIS_SECONDS = Histogram("vidlora_analysis_seconds", "Upload-to-result time of stored results",
                             ["scenario"], buckets=LATENCY_BUCKETS)
ENGINE_SECONDS = Histogram("vidlora_engine_seconds", "Engine time of stored results", ["scenario"],
                           buckets=ENGINE_BUCKETS)
TOKENS = Counter("vidlora_tokens_total", "Prompt and output tokens of stored results", ["scenario", "kind"])
GUARD_VERDICTS = Counter("vidlora_guard_verdicts_total", "The engine guard's verdict per output",
                         ["verdict", "reason"])
RECOVERY_STEPS = Counter("vidlora_recovery_steps_total", "Recovery steps the guard ran", ["step"])
ADAPTER_LOADS = Counter("vidlora_adapter_loads_total", "Adapters loaded into a device slot (slot misses)")
LORA_PATH = Counter("vidlora_lora_module_calls_total",
                    "LoRA module calls on a GPU worker by path (engine_patch.dense_lora): dense GEMMs, "
                    "punica kernels, or base (no token of the step on an adapter)",
                    ["path"])
ADAPTER_REGISTRATIONS = Counter("vidlora_adapter_registrations_total",
                                "Adapter registrations on a GPU worker by verdict", ["status"])
DECODE_CPU_SECONDS = Histogram("vidlora_decode_cpu_seconds", "CPU seconds to probe and sample one video",
                               buckets=DECODE_BUCKETS)
ENGINE_MEMORY = Gauge("vidlora_engine_memory_bytes", "Memory held by the GPU worker's engine", ["kind"],
                      multiprocess_mode="max")

STREAM_IN_FLIGHT = Gauge("vidlora_stream_in_flight", "Analyses in flight on a GPU worker's engine, by adapter",
                         ["adapter"], multiprocess_mode="max")
STREAM_ENGINE_RUNNING = Gauge("vidlora_stream_engine_running", "Analyses in vLLM's running batch on a GPU worker",
                              multiprocess_mode="max")
STREAM_ENGINE_WAITING = Gauge("vidlora_stream_engine_waiting",
                              "Analyses admitted to a GPU worker's engine that vLLM keeps waiting (its cache is full)",
                              multiprocess_mode="max")
STREAM_HELD = Gauge("vidlora_stream_held", "Analyses a streaming GPU worker holds (waiting, in flight, judged)",
                    multiprocess_mode="max")
STREAM_ADMISSION_WAIT = Gauge("vidlora_stream_admission_wait_seconds",
                              "Mean wait from claim to engine admission on a streaming GPU worker",
                              multiprocess_mode="max")
STREAM_TOKENS = Gauge("vidlora_stream_output_tokens_per_second", "Output tokens per second of a GPU worker's engine",
                      multiprocess_mode="max")


def record_stream(status: dict) -> None:
    """A streaming GPU worker's gauges (tasks.gpu_stream.StreamRunner.status)."""
    STREAM_IN_FLIGHT.clear()
    for adapter, n in (status.get("in_flight") or {}).items():
        STREAM_IN_FLIGHT.labels(adapter).set(n)
    STREAM_HELD.set(status.get("held") or 0)
    STREAM_ENGINE_RUNNING.set(status.get("engine_running") or 0)
    STREAM_ENGINE_WAITING.set(status.get("engine_waiting") or 0)
    STREAM_ADMISSION_WAIT.set(status.get("mean_admission_wait_s") or 0.0)
    STREAM_TOKENS.set(status.get("tokens_per_s") or 0.0)


def observe_result(scenario: str, status: str, total_s: float | None = None, engine_s: float | None = None,
                   prompt_tokens: int = 0, output_tokens: int = 0, health: dict | None = None) -> None:
    """One analysis finished on a GPU worker (stored, or failed with a reason)."""
    ANALYSES_FINISHED.labels(scenario, status).inc()
    if total_s is not None:
        ANALYSIS_SECONDS.labels(scenario).observe(max(0.0, total_s))
    if engine_s is not None:
        ENGINE_SECONDS.labels(scenario).observe(max(0.0, engine_s))
    if prompt_tokens:
        TOKENS.labels(scenario, "prompt").inc(prompt_tokens)
    if output_tokens:
        TOKENS.labels(scenario, "output").inc(output_tokens)
    if health is not None:
        ok = bool(health.get("ok"))
        GUARD_VERDICTS.labels("healthy" if ok else "unhealthy", "" if ok else _reason(health.get("reason"))).inc()
        for step in health.get("recovery") or []:
            RECOVERY_STEPS.labels(str(step)[:64]).inc()


def _reason(text: str | None) -> str:
    # A label must stay low-cardinality: the reason's kind, not its numbers.
    return (text or "unknown").split(":")[0].split("(")[0].strip()[:64]


@contextmanager
def decode_cpu() -> Iterator[None]:
    """Count the CPU seconds of this block, probe and decode processes included."""
    from vidlora.media.decode_server import cpu_seconds

    start = cpu_seconds()
    try:
        yield
    finally:
        DECODE_CPU_SECONDS.observe(cpu_seconds() - start)


def record_engine_memory() -> None:
    """The GPU worker's memory: device memory when torch sees a GPU, and the process RSS."""
    try:
        import torch

        if torch.cuda.is_available():
            ENGINE_MEMORY.labels("device_allocated").set(torch.cuda.memory_allocated())
            ENGINE_MEMORY.labels("device_reserved").set(torch.cuda.memory_reserved())
    except Exception:  # noqa: BLE001  (no torch here: the RSS still tells)
        pass
    with open("/proc/self/statm") as fh:
        ENGINE_MEMORY.labels("rss").set(int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))


def event_registry() -> CollectorRegistry:
    """The event metrics of this process, or of every process sharing the multiprocess dir."""
    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry
    from prometheus_client import REGISTRY

    return REGISTRY


def serve(port: int) -> None:
    """Serve this process's (or its children's) event metrics on ``port`` (0: off)."""
    if port:
        from prometheus_client import start_http_server

        start_http_server(port, registry=event_registry())


class StateCollector:
    """Queue depth, analyses by status per scenario, workers by status: read at scrape time."""

    def __init__(self, session_factory, redis_client=None, queues: tuple[str, ...] = (), gpu_prefix: str = "gpu"):
        self.session_factory, self.redis, self.queues, self.gpu_prefix = session_factory, redis_client, queues, gpu_prefix

    def collect(self):
        from sqlalchemy import func, select

        from vidlora.models import Analysis, Scenario, Worker

        analyses = GaugeMetricFamily("vidlora_analyses", "Analyses by scenario and status", labels=["scenario", "status"])
        workers = GaugeMetricFamily("vidlora_workers", "GPU workers by status", labels=["status"])
        with self.session_factory() as session:
            for scenario, status, n in session.execute(
                    select(Scenario.name, Analysis.status, func.count()).join(Scenario, Scenario.id == Analysis.scenario_id)
                    .group_by(Scenario.name, Analysis.status)):
                analyses.add_metric([scenario, status], n)
            for status, n in session.execute(select(Worker.status, func.count()).group_by(Worker.status)):
                workers.add_metric([status], n)
        yield analyses
        yield workers
        if self.redis is not None:
            queues = GaugeMetricFamily("vidlora_queue_depth", "Messages waiting per Celery queue", labels=["queue"])
            for name, depth in queue_depths(self.redis, self.queues, self.gpu_prefix).items():
                queues.add_metric([name], depth)
            yield queues


def queue_depths(redis_client, queues: tuple[str, ...], gpu_prefix: str = "gpu") -> dict[str, int]:
    """Celery's Redis transport keeps a queue as a list named after it (priorities as
    suffixed lists): the named queues, and every GPU worker's own queue found by prefix."""
    names = set(queues)
    names |= {k.decode() if isinstance(k, bytes) else k for k in redis_client.scan_iter(match=f"{gpu_prefix}*", count=500)
              if redis_client.type(k) in (b"list", "list")}
    depths: dict[str, int] = {}
    for name in names:
        base = name.split("\x06\x16")[0]
        depths[base] = depths.get(base, 0) + int(redis_client.llen(name))
    return depths


def scrape(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
