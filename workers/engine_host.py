"""One vLLM engine per GPU-worker process, serving every scenario adapter.

``EngineHost`` builds a single ``vllm.LLM`` (LoRA on, one video per prompt, no images) from
``Settings`` once, then runs each batch the dispatcher hands it as one submission, so vLLM
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
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import socket
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from workers.requests import (
    AnalysisOutput,
    AnalysisRequest,
    RequestError,
    build_input,
    chosen_logprobs,
    sampling_params,
)

log = logging.getLogger(__name__)

# On the CPU backend vLLM reads gpu_memory_utilization as "reserve this share of all RAM",
# which fails on a shared machine; use an explicit KV-cache size there instead.
CPU_KV_CACHE_BYTES_DEFAULT = 1 << 30


class EngineHost:
    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.llm: Any = None
        self.tokenizer: Any = None
        self.adapter_loads = 0  # device-slot misses (see module docstring)
        self.adapter_disk_loads = 0  # host-cache misses: adapter read from disk
        self.patch_status = "not applied"
        self.start_seconds: float | None = None
        self._lock = threading.RLock()
        self._lora_ids: dict[str, int] = {}  # adapter name -> stable vLLM lora_int_id
        self._lora_paths: dict[str, str] = {}  # adapter name -> path that id was made for
        self._lora_names: dict[str, str] = {}  # adapter name -> name shown to vLLM
        self._next_lora_id = 1  # vLLM reserves 0 for "no adapter"
        self._slots: OrderedDict[int, None] = OrderedDict()  # mirror of vLLM's device LRU
        self._cpu_cache: OrderedDict[int, None] = OrderedDict()  # mirror of its host LRU
        self._inflight: list[str] = []
        self._last_canary: dict[str, Any] | None = None

    # -- engine ------------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self.llm is not None

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
        }
        if getattr(s, "served_model_name", ""):
            kwargs["served_model_name"] = s.served_model_name
        kv_bytes = getattr(s, "kv_cache_memory_bytes", None)
        if kv_bytes:
            kwargs["kv_cache_memory_bytes"] = int(kv_bytes)
        elif _platform_is_cpu() and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES_DEFAULT
        return kwargs

    def start(self) -> None:
        """Apply engine_patch and build the engine; a second call does nothing."""
        with self._lock:
            if self.llm is not None:
                return
            self.patch_status = _apply_engine_patch()
            from vllm import LLM

            kwargs = self.engine_kwargs()
            log.info("building vLLM engine: %s", kwargs)
            t0 = time.perf_counter()
            self.llm = LLM(**kwargs)
            self.tokenizer = self.llm.get_tokenizer()
            self.start_seconds = time.perf_counter() - t0
            log.info("vLLM engine ready in %.1fs", self.start_seconds)

    # -- adapters ----------------------------------------------------------------------------

    def _resolve_adapter(self, req: AnalysisRequest) -> tuple[str, str] | None:
        if not req.adapter_name and not req.adapter_path:
            return None
        path = req.adapter_path
        if not path:
            root = getattr(self.settings, "adapter_root", None)
            if root is None:
                raise RequestError(f"adapter {req.adapter_name!r} has no path")
            path = str(Path(root) / str(req.adapter_name))
        name = req.adapter_name or Path(path).name
        if not (Path(path) / "adapter_config.json").is_file():
            raise RequestError(f"adapter {name!r}: no adapter_config.json in {path}")
        return name, str(Path(path).resolve())

    def lora_request(self, name: str, path: str):
        """A LoRARequest whose id is stable for the adapter's name.

        A name seen again with a different path gets a new id: vLLM caches weights by id,
        so reusing the old id would keep serving the old weights without a word.
        """
        from vllm.lora.request import LoRARequest

        if self._lora_paths.get(name) != path:
            if name in self._lora_paths:
                log.warning("adapter %s moved from %s to %s: new id", name,
                            self._lora_paths[name], path)
            self._lora_ids[name] = self._next_lora_id
            self._lora_paths[name] = path
            # Names show up in vLLM's logs and metrics; tag only a re-pointed adapter.
            self._lora_names[name] = (f"{name}#{self._next_lora_id}" if name in self._lora_names
                                      else name)
            self._next_lora_id += 1
        return LoRARequest(lora_name=self._lora_names[name], lora_int_id=self._lora_ids[name],
                           lora_path=path)

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
        by_id = {lid: name for name, lid in self._lora_ids.items()}
        return [by_id.get(lid, str(lid)) for lid in self._slots]

    def last_canary(self) -> dict[str, Any] | None:
        """The latest canary result recorded by ``record_canary`` (engine_patch's self-check)."""
        return self._last_canary

    def record_canary(self, result: dict[str, Any]) -> None:
        self._last_canary = dict(result, at=time.time())

    def vllm_lora_state(self) -> dict[str, list[int]] | None:
        """vLLM's own view (active = in device slots, registered = in host cache), when the
        engine runs in this process; ``None`` otherwise."""
        try:
            core = self.llm.llm_engine.engine_core.engine_core
            manager = core.model_executor.driver_worker.worker.model_runner.lora_manager
            am = manager._adapter_manager
            # ``order`` is the LRU order, oldest first (vllm.utils.cache.LRUCache).
            return {"active": list(am._active_adapters.order),
                    "registered": list(am._registered_adapters.order)}
        except AttributeError:
            return None

    def _sync_mirror(self) -> None:
        state = self.vllm_lora_state()
        if state is not None:
            self._slots = OrderedDict((lid, None) for lid in state["active"])
            self._cpu_cache = OrderedDict((lid, None) for lid in state["registered"])

    # -- generation --------------------------------------------------------------------------

    def generate(self, requests: list[AnalysisRequest],
                 deadline_s: float | None = None) -> list[AnalysisOutput]:
        """Run ``requests`` as one engine batch; outputs come back in the same order.

        ``deadline_s`` is a budget in seconds from the call. A request that cannot be built
        (missing frame, bad adapter path) fails alone; the rest still run.
        """
        self.start()
        with self._lock:
            return self._generate(requests, deadline_s)

    def _generate(self, requests: list[AnalysisRequest],
                  deadline_s: float | None) -> list[AnalysisOutput]:
        t0 = time.perf_counter()
        results: list[AnalysisOutput | None] = [None] * len(requests)
        inputs: list[dict[str, Any]] = []
        params: list[Any] = []
        loras: list[Any] = []
        batch_index: list[int] = []  # position in ``requests`` of each submitted input
        for i, req in enumerate(requests):
            try:
                adapter = self._resolve_adapter(req)
                inputs.append(build_input(self.tokenizer, req))
                params.append(sampling_params(req))
                loras.append(self.lora_request(*adapter) if adapter else None)
                batch_index.append(i)
            except RequestError as exc:
                results[i] = AnalysisOutput.failed(req.request_key, str(exc))
        if not inputs:
            return [r for r in results if r is not None]

        order: list[int] = []
        for lr in loras:
            if lr is not None and lr.lora_int_id not in order:
                order.append(lr.lora_int_id)

        self._abort_leftovers()
        engine = self.llm.llm_engine
        try:
            internal_ids = self.llm.enqueue(inputs, params, lora_request=loras, use_tqdm=False)
        except _input_errors() as exc:
            # vLLM validates every input before queueing any; a rejection (prompt longer than
            # max_model_len, a video its processor refuses) is re-tried one by one so only
            # the culprit fails.
            if len(inputs) == 1:
                results[batch_index[0]] = AnalysisOutput.failed(
                    requests[batch_index[0]].request_key, f"rejected by engine: {exc}")
                return [r for r in results if r is not None]
            return self._generate_one_by_one(requests, results, deadline_s, t0)
        self._touch_adapters(order)
        self._inflight = list(internal_ids)
        ext_to_pos = {_external_id(rid): k for k, rid in enumerate(internal_ids)}
        if len(ext_to_pos) != len(internal_ids):
            raise RuntimeError(f"cannot map vLLM request ids {internal_ids}")

        finished: dict[int, tuple[Any, float]] = {}
        deadline = None if deadline_s is None else t0 + float(deadline_s)
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
                results[i] = _to_output(req.request_key, out, latency)
            else:
                reason = (f"deadline of {deadline_s:.0f}s exceeded" if timed_out
                          else "engine returned no output")
                results[i] = AnalysisOutput.failed(
                    req.request_key, reason, latency_s=time.perf_counter() - t0,
                    finish_reason="deadline" if timed_out else "error")
        return [r for r in results if r is not None]

    def _generate_one_by_one(self, requests, results, deadline_s, t0):
        for i, req in enumerate(requests):
            if results[i] is not None:
                continue
            left = None if deadline_s is None else deadline_s - (time.perf_counter() - t0)
            results[i] = self._generate([req], left)[0]
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
            "model_config_sha256": _config_hash(str(s.model)),
            "served_model_name": getattr(s, "served_model_name", "") or str(s.model),
            "vllm_version": _version("vllm"),
            "torch_version": torch.__version__,
            "transformers_version": _version("transformers"),
            "device": _device_name(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "max_loras": int(s.max_loras),
            "max_cpu_loras": max(int(s.max_cpu_loras), int(s.max_loras)),
            "max_lora_rank": int(s.max_lora_rank),
            "max_model_len": int(s.max_model_len),
            "max_num_seqs": int(s.max_num_seqs),
            "enforce_eager": bool(s.enforce_eager),
            "engine_patch": self.patch_status,
            "versions": {
                "vllm": _version("vllm"),
                "torch": torch.__version__,
                "transformers": _version("transformers"),
                "peft": _version("peft"),
            },
            "started": self.started,
            "start_seconds": self.start_seconds,
            "adapter_loads": self.adapter_loads,
            "adapter_disk_loads": self.adapter_disk_loads,
            "in_process_engine": self.started and self.vllm_lora_state() is not None,
        }
        return info


# -- helpers --------------------------------------------------------------------------------


def _input_errors() -> tuple[type[BaseException], ...]:
    # vLLM 0.32's VLLMValidationError (prompt too long...) is not a ValueError.
    errors: list[type[BaseException]] = [ValueError, TypeError]
    try:
        from vllm.exceptions import VLLMClientError

        errors.append(VLLMClientError)
    except ImportError:
        pass
    return tuple(errors)


def _external_id(internal_id: str) -> str:
    # vLLM 0.32 makes internal ids "<external>-<8 random chars>" (InputProcessor
    # .assign_request_id); RequestOutput carries the external one. Without randomisation
    # (VLLM_DISABLE_REQUEST_ID_RANDOMIZATION) they are equal and purely numeric.
    return internal_id.rsplit("-", 1)[0] if "-" in internal_id else internal_id


def _to_output(request_key: str, out: Any, latency: float) -> AnalysisOutput:
    comp = out.outputs[0]
    token_ids = list(comp.token_ids)
    logprobs = chosen_logprobs(token_ids, comp.logprobs)
    finite = all(math.isfinite(x) for x in logprobs) and (
        comp.cumulative_logprob is None or math.isfinite(comp.cumulative_logprob))
    return AnalysisOutput(
        request_key=request_key,
        text=comp.text,
        token_ids=token_ids,
        prompt_tokens=len(out.prompt_token_ids or []),
        output_tokens=len(token_ids),
        latency_s=latency,
        finish_reason=str(comp.finish_reason or "unknown"),
        cumulative_logprob=(None if comp.cumulative_logprob is None
                            else float(comp.cumulative_logprob)),
        logprobs=logprobs,
        error=None,
        health={"logprobs_finite": finite},
    )


def _apply_engine_patch() -> str:
    try:
        import engine_patch  # type: ignore[import-not-found]

        if getattr(engine_patch, "__file__", None) is None:
            # A namespace package: engine_patch/__init__.py was not run. Seen with an
            # editable install made before the package had an __init__.py (the finder then
            # maps it as a namespace outside the repo root): re-run `pip install -e .`.
            log.error("engine_patch imported as a namespace package from %s: its apply() is "
                      "unreachable; re-install the project (pip install -e .)",
                      list(getattr(engine_patch, "__path__", [])))
        apply = engine_patch.apply
    except (ImportError, AttributeError) as exc:
        log.warning("engine_patch not applied (%s); running stock vLLM", exc)
        return f"unavailable: {exc}"
    result = apply()
    log.info("engine_patch applied: %s", result)
    return "applied" if result is None else f"applied: {result}"


def _platform_is_cpu() -> bool:
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # platform detection itself failing means no accelerator either
        return True


def _device_name() -> str:
    try:
        import torch

        if not _platform_is_cpu() and torch.cuda.is_available():
            return f"cuda:{torch.cuda.current_device()} {torch.cuda.get_device_name()}"
    except Exception:
        pass
    import platform

    return f"cpu {platform.processor() or platform.machine()}"


def _version(dist: str) -> str | None:
    from importlib import metadata

    for name in (dist, f"{dist}-cpu"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _config_hash(model: str) -> str | None:
    path = Path(model) / "config.json"
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None
