"""Zero reused linear-attention (GDN/Mamba) state blocks (#56524).

The scheduler's zeroing queue (`new_block_ids_to_zero`, 0.30+) records only
AttentionSpec blocks (`SingleTypeKVCacheManager._record_new_block_ids`), and the
runners' `_zero_block_ids` skip Mamba layers. A state block handed to a new request
can therefore hold a previous tenant's conv/recurrent state; a kernel path that reads
it before writing (or a NaN left there) then leaks into the new request.

The patch wraps the step where each runner takes in the scheduler's new requests: the V1
runner's `GPUModelRunner._update_states` (the CPU runner inherits it) and the V2 runner's
`GPUModelRunner.add_requests` (`vllm.v1.worker.gpu`, the CUDA default from 0.29 on; its
`KVBlockZeroer` skips Mamba layers too). For each request that starts from token 0 (new, or
resumed without computed tokens), every block it holds in a MambaSpec group is zeroed in
every layer's state tensors. Requests that resume from a prefix-cache hit keep their (valid)
cached state. Both hooks run before that step's forward pass.
"""
from __future__ import annotations

import importlib
import inspect

import torch

from .base import Patch, is_marked, wraps_marked

# (module, class, method) per model runner; each takes the step's SchedulerOutput.
_HOOKS = (
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_update_states"),  # V1 (and the CPU runner)
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "add_requests"),    # V2
)


def _hooks() -> list[tuple[type, str]]:
    """The runner classes this vLLM has, with the method to wrap on each."""
    found = []
    for mod, cls, meth in _HOOKS:
        try:
            klass = getattr(importlib.import_module(mod), cls)
        except (ImportError, AttributeError):
            continue
        if callable(getattr(klass, meth, None)):
            found.append((klass, meth))
    return found


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
    def take_new_requests(self, scheduler_output, *args, **kwargs):
        zero_state_blocks(self, scheduler_output)
        return orig(self, scheduler_output, *args, **kwargs)

    return take_new_requests


def probe() -> str | None:
    try:
        stm = importlib.import_module("vllm.v1.core.single_type_kv_cache_manager")
        importlib.import_module("vllm.v1.kv_cache_interface").MambaSpec  # noqa: B018
    except (ImportError, AttributeError) as exc:
        return f"layout differs: {exc!r}"
    hooks = _hooks()
    if not hooks:
        return "no model runner with _update_states or add_requests"
    if all(is_marked(getattr(klass, meth)) for klass, meth in hooks):
        return "already applied"
    mamba = getattr(stm, "MambaManager", None)
    if mamba is not None and "zero" in inspect.getsource(mamba).lower():
        return "upstream MambaManager zeroes its blocks"
    return None


def apply() -> None:
    for klass, meth in _hooks():
        fn = getattr(klass, meth)
        if not is_marked(fn):
            setattr(klass, meth, _wrap(fn))


PATCH = Patch(
    name="gdn_state_zero",
    covers="#56524: linear-attention state blocks reused without zeroing",
    probe=probe,
    apply=apply,
)
