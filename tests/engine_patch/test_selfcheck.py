"""engine_patch.selfcheck: kernel check on CPU (and a deliberately broken op), adapters, canary."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace as NS

import pytest

from engine_patch import selfcheck
from engine_patch.selfcheck import CanaryResult, SelfCheckError, canary, check_adapters, check_kernels

from tests.support.tiny import REPO, full_adapters, tiny_model

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


class FakeLLM:
    def __init__(self, by_adapter):
        self.by_adapter = by_adapter

    def generate(self, prompts, params, lora_request=None, use_tqdm=False):
        loras = lora_request if isinstance(lora_request, list) else [lora_request] * len(prompts)
        outs = []
        for r in loras:
            toks, lp, text = self.by_adapter[getattr(r, "lora_name", None)]
            outs.append(NS(outputs=[NS(token_ids=toks, logprobs=[{t: NS(logprob=lp)} for t in toks], text=text)]))
        return outs


def test_check_adapters_flags_an_adapter_that_changes_nothing():
    llm = FakeLLM({None: ([1, 2, 3], -0.5, "abc"), "good": ([1, 4, 5], -0.5, "ade"),
                   "noop": ([1, 2, 3], -0.5, "abc"), "nudge": ([1, 2, 3], -0.4, "abc")})
    res = {c.name: c for c in check_adapters(llm, [NS(lora_name=n) for n in ("good", "noop", "nudge")])}
    assert res["good"].ok and res["good"].tokens_differ
    assert not res["noop"].ok and "changes nothing" in res["noop"].detail
    assert res["nudge"].ok and not res["nudge"].tokens_differ


def test_canary_detects_degenerate_output():
    ok = canary(FakeLLM({None: ([5, 6, 7], -0.5, "fine")}))
    assert ok == CanaryResult(True, "ok", [5, 6, 7]) and ok.reason is None
    bad = canary(FakeLLM({None: ([0] * 8, float("nan"), "!!!!!!!!")}))
    assert not bad.ok and "non-finite" in bad.reason


def test_canary_detects_instability():
    class Flaky(FakeLLM):
        n = 0

        def generate(self, *a, **k):
            self.n += 1
            self.by_adapter = {None: ([5, 6, 7 + self.n], -0.5, "x")}
            return super().generate(*a, **k)

    res = canary(Flaky({}))
    assert not res.ok and "unstable" in res.detail


SCRIPT = """
import json, sys
from vllm import LLM
from vllm.lora.request import LoRARequest
from engine_patch import apply, selfcheck
apply()
base, adapters = sys.argv[1], sys.argv[2:]
llm = LLM(base, enable_lora=True, max_lora_rank=8, max_loras=len(adapters), max_model_len=512,
          limit_mm_per_prompt={"image": 0, "video": 0}, dtype="bfloat16", max_num_seqs=8, seed=0,
          enforce_eager=True, kv_cache_memory_bytes=1 << 28)
reqs = [LoRARequest(f"a{i}", i + 1, p) for i, p in enumerate(adapters)]
checks = selfcheck.check_adapters(llm, reqs)
canaries = [selfcheck.canary(llm, r) for r in [None] + reqs]
print("RESULT " + json.dumps({"adapters": [c.ok for c in checks], "canary": [c.ok for c in canaries],
                              "details": [c.detail for c in checks + canaries]}))
"""


@pytest.mark.engine
def test_adapters_and_canary_on_the_tiny_model():
    root = tiny_model()
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(root / "base"), *map(str, full_adapters(root))],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, proc.stderr[-3000:]
    res = json.loads(line[len("RESULT "):])
    assert all(res["adapters"]) and all(res["canary"]), res["details"]
