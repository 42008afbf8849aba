"""The guard's view of the engine host (engine_patch.guard.GuardedEngine) beside
``run_batch``: how an output is judged and which adapter it is of, and the recovery ladder's
steps (drop the caches, reload an adapter, rebuild the engine) and the canary run after each.

A mixin of ``workers.engine_host.EngineHost``.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

from engine_patch.env import versions
from engine_patch.guard import EngineReplaceRequired, Health, check_output
from engine_patch.probes import canary
from vidlora.engine_io import AnalysisOutput, AnalysisRequest
from workers.engine_env import device_memory_shortfall, empty_device_cache, shutdown


class EngineRecovery:
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
