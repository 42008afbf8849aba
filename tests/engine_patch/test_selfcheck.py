"""engine_patch.selfcheck: the kernel check on CPU, and a deliberately broken op caught."""
from __future__ import annotations

import os

import pytest

from engine_patch.selfcheck import SelfCheckError, check_kernels

_OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice", "sgmv_shrink", "sgmv_expand", "sgmv_expand_slice")
SMALL = (1, 127, 128, 129, 512)


@pytest.fixture
def ops(monkeypatch):
    """punica_cpu with every op name snapshotted: what a check patches is undone after the test."""
    import importlib

    mods = [importlib.import_module(m) for m in ("vllm.lora.ops.torch_ops.lora_ops", "vllm.lora.ops.torch_ops",
                                                  "vllm.lora.punica_wrapper.punica_cpu")]
    for m in mods:
        for name in _OPS:
            if hasattr(m, name):
                monkeypatch.setattr(m, name, getattr(m, name))
    monkeypatch.setenv("VIDLORA_HOPPER_EXPAND", os.environ.get("VIDLORA_HOPPER_EXPAND", "auto"))
    return mods[2]


def test_kernels_pass_on_cpu(ops):
    rep = check_kernels(token_counts=SMALL + (2048,))
    assert rep.ok and rep.ops == "torch" and rep.device == "cpu", rep.detail
    assert [c.tokens for c in rep.cases] == list(SMALL + (2048,))
    assert all(c.finite and c.no_lora_rows_exact and c.max_err <= c.bound for c in rep.cases)
    # vLLM's CPU ops alias "no adapter" (-1) to the last slot; the check sees it and mitigates.
    assert rep.first_attempt_ok or "lora_index_mask" in rep.mitigations


def test_broken_expand_is_caught(ops, monkeypatch):
    orig = ops.sgmv_expand_slice

    def nan_from_128(inputs, lora_b, out, *args):  # the Hopper failure, mimicked: NaN at >= 128 tokens
        orig(inputs, lora_b, out, *args)
        if inputs.shape[0] >= 128:
            out[inputs.shape[0] // 2, 0] = float("nan")

    monkeypatch.setattr(ops, "sgmv_expand_slice", nan_from_128)
    rep = check_kernels(mitigate=False, token_counts=SMALL)
    assert not rep.ok
    assert {c.tokens: c.ok for c in rep.cases}[127] in (True, False)  # 127 is judged on its own merits
    assert [c.tokens for c in rep.cases if not c.finite] == [128, 129, 512]
    with pytest.raises(SelfCheckError, match="disagree with the fp32 reference"):
        check_kernels(mitigate=True, token_counts=SMALL)


def test_wrong_scale_is_caught(ops, monkeypatch):
    orig = ops.sgmv_shrink
    monkeypatch.setattr(ops, "sgmv_shrink", lambda x, w, y, *a: orig(x, w, y, *a[:-1], a[-1] * 1.1))
    rep = check_kernels(mitigate=False, token_counts=(127, 128))
    assert not rep.ok and all(c.finite and c.max_err > c.bound for c in rep.cases)
