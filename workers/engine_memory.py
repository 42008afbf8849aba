"""What the engine's cache holds and what runs in it, read from vLLM itself.

Admission (``vidlora.admission``) decides from plain values; this module is where they come
from. vLLM lays out its cache at start-up from the memory the weights leave: KV blocks for the
attention layers and, on a Gated-DeltaNet hybrid, one recurrent-state block per request in each
GDN group, all from one pool. The layout lives in the engine core (``kv_cache_config``): read
there when the engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, how the
worker runs it), else rebuilt from what the engine's client knows (``layout_from_config``).
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
        vllm_config = llm.llm_engine.vllm_config
        layout = describe(config) if config is not None else layout_from_config(vllm_config)
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


def layout_from_config(vllm_config: Any) -> dict[str, Any] | None:
    """The layout as vLLM groups it, from what the engine's client knows when the engine core
    runs in another process: the pool's size (sent back at start-up), the attention block size
    it settled on, and the model's layer types. vLLM gives every group as many layers as the
    rarer kind has (the 27B: 16 attention layers, so 48 GDN layers make three groups), and a
    state group one block of max_model_len tokens a request."""
    cache, model = vllm_config.cache_config, vllm_config.model_config
    types = list(getattr(model.hf_text_config, "layer_types", None) or [])
    if not cache.num_gpu_blocks or not types or getattr(cache, "enable_prefix_caching", False):
        return None  # a plain transformer, or a state cache whose blocks vary (prefix caching)
    attention = sum(t == "full_attention" for t in types)
    state = sum(t == "linear_attention" for t in types)
    if attention + state != len(types) or not attention or not state:
        return None
    per_group = min(attention, state)
    groups = ([{"kind": "attention", "block_tokens": int(cache.block_size), "layers": per_group}] * -(-attention // per_group)
              + [{"kind": "state", "block_tokens": int(model.max_model_len), "layers": per_group}] * -(-state // per_group))
    text = model.hf_text_config
    kv_bytes = 1 if str(cache.cache_dtype).startswith("fp8") else model.dtype.itemsize
    page = int(cache.block_size) * 2 * int(text.num_key_value_heads) * int(text.head_dim) * kv_bytes
    return {"num_blocks": int(cache.num_gpu_blocks), "block_bytes": page * per_group, "groups": groups}


def weights_format(llm: Any) -> str:
    """How the engine holds the model's weights: its quantization ("fp8": online, or as the
    checkpoint was published), else its dtype ("bfloat16")."""
    try:
        model_config = llm.llm_engine.vllm_config.model_config
        return str(model_config.quantization or str(model_config.dtype).replace("torch.", ""))
    except AttributeError:
        return "unknown"
