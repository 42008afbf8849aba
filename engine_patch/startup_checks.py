"""Start-up self-checks through the live engine, for the failure classes others hit (issue 36).

The GPU worker runs them once, after its adapters are registered and before its first batch
(``workers.engine_host.EngineHost.startup_checks``); ``python -m bench.gpu.selfcheck`` runs
them through the worker's engine host on a device and writes them as JSON
(``gpukit/stages.sh selfcheck``).
``engine_patch.selfcheck`` checks the LoRA kernels before the engine exists; these checks go
through the engine itself: its scheduler, its batches and, on a GPU, its CUDA graphs.

- `run_checks(llm, adapters, *, max_loras, sample=MAX_LONG_ADAPTERS) -> StartupReport`
  ``adapters``: name -> LoRARequest of the registered (accepted) adapters, in the order they
  are to be sampled. The engine must be idle.

The checks, what each catches and what it cannot
------------------------------------------------
(a) ``mixed_decode`` (SGLang #28371; vLLM's CPU Punica gathering the last slot for index -1).
    One batch: the no-adapter request, one request per co-batched adapter (the first
    ``max_loras`` of the sample: all of them fit the device slots at once) and the no-adapter
    request again, all on one short prompt, greedy for ``MIXED_TOKENS`` tokens, so almost
    every step is a decode step; on a GPU those steps replay the CUDA graph of the padded
    batch size. Each row must equal the same request run alone (graph of size 1): the same
    greedy tokens and chosen-token logprobs within the tolerance below.
    Catches: a row served with another row's adapter or with none, a delta leaking into the
    no-adapter rows, a graph replayed with a stale adapter mapping, any batch-composition
    dependence larger than bf16 noise. Cannot catch: a defect the lone run has too (both
    equally wrong: that is (b) and the offline ``engine_patch.verify``), a defect only at
    batch sizes or adapter counts other than the two run here, a mix-up between two
    adapters whose outputs differ by less than the tolerance, or a no-adapter row reading an
    empty slot (the CPU ops' weights[-1]) when fewer adapters than slots are registered.
(b) ``long_canary`` (the field failure began above ~400 prompt tokens; 128 is a kernel block
    and chunk boundary). ``probes.canary`` on prompts of ``LONG_LENGTHS`` tokens (natural
    prose), for the base model and each sampled adapter: both greedy runs healthy per
    ``guard.check_output`` (finite logprobs, no token-0 run, not all '!') and identical (the
    second run reads the prompt's blocks from the prefix cache: a cache that returns
    other blocks shows here too). Catches: NaN/inf or degenerate output that needs a long
    prompt, alone, for the base or one adapter. Cannot catch: a fault that needs a token
    these prompts lack (the guard judges every real output), or an adapter outside the sample.
    The sample: at most ``MAX_LONG_ADAPTERS`` adapters, the caller's order (the worker puts
    the highest ranks first, then by name: the largest deltas and the most kernel tiles, and
    the same adapters on every start of one deployment); the rest are listed as not checked.
(c) ``no_adapter_cobatched`` (vLLM #49063: a request without an adapter changes when LoRA is
    on). The no-adapter request on the longest prompt run alone, then co-batched with the same
    prompt for each co-batched adapter, so its prefill (and decode) shares steps with adapter
    tokens: tokens equal, logprobs within the tolerance. Catches the leaking-delta form
    (adapter rows' deltas reaching no-adapter rows, in prefill or decode). Cannot catch the
    form where enabling LoRA changes the no-adapter path even alone (the engine has no
    LoRA-free twin to compare with at start-up): that needs an engine built without LoRA,
    which ``engine_patch.verify`` builds (check d, "no-adapter request, LoRA engine vs no-LoRA
    engine") and the device run records.

Tolerance (a, c): a request's logprobs in a batch differ from alone only by the batch-size
dependence of bf16 kernels (GEMM tiling and split-K chosen by the row count, attention split
over a different number of sequences): differences in the last bits of intermediates, of the
order of bf16-vs-fp32 noise, which ``engine_patch.verify`` measured at ~0.02 nats mean and
0.07-0.12 max on the tiny model. The bound is ``TOL_MEAN`` = 0.05 nats mean and ``TOL_MAX`` =
verify's ``FLOOR_MAX`` = 0.25 nats at the worst position (2.5x and 2-3.5x that noise), and
greedy tokens may part only at a near tie (verify's rule: the lone run's top-1/top-2 margin
<= TOL_MAX and the batched run took the runner-up). The defects above move logprobs by the
adapter's own effect (verify: 1.2-1.8 nats mean on the tiny model; registration refuses an
adapter whose effect is below 1e-3), so they land one to two orders above the bound. Two runs
of one request alone use ``probes.CANARY_MAX_DRIFT`` (same shapes, only float noise).

What a failure does (the worker's side, ``EngineHost.startup_checks``)
---------------------------------------------------------------------
- An adapter's long canary fails while the base model's passes: that adapter is refused
  (its registration verdict, stage "startup"), shown like any refused adapter; the worker
  serves the rest.
- (a), (c) or the base model's long canary fail: the engine itself is wrong. If it runs with
  CUDA graphs (or compiled), it is rebuilt with ``enforce_eager`` (the graph-replay class of
  defect has no other mitigation that we know to be sound) and every check runs again;
  passing, it serves eager and says so. Otherwise the worker refuses to start, with the
  reason on its heartbeat row (``vidlora status --workers``, ``vidlora doctor``, the
  Scenarios page).
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .guard import check_output
from .probes import canary

log = logging.getLogger("engine_patch.startup_checks")

MIXED_TOKENS = 24           # decode steps of check (a): past the first prefill, into graph replay
LONG_LENGTHS = (150, 450)   # prompt tokens of check (b): past 128, past ~400
LONG_TOKENS = 8             # greedy tokens of each long canary
MAX_LONG_ADAPTERS = 8       # adapters sampled for check (b)
TOL_MEAN = 0.05             # nats, mean |d logprob| batched vs alone (module docstring)
TOL_MAX = 0.25              # nats, worst position (engine_patch.verify.FLOOR_MAX)
SHORT_LENGTH = 16           # prompt tokens of check (a)


class StartupCheckError(RuntimeError):
    """The engine fails a start-up check and nothing fixed it: the worker must not serve."""


@dataclass
class CheckOutcome:
    check: str                  # mixed_decode | long_canary | no_adapter_cobatched
    ok: bool
    detail: str
    adapter: str | None = None  # None: the no-adapter request
    length: int | None = None   # prompt tokens
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0        # engine time of the check (a batch's time goes to its first row)


@dataclass
class StartupReport:
    checks: list[CheckOutcome] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)     # adapter -> why (its long canary)
    not_checked: list[str] = field(default_factory=list)      # adapters outside the sample
    engine_failure: str | None = None                         # why the engine must not serve
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.engine_failure is None

    def summary(self) -> str:
        if self.engine_failure:
            return self.engine_failure
        bad = sum(not c.ok for c in self.checks)
        text = f"{len(self.checks) - bad} of {len(self.checks)} checks passed in {self.seconds:.1f}s"
        if self.refused:
            text += "; refused " + "; ".join(f"{a} ({why})" for a, why in self.refused.items())
        if self.not_checked:
            text += f"; {len(self.not_checked)} adapter(s) outside the long-canary sample"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "detail": self.summary(), "seconds": round(self.seconds, 2),
                "engine_failure": self.engine_failure, "refused": dict(self.refused),
                "not_checked": list(self.not_checked),
                "checks": [jsonable(asdict(c)) for c in self.checks]}


def jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x


def _name(lr: Any) -> str | None:
    return None if lr is None else getattr(lr, "lora_name", str(lr))


def _reset_cache(llm) -> None:
    # A batched run must compute its own prefill, not read the blocks a lone run left.
    try:
        llm.reset_prefix_cache()
    except Exception:  # noqa: BLE001 - an engine without prefix caching has nothing to reset
        pass


def prompts_for(llm) -> dict[int, list[int]]:
    """The checks' prompts as token ids: natural prose cut to exact lengths."""
    from .verify import make_prompt

    tok = llm.get_tokenizer()
    # The offset follows the length: each length's prompt is the same whichever lengths run.
    return {L: make_prompt(tok, L, offset=L) for L in (SHORT_LENGTH, *LONG_LENGTHS)}


