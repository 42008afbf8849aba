"""One vLLM engine per GPU-worker process, serving every scenario adapter.

``EngineHost`` builds a single ``vllm.LLM`` (LoRA on, one video per prompt, no images) from
``Settings`` once, then runs each engine batch the dispatch task sends it as one submission, so vLLM
batches requests of different adapters together (up to ``max_loras`` adapters at a time).

Why the batch is not a bare ``llm.generate`` call: the GPU worker runs Celery's solo pool,
which has no task time limit, so the host keeps its own per-batch deadline. ``generate``
does exactly what ``LLM.generate`` does (``LLM.enqueue`` the whole batch, then step the
engine until it drains) but checks the clock between engine steps and aborts what is left
when the deadline passes. That also gives each request its own finish time.

Adapter loads: vLLM keeps ``max_loras`` adapters in device slots (LRU) and up to
``max_cpu_loras`` in host memory (LRU). ``adapter_loads`` counts device-slot misses and
``adapter_disk_loads`` host-cache misses (adapter read from disk), from a mirror of both LRUs
driven by each batch's adapters. A mirror, not vLLM's own manager, because with the default
multiprocess engine the manager lives in another process. The miss count of a batch does not
depend on the order vLLM touches its adapters in, so it is exact whenever a batch holds at
most ``max_loras`` distinct adapters (the dispatcher's contract; above that vLLM swaps
adapters inside the batch and the count is a lower bound). Which adapter a later miss
evicts does depend on that order, and vLLM walks a ``set`` of LoRARequests hashed by name
(per-process random string hashing), so for adapters that shared a batch the mirror's victim
may differ from vLLM's. When the engine runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) the mirror is re-synced from vLLM's manager after
every batch (``vllm_lora_state()``), which removes that ambiguity.

Adapters: every adapter a request names goes through ``register_adapter`` (the one adapter
path, engine_patch.registration, plus this device's checks) before the batch runs; a refused
one fails its requests with the reason and never reaches an engine step.

The run-time guard: ``generate`` hands the batch to ``engine_patch.guard.Guard``, which
calls back into this host through its ``GuardedEngine`` protocol (``run_batch`` is the
deadline-aware enqueue + step loop above; ``check``, ``adapter_of``, ``same_output``, ``reset_prefix_cache``,
``reload_adapter``, ``rebuild_engine``, ``canary``). So every output passes the guard,
poisoned batch-mates are re-run alone, the recovery ladder and quarantine act on this
engine, and every returned ``AnalysisOutput`` carries ``health`` (a
``vidlora.result_health.ResultHealth`` as a dict) with ``error`` set whenever ``ok`` is false.
A canary runs when the engine is built and after every recovery step; the latest one (plus
the quarantined adapters) is ``last_canary()``, which the worker's heartbeat publishes.

Beside this module: ``workers.engine_env`` (the process and device: engine_patch, the kernel
check, memory after a close, versions) and ``workers.engine_outputs`` (vLLM outputs read into
``AnalysisOutput``).
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Any

from engine_patch.env import versions
from engine_patch.moe import lora_off_reason
from engine_patch.probes import canary, check_adapters
from engine_patch.registration import Registration, registry_for
from engine_patch.startup_checks import StartupCheckError, StartupReport, run_checks
from engine_patch.guard import EngineReplaceRequired, Guard, Health, check_output
from vidlora.admission import EngineMemory
from vidlora.config import Settings
from vidlora.engine_io import (
    AnalysisOutput,
    AnalysisRequest,
    RequestError,
    build_input,
    sampling_params,
)
from workers.engine_env import (
    apply_engine_patch,
    config_hash,
    device_memory_shortfall,
    device_name,
    dist_version,
    empty_device_cache,
    kernel_check_report,
    lora_path_counts,
    platform_is_cpu,
    shutdown,
)
from workers.engine_memory import engine_load, engine_memory, in_process_core, weights_format
from workers.engine_outputs import external_id, finish_output, input_errors, to_output

log = logging.getLogger(__name__)

# On the CPU backend vLLM reads gpu_memory_utilization as "reserve this share of all RAM",
# which fails on a shared machine; use an explicit KV-cache size there instead.
CPU_KV_CACHE_BYTES_DEFAULT = 1 << 30


def _not_served(name: str, reg: Registration) -> RequestError:
    """Why a request's adapter is not served: the adapter's refusal, or (stage "server") the
    server's fault, which is judged again at the next registration."""
    if reg.stage == "server":
        return RequestError(f"adapter {name!r} not served now: {reg.reason}")
    return RequestError(f"adapter {name!r} refused: {reg.reason}")


