from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from engine_patch.guard import Guard, Health, QuarantinedError, check_output


@pytest.mark.parametrize("tokens,lps,text,ok", [
    ([5, 6, 7], [-0.1, -0.2, -0.3], "a b c", True),
    ([5, 6, 7], [-0.1, float("nan"), -0.3], "a b c", False),
    ([0, 0, 0, 0, 0], None, "!!!!!", False),
    ([3, 0, 0, 0, 0, 0], None, "x!!!!!", False),
    ([9] * 20, None, "z" * 20, False),
    ([1, 2] * 10, None, "ab" * 10, False),
    ([1], [-1.0], " !!! ", False),
    (list(range(20)), None, "fine text", True),
])
def test_check_output(tokens, lps, text, ok):
    assert check_output(tokens, lps, text).ok is ok


def _out(tokens, text, lp=-0.5):
    lps = [{t: NS(logprob=lp)} for t in tokens]
    return NS(outputs=[NS(token_ids=tokens, logprobs=lps, text=text, cumulative_logprob=None)])


class FakeLLM:
    """Poisons any request batched with the adapter 'bad'; 'bad' is bad even alone."""

    def __init__(self, log):
        self.log = log

    def generate(self, prompts, params, lora_request=None, use_tqdm=False):
        loras = lora_request if isinstance(lora_request, list) else [lora_request] * len(prompts)
        self.log.append(len(prompts))
        poisoned = any(getattr(r, "lora_name", None) == "bad" for r in loras)
        return [_out([0] * 6, "!!!!!!", float("nan")) if poisoned else _out([4, 5, 6], "ok")
                for _ in prompts]

    def reset_prefix_cache(self):
        self.log.append("reset")


def test_guard_reruns_poisoned_mates_and_quarantines():
    log, built = [], []

    def factory():
        built.append(1)
        return FakeLLM(log)

    g = Guard(llm_factory=factory, lora_factory=lambda n: NS(lora_name=n),
              canary=lambda llm, lora: Health(getattr(lora, "lora_name", None) != "bad"), quarantine_after=2)
    bad, good = NS(lora_name="bad"), NS(lora_name="good")
    outs, hs = g.generate(["p1", "p2", "p3"], None, [None, good, bad])
    assert hs[0].ok and hs[1].ok and not hs[2].ok  # mates re-run alone come back clean
    assert "reset" in log and len(built) == 2       # ladder went to a rebuild
    assert {e["event"] for e in g.events} >= {"bad_batch", "isolated_rerun", "recovery_step"}
    assert all("vllm" in e and "device" in e and "ptxas" in e for e in g.events)
    g.generate(["p"], None, [bad])
    assert g.is_quarantined("bad")
    with pytest.raises(QuarantinedError):
        g.generate(["p"], None, [bad])
