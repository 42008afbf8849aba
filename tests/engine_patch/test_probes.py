"""engine_patch.probes: an adapter that changes nothing is flagged; the canary catches
degenerate and unstable output; both pass on the tiny model with its real adapters."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace as NS

import pytest

from engine_patch.probes import CANARY_TOKENS, CanaryResult, canary, check_adapters

from tests.support.tiny import REPO, full_adapters, tiny_model


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
from engine_patch import apply, probes
apply()
base, adapters = sys.argv[1], sys.argv[2:]
llm = LLM(base, enable_lora=True, max_lora_rank=8, max_loras=len(adapters), max_model_len=512,
          limit_mm_per_prompt={"image": 0, "video": 0}, dtype="bfloat16", max_num_seqs=8, seed=0,
          enforce_eager=True, kv_cache_memory_bytes=1 << 28)
reqs = [LoRARequest(f"a{i}", i + 1, p) for i, p in enumerate(adapters)]
checks = probes.check_adapters(llm, reqs)
canaries = [probes.canary(llm, r) for r in [None] + reqs]
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


def test_canary_runs_a_few_greedy_tokens_on_the_adapter_asked_for():
    class LLM:
        def __init__(self, tokens, lp):
            self.tokens, self.lp, self.calls = tokens, lp, []

        def generate(self, prompts, params, lora_request=None, use_tqdm=False):
            self.calls.append((prompts, params.max_tokens, params.temperature, lora_request))
            lps = [{t: NS(logprob=self.lp)} for t in self.tokens]
            return [NS(outputs=[NS(token_ids=self.tokens, logprobs=lps, text="x",
                                   cumulative_logprob=self.lp * len(self.tokens))])]

    good = LLM([5, 6, 7, 8], -0.5)
    result = canary(good, "lora")
    assert result.ok and result.tokens == [5, 6, 7, 8]
    assert good.calls[0][1:] == (CANARY_TOKENS, 0, ["lora"]) and len(good.calls) == 2  # two runs, compared
    bad = canary(LLM([0] * 8, float("nan")), None)
    assert not bad.ok and "non-finite logprobs" in bad.detail
