"""Zero reused linear-attention (GDN/Mamba) state blocks (#56524).

The scheduler's zeroing queue (`new_block_ids_to_zero`, 0.30+) records only
AttentionSpec blocks (`SingleTypeKVCacheManager._record_new_block_ids`), and the
runners' `_zero_block_ids` skip Mamba layers. A state block handed to a new request
can therefore hold a previous tenant's conv/recurrent state; a kernel path that reads
it before writing (or a NaN left there) then leaks into the new request.

The patch wraps `GPUModelRunner._update_states` (the CPU runner inherits it): for each
request that starts from token 0 (new, or resumed without computed tokens), every
block it holds in a MambaSpec group is zeroed in every layer's state tensors. Requests
that resume from a prefix-cache hit keep their (valid) cached state.
"""
from __future__ import annotations

import importlib
import inspect

import torch

from .base import Patch, is_marked, wraps_marked

_RUNNER = ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")


def _mamba_groups(runner) -> list[tuple[int, list[torch.Tensor]]]:
    cached = getattr(runner, "_vidlora_mamba_groups", None)
    if cached is not None:
        return cached
    from vllm.v1.kv_cache_interface import MambaSpec

    groups = []
    cfg = getattr(runner, "kv_cache_config", None)
    ctx = runner.compilation_config.static_forward_context
    for gid, group in enumerate(getattr(cfg, "kv_cache_groups", []) or []):
        if not isinstance(group.kv_cache_spec, MambaSpec):
            continue
        tensors, seen = [], set()
        for name in group.layer_names:
            kv = getattr(ctx.get(name), "kv_cache", None)
            parts = kv if isinstance(kv, (list, tuple)) else [kv]
            # Some versions keep one entry per virtual engine: flatten one level.
            flat = []
            for p in parts:
                flat.extend(p if isinstance(p, (list, tuple)) else [p])
            for t in flat:
                if isinstance(t, torch.Tensor) and t.data_ptr() not in seen:
                    seen.add(t.data_ptr())
                    tensors.append(t)
        groups.append((gid, tensors))
    if groups:  # kv caches exist only after initialize_kv_cache; cache only then
        runner._vidlora_mamba_groups = groups
    return groups


def zero_state_blocks(runner, scheduler_output) -> int:
    blocks: dict[int, set[int]] = {}
    for req in getattr(scheduler_output, "scheduled_new_reqs", []) or []:
        if getattr(req, "num_computed_tokens", 1) == 0 and req.block_ids:
            for gid, ids in enumerate(req.block_ids):
                blocks.setdefault(gid, set()).update(ids)
    groups = _mamba_groups(runner) if blocks else []
    n = 0
    for gid, tensors in groups:
        ids = sorted(b for b in blocks.get(gid, ()) if b > 0)  # block 0 is the null block
        if not ids:
            continue
        index = torch.tensor(ids, device=tensors[0].device if tensors else "cpu")
        for t in tensors:
            t.index_fill_(0, index.to(t.device), 0)
        n += len(ids)
    return n


def _wrap(orig):
    @wraps_marked(orig)
    def _update_states(self, scheduler_output):
        zero_state_blocks(self, scheduler_output)
        return orig(self, scheduler_output)

    return _update_states


def probe() -> str | None:
    try:
        runner = getattr(importlib.import_module(_RUNNER[0]), _RUNNER[1])
        stm = importlib.import_module("vllm.v1.core.single_type_kv_cache_manager")
        importlib.import_module("vllm.v1.kv_cache_interface").MambaSpec  # noqa: B018
    except (ImportError, AttributeError) as exc:
        return f"layout differs: {exc!r}"
    fn = getattr(runner, "_update_states", None)
    if fn is None:
        return "no GPUModelRunner._update_states"
    if is_marked(fn):
        return "already applied"
    mamba = getattr(stm, "MambaManager", None)
    if mamba is not None and "zero" in inspect.getsource(mamba).lower():
        return "upstream MambaManager zeroes its blocks"
    return None


def apply() -> None:
    runner = getattr(importlib.import_module(_RUNNER[0]), _RUNNER[1])
    runner._update_states = _wrap(runner._update_states)


PATCH = Patch(
    name="gdn_state_zero",
    covers="#56524: linear-attention state blocks reused without zeroing",
    probe=probe,
    apply=apply,
)