def _compare_rows(llm, prompt: list[int], rows: Sequence[Any], compare_idx: Sequence[int], n: int,
                  check: str, length: int) -> list[CheckOutcome]:
    """``rows`` (LoRARequests, None: no adapter) on one prompt as one batch; each row in
    ``compare_idx`` against the same request alone (module docstring: tolerance)."""
    from .verify import compare_generation, generate

    t0 = time.perf_counter()
    _reset_cache(llm)
    batch = generate(llm, [prompt] * len(rows), list(rows), n)
    alone: dict[str | None, dict] = {}
    for i in compare_idx:
        key = _name(rows[i])
        if key not in alone:
            _reset_cache(llm)
            alone[key] = generate(llm, [prompt], [rows[i]], n)[0]
    seconds = time.perf_counter() - t0
    out = []
    for i in compare_idx:
        lr, single, got = rows[i], alone[_name(rows[i])], batch[i]
        cmp = compare_generation(single, got, TOL_MEAN, TOL_MAX)
        health = check_output(got["tokens"], got["lp"], "", repetition=False)
        ok = cmp["ok"] and health.ok
        mates = [_name(r) or "no adapter" for r in rows]
        if ok:
            detail = "ok"
        elif not health.ok:
            detail = f"batched with {mates}: {health.reason}"
        elif cmp["diverge_at"] is not None and not cmp["near_tie"]:
            detail = (f"batched with {mates}: greedy tokens differ from the request alone at token "
                      f"{cmp['diverge_at']} (max |d logprob| {cmp['max']:.3g} before it)")
        else:
            detail = (f"batched with {mates}: logprobs differ from the request alone by {cmp['mean']:.3g} mean, "
                      f"{cmp['max']:.3g} max (bound {TOL_MEAN}/{TOL_MAX})")
        out.append(CheckOutcome(check, ok, detail, _name(lr), length,
                                {"row": i, "diverge_at": cmp["diverge_at"], "near_tie": cmp["near_tie"],
                                 "mean": cmp["mean"], "max": cmp["max"], "tokens": got["tokens"][:8]},
                                seconds if not out else 0.0))
    return out


