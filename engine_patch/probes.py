"""Greedy probes through a live engine: does an adapter act, and is the engine sane.

The one canary and the one adapter-effect check, for every caller: the engine host runs
`check_adapters` + `canary` when it registers an adapter, `canary` at start and after each of
the guard's recovery steps; `engine_patch.verify` and the GPU benches read the same prompts.

- `check_adapters(llm, lora_requests, prompts=None, max_tokens=8) -> list[AdapterCheck]`
  Greedy output of each adapter vs the base: an adapter that changes neither a token nor a
  logprob (> `min_change`) is `ok=False` ("loads and changes nothing", vLLM #49354).
- `canary(llm, lora_request=None, prompt=CANARY_PROMPT, max_tokens=CANARY_TOKENS) -> CanaryResult`
  Two greedy runs of a fixed prompt: both healthy (`guard.check_output`: finite logprobs, no
  token-0 runs, not all `!`, no runaway repetition) and identical. The engine must be idle
  (the host runs it between batches, under its lock).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .guard import check_output

CANARY_PROMPT = "Describe the objects in the picture in one short sentence."
CANARY_TOKENS = 8
ADAPTER_PROMPTS = (CANARY_PROMPT, "List three things an archaeologist records when a tomb is opened.")
# Two greedy runs of one prompt on one engine differ by float noise only; more is instability.
CANARY_MAX_DRIFT = 0.05


@dataclass
class AdapterCheck:
    name: str
    ok: bool
    detail: str
    tokens_differ: bool
    max_logprob_change: float


@dataclass(frozen=True)
class CanaryResult:
    ok: bool
    detail: str
    tokens: list[int] = field(default_factory=list)

    @property
    def reason(self) -> str | None:  # the guard's Health shape
        return None if self.ok else self.detail


def _greedy(llm, prompts: Sequence[Any], loras: Sequence[Any], max_tokens: int) -> list[tuple[list[int], list[float], str]]:
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=0)
    outs = llm.generate(list(prompts), sp, lora_request=list(loras), use_tqdm=False)
    res = []
    for o in outs:
        c = o.outputs[0]
        lps = [d[t].logprob if t in d else next(iter(d.values())).logprob for t, d in zip(c.token_ids, c.logprobs or [])]
        res.append((list(c.token_ids), lps, c.text))
    return res


def check_adapters(llm, lora_requests: Sequence[Any], prompts: Sequence[Any] | None = None,
                   max_tokens: int = CANARY_TOKENS,
                   min_change: float = 1e-3) -> list[AdapterCheck]:
    """Each adapter must change the greedy output (a token, or a logprob by > min_change)."""
    prompts = list(prompts or ADAPTER_PROMPTS)
    base = _greedy(llm, prompts, [None] * len(prompts), max_tokens)
    checks = []
    for lr in lora_requests:
        name = getattr(lr, "lora_name", str(lr))
        try:
            got = _greedy(llm, prompts, [lr] * len(prompts), max_tokens)
        except Exception as exc:  # noqa: BLE001
            checks.append(AdapterCheck(name, False, f"generation failed: {type(exc).__name__}: {exc}"[:300], False, 0.0))
            continue
        differ = any(g[0] != b[0] for g, b in zip(got, base))
        change = 0.0
        for (gt, gl, _), (bt, bl, _) in zip(got, base):
            n = next((i for i, (x, y) in enumerate(zip(gt, bt)) if x != y), min(len(gt), len(bt)))
            for x, y in zip(gl[: n + 1], bl[: n + 1]):
                change = max(change, abs(x - y) if math.isfinite(x) and math.isfinite(y) else float("inf"))
        finite = all(math.isfinite(x) for g in got for x in g[1])
        ok = finite and (differ or change > min_change)
        detail = ("ok" if ok else "non-finite logprobs" if not finite else
                  f"adapter changes nothing (max logprob change {change:.2g}): modules not placed? (#49354)")
        checks.append(AdapterCheck(name, ok, detail, differ, change))
    return checks


def canary(llm, lora_request: Any | None = None, prompt: Any = CANARY_PROMPT,
           max_tokens: int = CANARY_TOKENS) -> CanaryResult:
    """Two greedy runs of `prompt`: healthy (guard.check_output) and identical."""
    try:
        runs = [_greedy(llm, [prompt], [lora_request], max_tokens)[0] for _ in range(2)]
    except Exception as exc:  # noqa: BLE001 - a dead engine is an unhealthy canary
        return CanaryResult(False, f"generation failed: {type(exc).__name__}: {exc}"[:300], [])
    for k, (toks, lps, text) in enumerate(runs):
        h = check_output(toks, lps, text)
        if not h.ok:
            return CanaryResult(False, f"{('first', 'second')[k]} of two greedy runs: {h.reason}", toks)
    (t1, l1, _), (t2, l2, _) = runs
    if t1 != t2:
        return CanaryResult(False, f"unstable: run 1 {t1} vs run 2 {t2}", t1)
    drift = max((abs(x - y) for x, y in zip(l1, l2)), default=0.0)
    if drift > CANARY_MAX_DRIFT:
        return CanaryResult(False, f"unstable logprobs between runs (max diff {drift:.3g})", t1)
    return CanaryResult(True, "ok", t1)
