"""gdn_state_zero without an engine: which runners it hooks, and which blocks it clears.

The engine-level case (a real request handed NaN-poisoned state blocks) is scenario 5 in
test_failures.py.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

import engine_patch
from engine_patch.patches import gdn_state_zero
from engine_patch.patches.base import is_marked


def test_both_model_runners_take_new_requests_through_the_hook():
    """V1 (the CPU runner's base) and V2 (vllm.v1.worker.gpu, the CUDA default since 0.29):
    a patch on V1 alone would not run on the GPU at all."""
    engine_patch.apply()
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner as V1

    assert is_marked(V1._update_states)
    assert is_marked(V2.add_requests)
    assert gdn_state_zero.probe() == "already applied"


def _runner(num_blocks: int = 6):
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    mamba = MambaSpec(block_size=16, shapes=((2, 3), (2, 4)), dtypes=(torch.float32, torch.float32))
    attn = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float32)
    conv, ssm = torch.ones(num_blocks, 2, 3), torch.ones(num_blocks, 2, 4)
    kv = torch.ones(2, num_blocks, 16, 1, 8)
    layers = {"gdn.0": SimpleNamespace(kv_cache=[(conv, ssm)]), "attn.0": SimpleNamespace(kv_cache=[kv])}
    cfg = SimpleNamespace(kv_cache_groups=[SimpleNamespace(kv_cache_spec=attn, layer_names=["attn.0"]),
                                           SimpleNamespace(kv_cache_spec=mamba, layer_names=["gdn.0"])])
    return SimpleNamespace(kv_cache_config=cfg,
                           compilation_config=SimpleNamespace(static_forward_context=layers)), conv, ssm, kv


def test_a_new_requests_state_blocks_are_cleared_and_a_resumed_ones_kept():
    runner, conv, ssm, kv = _runner()
    new = SimpleNamespace(num_computed_tokens=0, block_ids=([1, 2], [3]))
    resumed = SimpleNamespace(num_computed_tokens=32, block_ids=([4], [4]))  # prefix-cache hit
    null_only = SimpleNamespace(num_computed_tokens=0, block_ids=([5], [0]))
    out = SimpleNamespace(scheduled_new_reqs=[new, resumed, null_only])

    assert gdn_state_zero.zero_state_blocks(runner, out) == 1
    for t in (conv, ssm):
        assert torch.equal(t[3], torch.zeros_like(t[3]))
        assert torch.equal(t[[0, 1, 2, 4, 5]], torch.ones_like(t[[0, 1, 2, 4, 5]])), "only block 3"
    assert torch.equal(kv, torch.ones_like(kv)), "attention blocks are vLLM's to zero"


def test_the_hook_clears_before_the_runner_sees_the_step():
    runner, conv, _, _ = _runner()
    seen = []
    hooked = gdn_state_zero._wrap(lambda self, so: seen.append(conv[2].sum().item()) or "orig")
    out = SimpleNamespace(scheduled_new_reqs=[SimpleNamespace(num_computed_tokens=0, block_ids=([], [2]))])
    assert hooked(runner, out) == "orig"
    assert seen == [0.0]