class EngineHost:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.llm: Any = None
        self.tokenizer: Any = None
        self.adapter_loads = 0  # device-slot misses (see module docstring)
        self.adapter_disk_loads = 0  # host-cache misses: adapter read from disk
        self.patch_status = "not applied"
        self.last_lora_paths: dict[str, int] | None = None  # the last batch's LoRA path counts
        self.kernel_check: dict[str, Any] | None = None  # engine_patch.selfcheck at start
        self.startup_report: dict[str, Any] | None = None  # engine_patch.startup_checks, after registration
        self.start_seconds: float | None = None
        self._lock = threading.RLock()
        self.adapters = registry_for(settings)  # the one adapter path (engine_patch.registration)
        self._registered: dict[str, Registration] = {}  # adapter name -> its current verdict
        self._device_verdicts: dict[str, Registration] = {}  # digest -> verdict on this engine
        self._lora_ids: dict[str, int] = {}  # content digest -> vLLM lora_int_id
        self._lora_names: dict[int, str] = {}  # lora_int_id -> name shown to vLLM
        self._id_adapter: dict[int, str] = {}  # lora_int_id -> adapter (scenario) name
        self._next_lora_id = 1  # vLLM reserves 0 for "no adapter"
        self._slots: OrderedDict[int, None] = OrderedDict()  # mirror of vLLM's device LRU
        self._cpu_cache: OrderedDict[int, None] = OrderedDict()  # mirror of its host LRU
        self._inflight: list[str] = []
        self._last_canary: dict[str, Any] | None = None
        self._deadline: float | None = None  # absolute (perf_counter) end of the current batch
        self._budget_s: float | None = None  # that batch's budget, for messages
        self.rebuilds = 0
        self.guard = Guard(self, quarantine_after=settings.guard_quarantine_after)

    # -- engine ------------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self.llm is not None

    @cached_property
    def lora_off_reason(self) -> str | None:
        """Why this engine is built without LoRA (engine_patch.moe: a MoE base on which no
        adapter is verified); None: with LoRA, the usual case. Once per process: it depends on
        the model, vLLM and the device, none of which change under a running worker."""
        return lora_off_reason(self.settings.model)

    def engine_kwargs(self) -> dict[str, Any]:
        s = self.settings
        kwargs: dict[str, Any] = {
            "model": str(s.model),
            "enable_lora": True,
            "max_loras": int(s.max_loras),
            "max_cpu_loras": max(int(s.max_cpu_loras), int(s.max_loras)),
            "max_lora_rank": int(s.max_lora_rank),
            "max_model_len": int(s.max_model_len),
            "max_num_seqs": int(s.max_num_seqs),
            "gpu_memory_utilization": float(s.gpu_memory_utilization),
            "enforce_eager": bool(s.enforce_eager),
            "limit_mm_per_prompt": {"video": 1, "image": 0},
            "structured_outputs_config": {"backend": s.structured_outputs_backend, "disable_any_whitespace": True},
        }
        if self.lora_off_reason:
            for key in ("max_loras", "max_cpu_loras", "max_lora_rank"):
                del kwargs[key]
            kwargs["enable_lora"] = False
        if s.max_num_batched_tokens:
            kwargs["max_num_batched_tokens"] = int(s.max_num_batched_tokens)
        if s.quantization:
            kwargs["quantization"] = s.quantization
        if s.kv_cache_dtype != "auto":
            kwargs["kv_cache_dtype"] = s.kv_cache_dtype
        if s.gdn_state_dtype != "auto":
            kwargs["mamba_ssm_cache_dtype"] = s.gdn_state_dtype
        if s.load_format != "auto":
            kwargs["load_format"] = s.load_format
        if s.gdn_prefill_backend:
            kwargs["gdn_prefill_backend"] = s.gdn_prefill_backend
        if s.served_model_name:
            kwargs["served_model_name"] = s.served_model_name
        if s.kv_cache_memory_bytes:
            kwargs["kv_cache_memory_bytes"] = int(s.kv_cache_memory_bytes)
        elif platform_is_cpu() and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES_DEFAULT
        return kwargs

    def start(self) -> None:
        """Apply engine_patch, build the engine and run the start canary; a second call
        does nothing."""
        with self._lock:
            if self.llm is not None:
                return
            self.patch_status = apply_engine_patch()
            self.kernel_check = kernel_check_report(self.patch_status, lora=not self.lora_off_reason)
            self._build_engine()
            health = self.canary(None, "start")
            if not health.ok:
                # Keep serving: the guard judges every output anyway, and the failed canary
                # is on the worker's heartbeat row for the operator.
                self.guard.note("start_canary_failed", reason=health.reason)

    def _build_engine(self) -> None:
        from vllm import LLM

        kwargs = self.engine_kwargs()
        if not kwargs["enable_lora"]:
            log.warning("building the engine without LoRA: %s", self.lora_off_reason)
        log.info("building vLLM engine: %s", kwargs)
        t0 = time.perf_counter()
        self.llm = LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.start_seconds = time.perf_counter() - t0
        log.info("vLLM engine ready in %.1fs", self.start_seconds)

    # -- start-up checks (engine_patch.startup_checks) -----------------------------------------

    def startup_checks(self) -> dict[str, Any]:
        """The start-up checks through this engine, once, after the adapters are registered
        and before the first batch (engine_patch.startup_checks says what each catches).

        - An adapter whose long-prompt canary fails (the base model's passing) is refused:
          its verdict becomes a refusal at stage "startup", as any refused adapter is shown.
        - An engine-level failure (mixed-adapter decode, the no-adapter request co-batched,
          the base model's long canary) on an engine with CUDA graphs: rebuilt with
          ``enforce_eager`` and checked again, since graph replay is the failing part in the
          reports (SGLang #28371) and eager has no graphs to replay. Still failing, already
          eager, or not rebuildable in this process: ``StartupCheckError`` (the worker
          refuses to start), with the reason on the last canary the heartbeat publishes.

        Returns the report (also ``startup_report``; its summary rides on ``last_canary()``).
        """
        with self._lock:
            self.start()
            report = self._startup_round()
            mitigation = None
            if not report.ok and not self.settings.enforce_eager:
                first = report.engine_failure
                log.warning("start-up checks failed with CUDA graphs (%s): rebuilding the engine eager", first)
                self.guard.note("startup_check_failed", reason=first, mitigation="enforce_eager")
                self.settings = self.settings.model_copy(update={"enforce_eager": True})
                try:
                    self.rebuild_engine()
                except EngineReplaceRequired as exc:
                    self._record_startup(report, None)
                    raise self._refuse(f"{first}; the fallback without CUDA graphs needs a fresh process "
                                       f"({exc}): set VIDLORA_ENFORCE_EAGER=true") from exc
                report = self._startup_round()
                mitigation = f"enforce_eager: with CUDA graphs, {first}"
            self._record_startup(report, mitigation)
            if not report.ok:
                raise self._refuse(report.engine_failure or "failed")
            if mitigation:
                log.warning("start-up checks pass without CUDA graphs: serving eager (%s)", mitigation)
            return self.startup_report

    def _startup_round(self) -> StartupReport:
        # Highest rank first, then by name: the long canaries' sample (startup_checks docstring).
        accepted = sorted((r for r in self._registered.values() if r.ok), key=lambda r: (-(r.rank or 0), r.name))
        adapters = {r.name: self._lora_for(r) for r in accepted}
        report = run_checks(self.llm, adapters, max_loras=int(self.settings.max_loras))
        self._touch_adapters([lr.lora_int_id for lr in adapters.values()][: int(self.settings.max_loras)])
        self._sync_mirror()
        for name, why in report.refused.items():
            digest = self._registered[name].digest
            for other, reg in list(self._registered.items()):  # every scenario serving these weights
                if reg.digest == digest:
                    self._registered[other] = reg.refuse(f"start-up check: {why}", "startup")
            self._device_verdicts[digest] = self._registered[name]
            self._forget_lora(digest)
        return report

    def _record_startup(self, report: StartupReport, mitigation: str | None) -> None:
        self.startup_report = dict(report.as_dict(), mitigation=mitigation)

    def _refuse(self, why: str) -> StartupCheckError:
        """The error the worker refuses to start with; the reason goes on the last canary,
        which the worker publishes on its heartbeat row before it exits."""
        self.guard.note("startup_refused", reason=why)
        text = f"start-up checks: {why}"
        self.record_canary({"ok": False, "detail": text, "reason": text, "adapter": None, "step": "startup_checks",
                            "tokens": [], "versions": versions()})
        return StartupCheckError(f"this engine must not serve: {why}")

    # -- adapters ----------------------------------------------------------------------------
    # Every adapter reaches vLLM through engine_patch.registration (the one adapter path):
    # normalised and checked on the host, then checked on this device (vLLM loads it, it
    # changes the output vs the base model, its canary is healthy). A refused adapter never
    # reaches a batch: its requests fail with the reason, and the engine never raises or
    # rebuilds for it. Adapters are identified by the content hash of their normalised
    # weights, so one rewritten in place is a new adapter with a new vLLM id.

    def _resolve_adapter(self, req: AnalysisRequest) -> tuple[str, str] | None:
        if not req.adapter_name and not req.adapter_path:
            return None
        path = req.adapter_path
        if not path:
            root = self.settings.adapter_root
            if root is None:
                raise RequestError(f"adapter {req.adapter_name!r} has no path")
            path = str(Path(root) / str(req.adapter_name))
        name = req.adapter_name or Path(path).name
        return name, os.path.abspath(path)  # links are judged by the registry, not followed here

    def register_adapter(self, name: str, source: str) -> Registration:
        """The verdict on adapter ``name`` at ``source``: host checks, then device checks
        (once per content digest and engine). Refusals are kept and shown, never raised."""
        with self._lock:
            reg = self.adapters.register(name, source)
            if reg.ok and self.llm is not None:
                reg = self._device_check(reg)
            prev = self._registered.get(name)
            if prev is not None and prev.digest != reg.digest:
                log.warning("adapter %s changed (%s -> %s): registered anew", name, prev.digest, reg.digest)
                self.guard.release(name)  # a new adapter version starts with a clean record
            self._registered[name] = reg
            return reg

    def registrations(self) -> dict[str, dict[str, Any]]:
        """Adapter name -> its latest verdict as plain values (heartbeat, identity, doctor)."""
        return {name: reg.as_dict() for name, reg in sorted(self._registered.items())}

    def _device_check(self, reg: Registration) -> Registration:
        cached = self._device_verdicts.get(reg.digest)
        if cached is not None:
            return replace(cached, name=reg.name, source=reg.source)
        lora = self._lora_for(reg)
        try:
            # vLLM's own load, outside any batch: its errors are the adapter's, not a step's.
            self.llm.llm_engine.add_lora(lora)
            self._touch_adapters([lora.lora_int_id])
            checks, refusal = self._judge_adapter(lora)
        except Exception as exc:  # noqa: BLE001 - whatever vLLM raises refuses this adapter only
            log.warning("adapter %s: device check raised", reg.name, exc_info=True)
            verdict = reg.refuse(f"vLLM could not serve it: {type(exc).__name__}: {exc}"[:600], "device")
        else:
            verdict = (reg.refuse(refusal, "device", **checks) if refusal
                       else replace(reg, stage="device", checks=checks))
        finally:
            self._sync_mirror()
        if not verdict.ok:
            self._forget_lora(reg.digest)
        self._device_verdicts[reg.digest] = verdict
        return verdict

    def _judge_adapter(self, lora) -> tuple[dict[str, Any], str | None]:
        """The loaded adapter against the base model on this engine (it must change the output)
        and its canary (the output must be sane): the checks to record, and the reason to
        refuse it (None: serve it)."""
        if self.settings.load_format == "dummy":
            # Noise weights: the base's logprobs barely move under an adapter and its greedy
            # text repeats, so neither check can tell a good adapter from a bad one here.
            return {"device_checks": "skipped: dummy weights (load_format)"}, None
        [change] = check_adapters(self.llm, [lora])
        checks = {"max_logprob_change": round(change.max_logprob_change, 4),
                  "tokens_differ": change.tokens_differ}
        if not change.ok:
            return checks, f"{change.detail} vs the base model on this engine"
        sane = canary(self.llm, lora)
        if not sane.ok:
            return checks, f"canary with the adapter: {sane.detail}"
        return {**checks, "canary_tokens": list(sane.tokens)[:8]}, None

    def lora_request(self, name: str, path: str):
        """The LoRARequest adapter ``name`` at ``path`` is served with; RequestError with the
        registration's reason if it is refused."""
        reg = self.register_adapter(name, path)
        if not reg.ok:
            raise _not_served(name, reg)
        return self._lora_for(reg)

    def _lora_for(self, reg: Registration):
        from vllm.lora.request import LoRARequest

        if reg.digest not in self._lora_ids:
            self._new_lora_id(reg.digest, reg.name)
        lid = self._lora_ids[reg.digest]
        return LoRARequest(lora_name=self._lora_names[lid], lora_int_id=lid, lora_path=str(reg.path))

    def _new_lora_id(self, digest: str, name: str) -> None:
        # vLLM tells LoRARequests apart by name in places (sets of requests), so each id gets
        # its own; names show up in vLLM's logs and metrics, so only a reload is tagged.
        lid = self._next_lora_id
        self._next_lora_id += 1
        self._lora_names[lid] = name if name not in self._id_adapter.values() else f"{name}#{lid}"
        self._lora_ids[digest] = lid
        self._id_adapter[lid] = name

    def _forget_lora(self, digest: str | None) -> None:
        lid = self._lora_ids.pop(digest, None) if digest else None
        if lid is None:
            return
        try:
            self.llm.llm_engine.remove_lora(lid)
        except Exception:  # noqa: BLE001 - not loaded, or already gone
            pass
        self._slots.pop(lid, None)
        self._cpu_cache.pop(lid, None)

    def _current_lora(self, name: str | None):
        """The LoRARequest ``name`` is served with now (None: the base model)."""
        if name is None:
            return None
        reg = self._registered.get(name)
        if reg is None:
            root = self.settings.adapter_root
            return self.lora_request(name, str((Path(root or ".") / name).resolve()))
        if not reg.ok:
            raise _not_served(name, reg)
        return self._lora_for(reg)

    def _touch_adapters(self, lora_ids: list[int]) -> None:
        max_loras = int(self.settings.max_loras)
        max_cpu = max(int(self.settings.max_cpu_loras), max_loras)
        for lid in lora_ids:
            if lid in self._cpu_cache:
                self._cpu_cache.move_to_end(lid)
            else:
                self.adapter_disk_loads += 1
                self._cpu_cache[lid] = None
                while len(self._cpu_cache) > max_cpu:
                    evicted, _ = self._cpu_cache.popitem(last=False)
                    self._slots.pop(evicted, None)  # vLLM drops it from its slot too
            if lid in self._slots:
                self._slots.move_to_end(lid)
            else:
                self.adapter_loads += 1
                self._slots[lid] = None
                while len(self._slots) > max_loras:
                    self._slots.popitem(last=False)

    def loaded_adapters(self) -> list[int]:
        """Adapter ids the mirror believes occupy device slots, oldest first."""
        return list(self._slots)

    def resident_adapters(self) -> list[str]:
        """Adapter names the mirror believes occupy device slots, oldest first."""
        return [self._id_adapter.get(lid, str(lid)) for lid in self._slots]

    def last_canary(self) -> dict[str, Any] | None:
        """The latest canary result recorded by ``record_canary``, with the adapters the
        guard has quarantined (adapter -> why); the worker heartbeat publishes it."""
        if self._last_canary is None:
            return None
        out = dict(self._last_canary, quarantined=dict(self.guard.quarantined))
        if self.startup_report is not None:
            r = self.startup_report
            out["startup_checks"] = {k: r.get(k) for k in ("ok", "detail", "seconds", "mitigation", "refused")}
        return out

    def record_canary(self, result: dict[str, Any]) -> None:
        self._last_canary = dict(result, at=time.time())

    def vllm_lora_state(self) -> dict[str, list[int]] | None:
        """vLLM's own view (active = in device slots, registered = in host cache), when the
        engine runs in this process; ``None`` otherwise."""
        core = self._in_process_core()
        try:
            manager = core.model_executor.driver_worker.worker.model_runner.lora_manager
            am = manager._adapter_manager
            # ``order`` is the LRU order, oldest first (vllm.utils.cache.LRUCache).
            return {"active": list(am._active_adapters.order),
                    "registered": list(am._registered_adapters.order)}
        except AttributeError:
            return None

    def _in_process_core(self) -> Any:
        """vLLM's engine core when it runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``);
        None when it runs in another process (or no engine is built)."""
        return in_process_core(self.llm)

    def _sync_mirror(self) -> None:
        state = self.vllm_lora_state()
        if state is not None:
            self._slots = OrderedDict((lid, None) for lid in state["active"])
            self._cpu_cache = OrderedDict((lid, None) for lid in state["registered"])

    # -- generation --------------------------------------------------------------------------

    def generate(self, requests: list[AnalysisRequest],
                 deadline_s: float | None = None) -> list[AnalysisOutput]:
        """Run ``requests`` as one guarded engine batch; outputs come back in the same order.

        ``deadline_s`` is a budget in seconds from the call, shared by the guard's re-runs.
        A request that cannot be built (missing frame, bad adapter path) fails alone; the
        rest still run. Every output has ``health`` (module docstring); ``error`` is set
        whenever ``health["ok"]`` is false.
        """
        self.start()
        with self._lock:
            self._register_batch(requests)
            self._budget_s = deadline_s
            self._deadline = None if deadline_s is None else time.perf_counter() + float(deadline_s)
            paths_before = lora_path_counts()
            try:
                judged = self.guard.generate(requests)
            finally:
                self._deadline = self._budget_s = None
                self.last_lora_paths = self._paths_since(paths_before)
            return [finish_output(req, out, verdict, self.tokenizer) for req, (out, verdict) in zip(requests, judged)]

    def _paths_since(self, before: dict[str, int]) -> dict[str, int] | None:
        """LoRA module applications of the last batch by path (engine_patch.dense_lora): dense
        GEMMs or Punica. None when the engine runs in another process, where they are counted."""
        if self.vllm_lora_state() is None:
            return None
        now = lora_path_counts()
        return {path: n - before.get(path, 0) for path, n in now.items()}

    def _register_batch(self, requests: Sequence[AnalysisRequest]) -> None:
        # Before the guard runs the batch: a changed adapter is registered anew (and its
        # quarantine lifted) and a refused one is known, so neither reaches an engine step.
        for req in requests:
            try:
                resolved = self._resolve_adapter(req)
            except RequestError:
                continue
            if resolved:
                self.register_adapter(*resolved)

    # -- streaming: one request at a time into the running engine (workers.engine_stream) ----
    # Only the stream's thread calls these, and only with the engine in this process.

    def adapter_ready(self, req: AnalysisRequest) -> bool:
        """Whether ``req`` can be submitted without running the engine for it: its adapter
        already has its verdict on this engine (a first device check runs generations, which
        must not happen while other requests are in flight)."""
        try:
            resolved = self._resolve_adapter(req)
        except RequestError:
            return True  # fails at submit, without the engine
        if not resolved:
            return True
        reg = self.adapters.register(*resolved)
        return not reg.ok or reg.digest in self._device_verdicts

    def register_request_adapter(self, req: AnalysisRequest) -> Registration | None:
        """Register ``req``'s adapter (host and device checks); None for the base model or a
        request whose adapter cannot be resolved (it fails at submit)."""
        try:
            resolved = self._resolve_adapter(req)
        except RequestError:
            return None
        return self.register_adapter(*resolved) if resolved else None

    def prepare(self, req: AnalysisRequest) -> tuple[dict[str, Any], Any] | None:
        """``req``'s engine input and sampling parameters: its frames read, its prompt rendered.
        Safe from any thread (it touches no engine state and takes no lock), so the stream
        prepares a request where it is offered, and the engine thread, which the GPU waits on
        between steps, spends its time on vLLM's part only. None where the engine is not built
        yet or the request cannot be built: ``submit`` builds it then, and says why it fails."""
        tokenizer = self.tokenizer
        if tokenizer is None:
            return None
        try:
            return build_input(tokenizer, req), sampling_params(req)
        except RequestError:
            return None

    def submit(self, req: AnalysisRequest, prepared: tuple[dict[str, Any], Any] | None = None) -> str:
        """Enqueue ``req`` into the running engine; its engine (internal) request id.
        ``prepared``: what ``prepare`` made of it. A request that cannot be built, has a refused
        adapter or is rejected by vLLM raises ``RequestError`` and never reaches an engine step."""
        with self._lock:
            self.start()
            adapter = self._resolve_adapter(req)
            lora = self.lora_request(*adapter) if adapter else None
            engine_input, param = prepared or (build_input(self.tokenizer, req), sampling_params(req))
            try:
                [rid] = self.llm.enqueue([engine_input], [param], lora_request=[lora], use_tqdm=False)
            except input_errors() as exc:
                raise RequestError(f"rejected by engine: {exc}") from exc
            if lora is not None:
                self._touch_adapters([lora.lora_int_id])
            return rid

    def step(self) -> list[Any]:
        """One engine step: the vLLM RequestOutputs that finished in it."""
        with self._lock:
            finished = [out for out in self.llm.llm_engine.step() if out.finished]
            self._sync_mirror()
            return finished

    def abort(self, engine_ids: Sequence[str]) -> None:
        """Stop requests in flight (their deadline passed, or the worker stops); drains what
        the engine still reports for them."""
        if not engine_ids:
            return
        with self._lock:
            self.llm.llm_engine.abort_request(list(engine_ids), internal=True)

    def engine_memory(self) -> EngineMemory | None:
        """The engine's cache layout (KV and GDN-state blocks), read from vLLM: what admission
        sizes the running batch from (``vidlora.admission.EngineMemory``)."""
        return engine_memory(self.llm) if self.llm is not None else None

    def weights_format(self) -> str:
        """"fp8" (online or published so), else the weights' dtype."""
        return weights_format(self.llm)

    def engine_load(self) -> tuple[int, int] | None:
        """(running, waiting) inside vLLM's scheduler, where the engine runs in this process."""
        return engine_load(self.llm)

    # -- the guard's view of this engine (engine_patch.guard.GuardedEngine) ------------------

    def run_batch(self, requests: Sequence[AnalysisRequest]) -> list[AnalysisOutput]:
        """One engine batch under the current deadline, unguarded (the guard's primitive)."""
        with self._lock:
            self.start()  # a failed rebuild leaves no engine; build one again
            return self._generate(list(requests))

    def check(self, output: AnalysisOutput) -> Health | None:
        if output.error is not None:
            return None  # not a generation: the error speaks for itself
        return check_output(output.token_ids, output.logprobs, output.text,
                            cumulative_logprob=output.cumulative_logprob, repetition=not output.structured)

    def adapter_of(self, request: AnalysisRequest) -> str | None:
        if request.adapter_name:
            return request.adapter_name
        return Path(request.adapter_path).name if request.adapter_path else None

    def same_output(self, a: AnalysisOutput, b: AnalysisOutput) -> bool:
        return list(a.token_ids) == list(b.token_ids)

    def reset_prefix_cache(self) -> None:
        """Drop every cached block and cached encoder/multimodal output (recovery step 1)."""
        with self._lock:
            self.llm.reset_prefix_cache()
            for reset in (getattr(self.llm, "reset_mm_cache", None),
                          getattr(self.llm.llm_engine, "reset_encoder_cache", None)):
                if callable(reset):
                    reset()

    def reload_adapter(self, name: str) -> None:
        """Drop the adapter's weights from vLLM and give it a fresh id (recovery step 2):
        the next request with it reads the normalised adapter from disk again."""
        with self._lock:
            reg = self._registered.get(name)
            if reg is None or reg.digest not in self._lora_ids:
                return  # never loaded here: nothing cached to drop
            self._forget_lora(reg.digest)
            self._new_lora_id(reg.digest, name)

    def rebuild_engine(self) -> None:
        """Shut the engine down and build a new one (recovery step 3).

        Only where closing the engine really freed its device memory: otherwise (seen with
        vLLM 0.26 on the H200) a second engine cannot start in this process, and the host
        raises ``EngineReplaceRequired`` so the worker gives its work back and exits for its
        supervisor to start a fresh process. ``engine_rebuild="replace"`` always does that.
        """
        with self._lock:
            if self.settings.engine_rebuild == "replace":
                raise EngineReplaceRequired("engine_rebuild=replace: a fresh worker process rebuilds the engine")
            old, self.llm, self.tokenizer = self.llm, None, None
            self._inflight = []
            self._slots.clear()
            self._cpu_cache.clear()
            shutdown(old)
            del old
            gc.collect()
            empty_device_cache()
            short = device_memory_shortfall(float(self.settings.gpu_memory_utilization))
            if short:
                raise EngineReplaceRequired(f"closing the engine left {short / 2**30:.1f} GiB of device memory "
                                            "in use: a new engine cannot start in this process")
            self._build_engine()
            self.rebuilds += 1

    def canary(self, adapter: str | None = None, step: str = "manual") -> Health:
        """Run the canary on ``adapter`` (None: the base model), record it, judge it."""
        with self._lock:
            if self.llm is None:
                raise RuntimeError("no engine to run the canary on")
            lora = self._current_lora(adapter)
            t0 = time.perf_counter()
            result = canary(self.llm, lora)
            if lora is not None:
                self._touch_adapters([lora.lora_int_id])
            self._sync_mirror()
            ok, detail, tokens = result.ok, result.detail, [int(t) for t in result.tokens][:16]
            self.record_canary({"ok": ok, "detail": detail, "adapter": adapter, "step": step,
                                "tokens": tokens, "latency_s": round(time.perf_counter() - t0, 3),
                                "versions": versions()})
            return Health(ok, None if ok else f"canary: {detail}", {"canary_tokens": tokens})

    def _generate(self, requests: list[AnalysisRequest]) -> list[AnalysisOutput]:
        t0 = time.perf_counter()
        deadline_s, deadline = self._budget_s, self._deadline
        results: list[AnalysisOutput | None] = [None] * len(requests)
        inputs: list[dict[str, Any]] = []
        params: list[Any] = []
        loras: list[Any] = []
        batch_index: list[int] = []  # position in ``requests`` of each submitted input
        for i, req in enumerate(requests):
            try:
                adapter = self._resolve_adapter(req)
                lora = self.lora_request(*adapter) if adapter else None
                engine_input, param = build_input(self.tokenizer, req), sampling_params(req)
            except RequestError as exc:
                results[i] = AnalysisOutput.failed(req.request_key, str(exc))
                continue
            inputs.append(engine_input)
            params.append(param)
            loras.append(lora)
            batch_index.append(i)
        if not inputs:
            return [r for r in results if r is not None]

        order: list[int] = []
        for lr in loras:
            if lr is not None and lr.lora_int_id not in order:
                order.append(lr.lora_int_id)
        # Submitted sorted by adapter (base requests first), so each engine step's tokens form
        # as few adapter runs as possible: engine_patch's dense LoRA path takes steps of few runs.
        run_of = {lid: k for k, lid in enumerate(order)}
        perm = sorted(range(len(inputs)), key=lambda k: -1 if loras[k] is None else run_of[loras[k].lora_int_id])
        inputs, params, loras, batch_index = ([seq[k] for k in perm] for seq in (inputs, params, loras, batch_index))

        self._abort_leftovers()
        engine = self.llm.llm_engine
        try:
            internal_ids = self.llm.enqueue(inputs, params, lora_request=loras, use_tqdm=False)
        except input_errors() as exc:
            # vLLM validates every input before queueing any; a rejection (prompt longer than
            # max_model_len, a video its processor refuses) is re-tried one by one so only
            # the culprit fails.
            if len(inputs) == 1:
                results[batch_index[0]] = AnalysisOutput.failed(
                    requests[batch_index[0]].request_key, f"rejected by engine: {exc}")
                return [r for r in results if r is not None]
            return self._generate_one_by_one(requests, results)
        self._touch_adapters(order)
        self._inflight = list(internal_ids)
        ext_to_pos = {external_id(rid): k for k, rid in enumerate(internal_ids)}
        if len(ext_to_pos) != len(internal_ids):
            raise RuntimeError(f"cannot map vLLM request ids {internal_ids}")

        finished: dict[int, tuple[Any, float]] = {}
        timed_out = False
        try:
            while engine.has_unfinished_requests():
                if deadline is not None and time.perf_counter() > deadline:
                    timed_out = True
                    left = [rid for k, rid in enumerate(internal_ids) if k not in finished]
                    engine.abort_request(left, internal=True)
                    # Drain whatever the engine still reports (normally nothing).
                    while engine.has_unfinished_requests():
                        engine.step()
                    break
                for out in engine.step():
                    if out.finished:
                        k = ext_to_pos.get(out.request_id)
                        if k is not None:
                            finished[k] = (out, time.perf_counter() - t0)
            self._inflight = []
        except BaseException:
            # Leave nothing queued for the next batch to run (and mis-attribute); if this
            # abort fails too, _abort_leftovers retries before the next batch.
            left = [rid for k, rid in enumerate(internal_ids) if k not in finished]
            try:
                engine.abort_request(left, internal=True)
                self._inflight = []
            except Exception:  # noqa: BLE001 - the original error is the one to raise
                log.exception("could not abort the failed batch's requests")
            raise
        finally:
            self._sync_mirror()

        for k, i in enumerate(batch_index):
            req = requests[i]
            if k in finished:
                out, latency = finished[k]
                results[i] = replace(to_output(req.request_key, out, latency),
                                     structured=req.output_schema is not None)
            else:
                reason = (f"deadline of {deadline_s:.0f}s exceeded" if timed_out
                          else "engine returned no output")
                results[i] = AnalysisOutput.failed(
                    req.request_key, reason, latency_s=time.perf_counter() - t0,
                    finish_reason="deadline" if timed_out else "error")
        return [r for r in results if r is not None]

    def _generate_one_by_one(self, requests, results):
        for i, req in enumerate(requests):
            if results[i] is None:
                results[i] = self._generate([req])[0]
        return [r for r in results if r is not None]

    def _abort_leftovers(self) -> None:
        # A batch interrupted by an exception can leave requests queued; they must not run
        # (and be mis-attributed) inside the next batch.
        engine = self.llm.llm_engine
        if self._inflight:
            engine.abort_request(self._inflight, internal=True)
            self._inflight = []
        if engine.has_unfinished_requests():
            # Someone used self.llm directly; let that work finish rather than abort it.
            log.warning("engine busy before a batch; draining %d request(s)",
                        engine.get_num_unfinished_requests())
            while engine.has_unfinished_requests():
                engine.step()

    # -- identity ----------------------------------------------------------------------------

    def identity(self) -> dict[str, Any]:
        import torch

        s = self.settings
        info: dict[str, Any] = {
            "model": str(s.model),
            "model_config_sha256": config_hash(str(s.model)),
            "served_model_name": s.served_model_name or str(s.model),
            "vllm_version": dist_version("vllm"),
            "torch_version": torch.__version__,
            "transformers_version": dist_version("transformers"),
            "device": device_name(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "max_loras": int(s.max_loras),
            "max_cpu_loras": max(int(s.max_cpu_loras), int(s.max_loras)),
            "max_lora_rank": int(s.max_lora_rank),
            "max_model_len": int(s.max_model_len),
            "max_num_seqs": int(s.max_num_seqs),
            "enforce_eager": bool(s.enforce_eager),
            "lora_off": self.lora_off_reason,
            "engine_patch": self.patch_status,
            "kernel_check": self.kernel_check,
            "startup_checks": self.startup_report,
            "versions": {
                "vllm": dist_version("vllm"),
                "torch": torch.__version__,
                "transformers": dist_version("transformers"),
                "peft": dist_version("peft"),
                "triton": versions().get("triton"),
                "ptxas": versions().get("ptxas"),
            },
            "quarantined": dict(self.guard.quarantined),
            "engine_rebuilds": self.rebuilds,
            "started": self.started,
            "start_seconds": self.start_seconds,
            "adapter_loads": self.adapter_loads,
            "adapter_disk_loads": self.adapter_disk_loads,
            "lora_path": self.last_lora_paths,
            "in_process_engine": self._in_process_core() is not None,
            "adapters": {name: {"ok": r["ok"], "digest": r["digest"], "reason": r["reason"]}
                         for name, r in self.registrations().items()},
        }
        return info
