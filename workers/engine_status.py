"""What the engine host reports: the last canary (the worker's heartbeat publishes it), the
engine's cache layout and load (what admission sizes the running batch from), and the
identity (model, versions, settings, adapters) that the worker registry and ``doctor`` show.

A mixin of ``workers.engine_host.EngineHost``.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from engine_patch.env import versions
from vidlora.admission import EngineMemory
from workers.engine_env import config_hash, device_name, dist_version
from workers.engine_memory import engine_load, engine_memory, weights_format


class EngineStatus:
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
