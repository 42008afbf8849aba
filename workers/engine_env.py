"""The process and device an engine lives in: engine_patch applied and the LoRA kernels
checked before the engine is built, what the device is, whether closing an engine freed its
memory, and the versions a result records."""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("workers.engine_host")


def shutdown(llm: Any) -> None:
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001 - a half-dead engine is being replaced anyway
        log.warning("engine shutdown before rebuild failed", exc_info=True)
    try:  # vLLM's own teardown of the process-wide state an in-process engine leaves
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    except Exception:  # noqa: BLE001
        log.debug("cleanup_dist_env_and_memory failed", exc_info=True)


def device_memory_shortfall(utilization: float) -> int:
    """Bytes missing on the current CUDA device for an engine asking ``utilization`` of it
    (0 on CPU, or when enough is free)."""
    try:
        import torch

        if platform_is_cpu() or not torch.cuda.is_available():
            return 0
        free, total = torch.cuda.mem_get_info()
    except Exception:  # noqa: BLE001 - cannot tell: let the build try
        return 0
    return max(0, int(utilization * total) - int(free))


def empty_device_cache() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001
        pass


def apply_engine_patch() -> str:
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


def lora_path_counts() -> dict[str, int]:
    """LoRA module calls in this process by path: engine_patch's dense GEMMs, its all-slots
    form (what CUDA graphs capture, counted at capture), Punica's kernels, or base (a step with
    no token on an adapter: nothing to add). All zero when the dense patch is off or
    engine_patch is absent."""
    try:
        from engine_patch.patches import dense_lora
    except ImportError:
        return {"dense": 0, "all_slots": 0, "punica": 0, "base": 0}
    return dense_lora.counts()


def kernel_check_report(patch_status: str, lora: bool = True) -> dict[str, Any] | None:
    """The LoRA kernels of this device against an fp32 reference, before the engine is built
    (a failure turns engine_patch's mitigations on and checks again; still failing raises
    SelfCheckError and the worker does not start). Skipped when vLLM runs unpatched, and for an
    engine built without LoRA (``lora`` False): it never runs these kernels, so a device where
    they are wrong may still serve the base model."""
    if not lora or not patch_status.startswith("applied") or os.environ.get("VIDLORA_ENGINE_PATCH") == "off":
        return None
    from engine_patch.selfcheck import check_kernels

    t0 = time.perf_counter()
    report = check_kernels()
    log.info("LoRA kernel self-check: %s", report.detail)
    return {"ok": report.ok, "ops": report.ops, "first_attempt_ok": report.first_attempt_ok,
            "mitigations": report.mitigations, "detail": report.detail[:300],
            "seconds": round(time.perf_counter() - t0, 2)}


def platform_is_cpu() -> bool:
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # platform detection itself failing means no accelerator either
        return True


def device_name() -> str:
    try:
        import torch

        if not platform_is_cpu() and torch.cuda.is_available():
            return f"cuda:{torch.cuda.current_device()} {torch.cuda.get_device_name()}"
    except Exception:
        pass
    import platform

    return f"cpu {platform.processor() or platform.machine()}"


@functools.lru_cache(maxsize=None)
def dist_version(dist: str) -> str | None:
    # Cached: the heartbeat and every stored result ask; scanning package metadata under a busy
    # engine thread delayed heartbeats past the liveness window.
    from importlib import metadata

    for name in (dist, f"{dist}-cpu"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def config_hash(model: str) -> str | None:
    path = Path(model) / "config.json"
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None