def mixed_decode(llm, loras: Sequence[Any], prompt: list[int], n: int = MIXED_TOKENS) -> list[CheckOutcome]:
    """(a): no adapter, every co-batched adapter, no adapter again, as one decode batch."""
    rows = [None, *loras, None]
    return _compare_rows(llm, prompt, rows, range(len(rows)), n, "mixed_decode", SHORT_LENGTH)


def no_adapter_cobatched(llm, loras: Sequence[Any], prompt: list[int], length: int,
                         n: int = LONG_TOKENS) -> CheckOutcome:
    """(c): the no-adapter request on a long prompt, alone vs co-batched with adapters."""
    [res] = _compare_rows(llm, prompt, [None, *loras], [0], n, "no_adapter_cobatched", length)
    return res


def long_canary(llm, lora: Any, prompt: list[int], length: int) -> CheckOutcome:
    """(b): probes.canary on a long prompt."""
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    _reset_cache(llm)
    res = canary(llm, lora, prompt=TokensPrompt(prompt_token_ids=list(prompt)), max_tokens=LONG_TOKENS)
    return CheckOutcome("long_canary", res.ok, res.detail, _name(lora), length, {"tokens": list(res.tokens)[:8]},
                        time.perf_counter() - t0)


def run_checks(llm, adapters: Mapping[str, Any], *, max_loras: int,
               sample: int | None = None) -> StartupReport:
    """Every check (module docstring); never raises for a failed check, only reports it.
    ``sample``: adapters given long canaries (default ``MAX_LONG_ADAPTERS``)."""
    t0 = time.perf_counter()
    rep = StartupReport()
    prompts = prompts_for(llm)
    names = list(adapters)
    sample = max(0, MAX_LONG_ADAPTERS if sample is None else sample)
    sampled, rep.not_checked = names[:sample], names[sample:]

    known = {_name(lr): n for n, lr in adapters.items()}

    def add(c: CheckOutcome) -> CheckOutcome:
        # Names as the caller knows them, not vLLM's (a reloaded adapter's is tagged).
        c.adapter = known.get(c.adapter, c.adapter) if c.adapter is not None else None
        rep.checks.append(c)
        return c

    base_ok = True
    for L in LONG_LENGTHS:
        c = add(long_canary(llm, None, prompts[L], L))
        if not c.ok:
            base_ok = False
            rep.engine_failure = f"base model canary at {L} prompt tokens: {c.detail}"
    for name in sampled:
        for L in LONG_LENGTHS:
            c = add(long_canary(llm, adapters[name], prompts[L], L))
            if not c.ok and base_ok:
                rep.refused.setdefault(name, f"canary at {L} prompt tokens: {c.detail}")
    mates = [adapters[n] for n in names if n not in rep.refused][:max(1, max_loras)]
    if mates:
        for c in map(add, mixed_decode(llm, mates, prompts[SHORT_LENGTH])):
            if not c.ok and rep.engine_failure is None:
                rep.engine_failure = (f"mixed-adapter decode: the {c.adapter or 'no-adapter'} request "
                                      f"{c.detail}")
        L = LONG_LENGTHS[-1]
        c = add(no_adapter_cobatched(llm, mates, prompts[L], L))
        if not c.ok and rep.engine_failure is None:
            rep.engine_failure = f"no-adapter request at {L} prompt tokens {c.detail}"
    rep.seconds = time.perf_counter() - t0
    log.info("start-up checks: %s", rep.summary())
    return rep
