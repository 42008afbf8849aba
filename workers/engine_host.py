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

This module builds the engine and runs it: start and its settings, the guarded batch, and the
stream's one-request-at-a-time calls. ``EngineHost`` takes the rest from its siblings, one
concern each, all on the one object so every caller keeps one host:
``workers.engine_adapters`` (registration, device checks, the LRU mirror),
``workers.engine_startup`` (the start-up checks), ``workers.engine_recovery`` (the guard's view:
judging an output, the recovery steps, the canary) and ``workers.engine_status`` (last canary,
cache layout and load, identity). Below them: ``workers.engine_env`` (the process and device:
engine_patch, the kernel check, memory after a close, versions), ``workers.engine_memory``
(vLLM's cache layout) and ``workers.engine_outputs`` (vLLM outputs read into ``AnalysisOutput``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from functools import cached_property
from typing import Any

from engine_patch.guard import Guard
from engine_patch.moe import lora_off_reason
from engine_patch.registration import Registration, registry_for
from vidlora.config import Settings
from vidlora.engine_io import (
    AnalysisOutput,
    AnalysisRequest,
    RequestError,
    build_input,
    sampling_params,
)
from workers.engine_adapters import EngineAdapters
from workers.engine_env import apply_engine_patch, kernel_check_report, lora_path_counts, platform_is_cpu
from workers.engine_outputs import external_id, finish_output, input_errors, to_output
from workers.engine_recovery import EngineRecovery
from workers.engine_startup import EngineStartupChecks
from workers.engine_status import EngineStatus

log = logging.getLogger(__name__)

# On the CPU backend vLLM reads gpu_memory_utilization as "reserve this share of all RAM",
# which fails on a shared machine; use an explicit KV-cache size there instead.
CPU_KV_CACHE_BYTES_DEFAULT = 1 << 30


class EngineHost(EngineAdapters, EngineStartupChecks, EngineRecovery, EngineStatus):
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

    # -- the guard's view of this engine (engine_patch.guard.GuardedEngine) ------------------

    def run_batch(self, requests: Sequence[AnalysisRequest]) -> list[AnalysisOutput]:
        """One engine batch under the current deadline, unguarded (the guard's primitive)."""
        with self._lock:
            self.start()  # a failed rebuild leaves no engine; build one again
            return self._generate(list(requests))

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

