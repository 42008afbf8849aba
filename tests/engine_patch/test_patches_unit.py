"""Patch internals without an engine: fast."""
from __future__ import annotations

import pytest
import torch

from engine_patch.patches import hopper_expand, kernel_rebind_scan, lora_index_mask, packed_groups, prompt_logprobs


def test_solve_runs_places_missing_leading_member():
    sizes = [128, 128, 256, 256]
    assert packed_groups.solve_runs(sizes, [None, 256]) == [3, 1]
    assert packed_groups.solve_runs(sizes, [512, None]) == [3, 1]
    assert packed_groups.solve_runs(sizes, [512, 256]) == [3, 1]
    assert packed_groups.solve_runs([64] * 4, [None, 64]) == [3, 1]
    with pytest.raises(ValueError):
        packed_groups.solve_runs(sizes, [None, 100])


def test_expand_packed_lora_z_only_leaves_qkv_slices_empty():
    class L:
        output_sizes = [2, 2, 4, 4]
        n_slices = 4

    a_z, b_z = torch.ones(1, 3), torch.arange(4.0).reshape(4, 1)
    a, b = packed_groups.expand_packed_lora(L(), [None, a_z], [None, b_z])
    assert b[:3] == [None, None, None] and torch.equal(b[3], b_z) and a[3] is a_z


def test_masked_ops_skip_minus_one_and_isolate_nan():
    w = torch.zeros(2, 1, 3, 4)
    w[1] = float("nan")  # a poisoned adapter in the LAST slot, which -1 used to alias
    x = torch.ones(3, 4)
    out = torch.zeros(3, 3)
    lora_index_mask.bgmv_shrink(x, w, out, torch.tensor([-1, 0, 1]), 1.0)
    assert torch.equal(out[0], torch.zeros(3)) and torch.equal(out[1], torch.zeros(3))
    assert out[2].isnan().all()
    y = torch.ones(3, 3)
    lora_index_mask.bgmv_expand(torch.ones(3, 4), w, y, torch.tensor([-1, 0, 1]), True)
    assert torch.equal(y[0], torch.ones(3)) and torch.equal(y[1], torch.ones(3))
    y = torch.zeros(3, 6)
    lora_index_mask.bgmv_expand_slice(torch.ones(3, 4), w, y, torch.tensor([-1, -1, 0]), 3, 3, True)
    assert torch.equal(y, torch.zeros(3, 6))


def test_masked_ops_match_upstream_for_valid_indices():
    from vllm.lora.ops.torch_ops import lora_ops

    orig = getattr(lora_ops.bgmv_shrink, "__vidlora_orig__", lora_ops.bgmv_shrink)
    torch.manual_seed(0)
    w, x = torch.randn(3, 1, 8, 16), torch.randn(5, 16)
    idx = torch.tensor([0, 2, 1, 1, 0])
    a, b = torch.zeros(5, 8), torch.zeros(5, 8)
    orig(x, w, a, idx, 0.5)
    lora_index_mask.bgmv_shrink(x, w, b, idx, 0.5)
    assert torch.equal(a, b)


def test_logits_delta_uses_each_rows_adapter():
    torch.manual_seed(0)
    a, b = torch.randn(2, 1, 4, 8), torch.randn(2, 1, 10, 4)
    x, y = torch.randn(3, 8), torch.zeros(3, 10)
    prompt_logprobs.logits_delta(y, x, a, b, 2.0, torch.tensor([1, -1, 0]))
    assert torch.allclose(y[0], (x[0] @ a[1, 0].T * 2) @ b[1, 0].T, atol=1e-5)
    assert torch.equal(y[1], torch.zeros(10))
    assert torch.allclose(y[2], (x[2] @ a[0, 0].T * 2) @ b[0, 0].T, atol=1e-5)


