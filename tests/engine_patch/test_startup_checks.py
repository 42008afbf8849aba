"""engine_patch.startup_checks: who is blamed for what, on a scripted engine (fast).

The checks on the real engine, with defects injected, and the worker's reaction are in
tests/workers/test_engine_host.py (they share that module's engine).
"""
from __future__ import annotations

import json
from types import SimpleNamespace as NS

from engine_patch.startup_checks import (
    LONG_LENGTHS,
    MAX_LONG_ADAPTERS,
    TOL_MAX,
    StartupReport,
    run_checks,
)


class ScriptedLLM:
    """``llm.generate`` as the checks call it; ``bad(lora_name, prompt_len, batch)`` picks
    the requests that come back non-finite or with other tokens."""

    def __init__(self, bad=lambda name, n, batch: None):
        self.bad, self.calls = bad, []

    def get_tokenizer(self):
        return lambda text, add_special_tokens=False: {"input_ids": list(range(300))}

    def reset_prefix_cache(self):
        pass

    def generate(self, prompts, params, lora_request=None, use_tqdm=False):
        loras = list(lora_request)
        self.calls.append([getattr(r, "lora_name", None) for r in loras])
        outs = []
        for p, r in zip(prompts, loras):
            name, n = getattr(r, "lora_name", None), len(p["prompt_token_ids"])
            toks, lp = [5 + k + (hash(name) % 7 if name else 0) for k in range(params.max_tokens)], -0.5
            fault = self.bad(name, n, len(loras))
            if fault == "nan":
                lp = float("nan")
            elif fault == "tokens":
                toks = [t + 1 for t in toks]
            lps = [{t: NS(logprob=lp, rank=1), t + 100: NS(logprob=lp - 2 * TOL_MAX, rank=2)} for t in toks]
            outs.append(NS(outputs=[NS(token_ids=toks, logprobs=lps, text="fine words")]))
        return outs


def adapters(n: int) -> dict:
    return {f"ad{k}": NS(lora_name=f"ad{k}", lora_int_id=k + 1) for k in range(n)}


def test_a_healthy_engine_passes_every_check_within_the_sample():
    llm = ScriptedLLM()
    rep = run_checks(llm, adapters(MAX_LONG_ADAPTERS + 2), max_loras=3)
    assert rep.ok and not rep.refused and all(c.ok for c in rep.checks)
    assert rep.not_checked == [f"ad{k}" for k in (MAX_LONG_ADAPTERS, MAX_LONG_ADAPTERS + 1)]
    canaried = {c.adapter for c in rep.checks if c.check == "long_canary"}
    assert canaried == {None, *(f"ad{k}" for k in range(MAX_LONG_ADAPTERS))}
    # (a): one batch of no adapter, the first max_loras adapters, no adapter.
    assert [None, "ad0", "ad1", "ad2", None] in llm.calls
    assert "adapter(s) outside the long-canary sample" in rep.summary()
    json.dumps(rep.as_dict())


def test_an_adapter_failing_its_long_canary_is_refused_and_left_out_of_the_batches():
    llm = ScriptedLLM(lambda name, n, batch: "nan" if name == "ad1" and n == LONG_LENGTHS[-1] else None)
    rep = run_checks(llm, adapters(3), max_loras=2)
    assert rep.ok and list(rep.refused) == ["ad1"]
    assert rep.refused["ad1"].startswith(f"canary at {LONG_LENGTHS[-1]} prompt tokens: first of two greedy runs: non-finite")
    assert [None, "ad0", "ad2", None] in llm.calls and not any("ad1" in c and len(c) > 1 for c in llm.calls)
    assert "refused ad1 (canary at 450" in rep.summary()


def test_a_base_model_failing_its_long_canary_is_the_engine_not_the_adapters():
    llm = ScriptedLLM(lambda name, n, batch: "nan" if n == LONG_LENGTHS[0] else None)
    rep = run_checks(llm, adapters(2), max_loras=2)
    assert not rep.ok and not rep.refused
    assert rep.engine_failure.startswith(f"base model canary at {LONG_LENGTHS[0]} prompt tokens: first of two greedy runs: non-finite")


def test_a_row_that_changes_in_a_batch_fails_the_engine_with_the_row_named():
    llm = ScriptedLLM(lambda name, n, batch: "tokens" if name is None and batch > 1 else None)
    rep = run_checks(llm, adapters(2), max_loras=2)
    assert not rep.ok and not rep.refused
    assert rep.engine_failure.startswith("mixed-adapter decode: the no-adapter request batched with "
                                         "['no adapter', 'ad0', 'ad1', 'no adapter']: greedy tokens differ "
                                         "from the request alone at token 0")
    [c] = [c for c in rep.checks if c.check == "no_adapter_cobatched"]
    assert not c.ok and c.length == LONG_LENGTHS[-1]


def test_logprobs_moved_beyond_the_bound_fail_even_with_equal_tokens():
    rep = StartupReport()
    assert rep.ok and rep.summary() == "0 of 0 checks passed in 0.0s"

    class Shifted(ScriptedLLM):
        def generate(self, prompts, params, lora_request=None, use_tqdm=False):
            outs = super().generate(prompts, params, lora_request, use_tqdm)
            if len(prompts) > 1:  # batched: every logprob moved by more than TOL_MAX
                for o in outs:
                    o.outputs[0].logprobs = [{t: NS(logprob=v.logprob - 1.5 * TOL_MAX, rank=v.rank)
                                              for t, v in d.items()} for d in o.outputs[0].logprobs]
            return outs

    rep = run_checks(Shifted(), adapters(1), max_loras=1)
    assert not rep.ok and "logprobs differ from the request alone" in rep.engine_failure
