"""Run-time guard: never store a degenerate result as a success; recover and quarantine.

The engine host owns the `vllm.LLM`; it hands the guard a factory and calls
`Guard.generate(...)` (or `check_output` on its own results). See `Guard` for the API.
"""
from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .env import versions

log = logging.getLogger("engine_patch.guard")


@dataclass(frozen=True, slots=True)
class Health:
    ok: bool
    reason: str | None = None


def check_output(token_ids: Sequence[int], logprobs: Sequence[float] | None, text: str,
                 *, max_token0_run: int = 4, max_repeat_frac: float = 0.8, min_len_for_repeat: int = 16) -> Health:
    """Degenerate-output detector. logprobs: the chosen tokens' logprobs (may be None)."""
    if logprobs is not None and any(not math.isfinite(x) for x in logprobs if x is not None):
        return Health(False, "non-finite logprobs")
    run = best = 0
    for t in token_ids:
        run = run + 1 if t == 0 else 0
        best = max(best, run)
    if best >= max_token0_run:
        return Health(False, f"token-0 run of {best}")
    stripped = text.strip()
    if stripped and set(stripped) == {"!"}:
        return Health(False, "all-'!' text")
    n = len(token_ids)
    if n >= min_len_for_repeat:
        top = Counter(token_ids).most_common(1)[0][1]
        if top / n >= max_repeat_frac:
            return Health(False, f"runaway repetition ({top}/{n} identical tokens)")
        for period in range(2, 9):  # short loops like "a b a b a b"
            tail = list(token_ids[-period * 6:])
            if len(tail) == period * 6 and all(tail[i] == tail[i % period] for i in range(len(tail))):
                return Health(False, f"runaway repetition (period {period})")
    return Health(True)


def health_of(request_output: Any) -> Health:
    """check_output for a vllm RequestOutput (first completion)."""
    c = request_output.outputs[0]
    lps = None
    if c.logprobs:
        lps = [d[t].logprob if t in d else next(iter(d.values())).logprob for t, d in zip(c.token_ids, c.logprobs)]
    elif c.cumulative_logprob is not None:
        lps = [c.cumulative_logprob]
    return check_output(list(c.token_ids), lps, c.text)


def event(kind: str, **fields: Any) -> dict[str, Any]:
    """Every guard event carries vLLM/torch/Triton/ptxas versions and the device."""
    rec = {"event": kind, "time": time.time(), **fields, **versions()}
    log.warning("engine_patch guard %s", rec)
    return rec


@dataclass
class Guard:
    """Wraps an engine: detects bad results, isolates, recovers, quarantines.

    llm_factory() -> vllm.LLM builds a fresh engine (engine_patch.apply() already run).
    canary(llm, lora_request | None) -> Health runs a known prompt; default: 8 greedy
    tokens of `canary_prompt` checked with check_output.
    lora_factory(adapter_name) -> LoRARequest reloads an adapter (new lora_int_id, so
    vLLM loads fresh weights rather than reusing the cached slot).
    The host calls `generate(prompts, params, lora_requests)` and gets back
    (outputs, healths); unhealthy outputs are never to be stored as success.
    """

    llm_factory: Callable[[], Any]
    lora_factory: Callable[[str], Any] | None = None
    canary: Callable[[Any, Any], Health] | None = None
    canary_prompt: str = "Describe the picture in one sentence."
    quarantine_after: int = 3
    events: list[dict[str, Any]] = field(default_factory=list)
    failures: Counter = field(default_factory=Counter)
    quarantined: set[str] = field(default_factory=set)
    llm: Any = None

    def __post_init__(self) -> None:
        if self.llm is None:
            self.llm = self.llm_factory()

    # -- public API -------------------------------------------------------------------
    def is_quarantined(self, adapter: str | None) -> bool:
        return adapter is not None and adapter in self.quarantined

    def generate(self, prompts: list[Any], params: Any, lora_requests: list[Any | None]):
        """Run a batch; re-run poisoned requests alone; recover for ones bad alone too."""
        for r in lora_requests:
            if r is not None and self.is_quarantined(r.lora_name):
                raise QuarantinedError(r.lora_name)
        outs = list(self.llm.generate(prompts, params, lora_request=lora_requests, use_tqdm=False))
        healths = [health_of(o) for o in outs]
        bad = [i for i, h in enumerate(healths) if not h.ok]
        if not bad:
            return outs, healths
        self.events.append(event("bad_batch", n=len(outs), bad=len(bad),
                                 reasons=sorted({healths[i].reason for i in bad})))
        for i in bad:
            outs[i], healths[i] = self.rerun_isolated(prompts[i], params, lora_requests[i])
        return outs, healths

    def rerun_isolated(self, prompt: Any, params: Any, lora: Any | None):
        """A request poisoned by a bad batch-mate comes back clean alone; if not, recover."""
        out = self.llm.generate([prompt], params, lora_request=lora, use_tqdm=False)[0]
        h = health_of(out)
        name = getattr(lora, "lora_name", None)
        self.events.append(event("isolated_rerun", adapter=name, ok=h.ok, reason=h.reason))
        if h.ok:
            return out, h
        lora = self.recover(name)
        if lora is False:
            return out, h
        out = self.llm.generate([prompt], params, lora_request=lora, use_tqdm=False)[0]
        return out, health_of(out)

    def recover(self, adapter: str | None):
        """reset prefix cache -> reload adapter -> rebuild engine, canary after each step.

        Returns the LoRARequest to use (possibly reloaded), or False when the adapter
        is quarantined / nothing helped."""
        lora = self.lora_factory(adapter) if (adapter and self.lora_factory) else None
        steps: list[tuple[str, Callable[[], None]]] = [("reset_prefix_cache", self._reset_prefix_cache)]
        if adapter and self.lora_factory:
            steps.append(("reload_adapter", lambda: None))  # a fresh LoRARequest id forces a reload
        steps.append(("rebuild_engine", self._rebuild))
        for step, action in steps:
            action()
            if step == "reload_adapter":
                lora = self.lora_factory(adapter)
            h = self._canary(lora)
            self.events.append(event("recovery_step", step=step, adapter=adapter, ok=h.ok, reason=h.reason))
            if h.ok:
                return lora
        if adapter:
            self.failures[adapter] += 1
            if self.failures[adapter] >= self.quarantine_after:
                self.quarantined.add(adapter)
                self.events.append(event("quarantine", adapter=adapter, failures=self.failures[adapter]))
        return False

    # -- steps -------------------------------------------------------------------------
    def _reset_prefix_cache(self) -> None:
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if reset is not None:
            reset()

    def _rebuild(self) -> None:
        old, self.llm = self.llm, None
        shutdown = getattr(getattr(old, "llm_engine", None), "shutdown", None)
        if callable(shutdown):
            shutdown()
        del old
        import gc

        gc.collect()
        self.llm = self.llm_factory()

    def _canary(self, lora: Any | None) -> Health:
        if self.canary is not None:
            return self.canary(self.llm, lora)
        from vllm import SamplingParams

        out = self.llm.generate([self.canary_prompt], SamplingParams(temperature=0, max_tokens=8, logprobs=0),
                                lora_request=lora, use_tqdm=False)[0]
        return health_of(out)


class QuarantinedError(RuntimeError):
    """The adapter failed recovery `quarantine_after` times; the host must not use it."""
