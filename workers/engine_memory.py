"""What the engine's cache holds and what runs in it, read from vLLM itself.

Admission (``vidlora.admission``) decides from plain values; this module is where they come
from. vLLM lays out its cache at start-up from the memory the weights leave: KV blocks for the
attention layers and, on a Gated-DeltaNet hybrid, one recurrent-state block per request in each
GDN group, all from one pool. The layout lives in the engine core (``kv_cache_config``): read
in this process when the engine runs here (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, how the
worker runs it), else from the model runner over vLLM's ``collective_rpc``.
"""
from __future__ import annotations

import logging
from typing import Any

from vidlora.admission import CacheGroup, EngineMemory

log = logging.getLogger(__name__)


def engine_memory(llm: Any) -> EngineMemory | None:
    """The engine's cache layout, or None where this vLLM does not expose it."""
    core = in_process_core(llm)
    config = getattr(getattr(core, "scheduler", None), "kv_cache_config", None)
    try:
        if config is not None:
            layout = describe(config)
        else:
            layout = llm.collective_rpc(_runner_layout)[0]
        if not layout:
            return None
        return EngineMemory(num_blocks=int(layout["num_blocks"]), block_bytes=int(layout["block_bytes"]),
                            groups=tuple(CacheGroup(**g) for g in layout["groups"]),
                            max_num_seqs=int(llm.llm_engine.vllm_config.scheduler_config.max_num_seqs))
    except Exception:  # noqa: BLE001 - private structures; admission falls back to the sequence cap
        log.warning("could not read the engine's cache layout; admitting up to max_num_seqs", exc_info=True)
        return None


def engine_load(llm: Any) -> tuple[int, int] | None:
    """(running, waiting) inside vLLM's scheduler, where the engine runs in this process."""
    scheduler = getattr(in_process_core(llm), "scheduler", None)
    try:
        return len(scheduler.running), len(scheduler.waiting)
    except (AttributeError, TypeError):
        return None


def in_process_core(llm: Any) -> Any:
    """vLLM's engine core when it runs in this process; None otherwise."""
    return getattr(getattr(getattr(llm, "llm_engine", None), "engine_core", None), "engine_core", None)


def describe(config: Any) -> dict[str, Any]:
    """A ``KVCacheConfig`` as plain values: the pool's blocks, the bytes of one block id (one
    page in each layer of the largest group: vLLM pads groups to one size) and the groups."""
    groups = []
    for g in config.kv_cache_groups:
        spec = g.kv_cache_spec
        is_state = "mamba" in type(spec).__name__.lower() or hasattr(spec, "mamba_cache_mode")
        if is_state and getattr(spec, "mamba_cache_mode", "none") not in (None, "none"):
            raise ValueError(f"state cache mode {spec.mamba_cache_mode!r}: blocks per request vary")
        groups.append({"kind": "state" if is_state else "attention", "block_tokens": int(spec.block_size),
                       "layers": len(g.layer_names)})
    page = max(int(g.kv_cache_spec.page_size_bytes) for g in config.kv_cache_groups)
    per_block = page * max(len(g.layer_names) for g in config.kv_cache_groups)
    return {"num_blocks": int(config.num_blocks), "block_bytes": per_block, "groups": groups}


def _runner_layout(worker: Any) -> dict[str, Any] | None:
    """Run in vLLM's worker process (``collective_rpc``): its model runner's layout."""
    runner = getattr(worker, "model_runner", None)
    config = getattr(runner, "kv_cache_config", None)
    return describe(config) if config is not None else None


def weights_format(llm: Any) -> str:
    """How the engine holds the model's weights: its quantization ("fp8": online, or as the
    checkpoint was published), else its dtype ("bfloat16")."""
    try:
        model_config = llm.llm_engine.vllm_config.model_config
        return str(model_config.quantization or str(model_config.dtype).replace("torch.", ""))
    except AttributeError:
        return "unknown"