def test_hopper_clamp_and_cpu_noop():
    cfg = hopper_expand.clamp_config({"block_m": 64, "block_n": 128, "num_stages": 3})
    assert cfg["num_stages"] == 1 and cfg["block_n"] == 32 and cfg["block_m"] == 64
    if not torch.cuda.is_available():
        assert hopper_expand.probe() is not None  # never active on CPU


def test_apply_is_idempotent_and_reports_names():
    import engine_patch

    first = engine_patch.apply()
    assert {"lora_index_mask", "packed_groups", "prompt_logprobs"} <= set(first)
    assert engine_patch.apply() == first


def test_packed_groups_probe_reads_a_0_26_crash_as_needed(monkeypatch):
    """vLLM 0.26's expand_packed_lora dereferences a missing member ('NoneType' object has no
    attribute 'shape'); the probe must say "needed", not crash or skip (seen on the H200)."""
    import importlib

    cls = importlib.import_module(packed_groups._CLS_PATH).MergedColumnParallelLinearWithLoRA

    def upstream_0_26(self, lora_a, lora_b):
        return lora_a, [b.shape for b in lora_b]

    monkeypatch.setattr(cls, "expand_packed_lora", upstream_0_26)
    assert packed_groups.probe() is None


def test_only_measured_vllm_builds_are_claimed():
    import engine_patch

    claimed, why = engine_patch.support((0, 26, 0), "cuda")
    assert claimed and "h200_adapters.md" in why
    # Inside the probes' range is not enough: an unmeasured release says so, in words.
    claimed, why = engine_patch.support((0, 30, 0), "cuda")
    assert not claimed and "has not been measured" in why and "support-matrix" in why
    # 0.34: the probes are written against it, nothing of it is measured.
    claimed, why = engine_patch.support((0, 34, 0), "cuda")
    assert not claimed and "inside the range" in why
    claimed, why = engine_patch.support((0, 40, 0), "cuda")
    assert not claimed and "outside" in why
    # The CPU build the tests run is its own row.
    assert engine_patch.support((0, 32, 0), "cpu")[0]


def _dispatcher_0_34():
    """A module holding vLLM 0.34's scan (`triton_utils/dispatcher.py` `_rebind_impls`, its
    namespace walk verbatim): `vars(value)` guarded for TypeError only."""
    import sys
    import types

    def _rebind_impls(replacements):
        by_original = {original: replacement for original, replacement in replacements}

        def lookup(value):
            for original in by_original:
                if value is original:
                    return by_original[original]
            return None

        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not namespace:
                continue
            for attr, value in list(namespace.items()):
                replacement = lookup(value)
                if replacement is not None:
                    setattr(module, attr, replacement)
                    continue
                try:
                    instance_dict = vars(value)
                except TypeError:
                    instance_dict = None
                replacement = lookup(instance_dict.get("kernel")) if isinstance(instance_dict, dict) else None
                if replacement is None:
                    continue
                value.kernel = replacement

    mod = types.ModuleType("dispatcher_0_34")
    mod._rebind_impls = _rebind_impls
    return mod


def test_kernel_rebind_scan_knows_the_0_34_scan_and_makes_it_survive_flask(monkeypatch):
    """0.34 renamed the scan to `_rebind_impls` and reads `vars(value)`, which an unbound Flask
    proxy answers with RuntimeError: the probe must find it and the patch must hold."""
    import flask  # noqa: F401 - puts `current_app` (an unbound LocalProxy) into sys.modules

    dispatcher = _dispatcher_0_34()
    monkeypatch.setattr(kernel_rebind_scan, "_target", lambda: dispatcher)
    with pytest.raises(RuntimeError, match="application context"):
        dispatcher._rebind_impls([])
    assert kernel_rebind_scan.probe() is None
    kernel_rebind_scan.apply()
    dispatcher._rebind_impls([])  # no RuntimeError now
    assert kernel_rebind_scan.probe() == "already applied"
    import flask as again

    assert again.current_app is not None  # hidden for the scan only, then put back
