"""Run-time guard: never store a degenerate result as a success; isolate, recover, quarantine.

One mechanism, wrapped around the engine host's own batch function. The host keeps what
only it can do (build inputs, ``LLM.enqueue`` + step the engine under a deadline, manage
LoRA ids, rebuild the engine) and exposes it through the small `GuardedEngine` protocol;
`Guard.generate` adds everything the guard decides:

1. Requests of a quarantined adapter are refused at once ("adapter quarantined: <why>").
2. The batch runs once; every output is judged by `check_output` (non-finite logprobs,
   token-0 runs, all-'!' text, runaway repetition).
3. A bad output of a batch with mates is re-run alone: a request poisoned by a bad
   batch-mate comes back healthy and that alone-output is the one kept.
4. Still bad alone: the recovery ladder runs once per adapter - reset prefix cache (and
   the multimodal/encoder caches) -> reload the adapter (remove_lora + a fresh LoRARequest
   id) -> rebuild the engine - with a canary after each step. At the first step whose
   canary passes, the request is re-run alone once; its verdict then stands.
5. A ladder that ends with the adapter's canary failing while the base model's canary
   passes counts one failure against the adapter; `quarantine_after` failures quarantine
   it. If the base model fails its canary too, the engine is at fault, not the adapter:
   nothing is counted and the outputs fail with that said.

The guard judges the engine, not the model:
- An exception from the engine is an outcome, not a crash of the batch: the batch's
  requests are re-run alone, the one that raises alone fails with the error and counts a
  failure against its adapter (quarantine as above); its batch-mates are served.
- Runaway repetition with finite logprobs is what a model does, not what a broken kernel
  does. It is re-run alone on a clean cache; reproduced token for token, it is stored as
  the model's answer with a quality flag (``quality``) and triggers no recovery. Only the
  engine's signatures (non-finite logprobs, token-0 runs, all-'!') run the ladder.
- `EngineReplaceRequired` from a step (an engine that cannot be rebuilt in this process)
  is not handled here: it goes to the worker, which gives its work back and exits for its
  supervisor to start a fresh process. A sticky CUDA error from a batch (device-side
  assert, illegal address: `is_context_lost`) raises it at once, since nothing in this
  process can run on the device again.

Every guard event is logged with the vLLM / torch / Triton / ptxas versions and the device
(`engine_patch.env.versions`), because those decide whether a LoRA kernel miscompiles.
"""
from __future__ import annotations

import logging
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .env import versions

log = logging.getLogger("engine_patch.guard")

DEFAULT_QUARANTINE_AFTER = 2  # ladders that failed for one adapter before it is quarantined


class EngineReplaceRequired(RuntimeError):
    """The engine cannot be rebuilt in this process (its device memory was not freed, or the
    device context is lost): the worker must release its work and exit so its supervisor
    starts a fresh process."""


# CUDA's sticky errors: after one, every later call in the process fails ("the process must
# be terminated and relaunched", CUDA runtime docs), so no in-process recovery can work. Seen
# on the H200 with vLLM 0.32: NaN logits from a LoRA request end in a device-side assert in an
# index gather, then CUBLAS_STATUS_EXECUTION_FAILED on every later batch, and an in-process
# rebuild fails too (bench/results/h200_field.md).
_CONTEXT_LOST = ("device-side assert", "illegal memory access", "unspecified launch failure",
                 "illegal instruction", "misaligned address", "hardware stack error",
                 "invalid program counter", "CUBLAS_STATUS_EXECUTION_FAILED", "cudaErrorAssert",
                 "cudaErrorIllegalAddress", "cudaErrorLaunchFailure")


def is_context_lost(exc: BaseException) -> bool:
    """Whether `exc` is a sticky CUDA error: the device context of this process is gone."""
    text = f"{type(exc).__name__}: {exc}"
    return any(marker in text for marker in _CONTEXT_LOST)


def _replace_if_context_lost(exc: BaseException, where: str) -> None:
    if is_context_lost(exc):
        raise EngineReplaceRequired(f"the device context is lost ({where}): "
                                    f"{type(exc).__name__}: {exc}"[:1000]) from exc


def is_model_behaviour(health: "Health") -> bool:
    """Repetition with finite logprobs: a model's failure mode, not an engine's signature."""
    return (not health.ok and str(health.reason or "").startswith("runaway repetition")
            and health.checks.get("logprobs_finite", False) and not health.checks.get("all_bang")
            and health.checks.get("token0_run", 0) < 4)


# -- judging one output -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Health:
    ok: bool
    reason: str | None = None
    checks: dict[str, Any] = field(default_factory=dict)


def _tail_loop_period(token_ids: Sequence[int], repeats: int, max_period: int) -> int | None:
    """Smallest period p in 2..max_period whose loop fills the last p*repeats tokens."""
    for period in range(2, max_period + 1):
        tail = list(token_ids[-period * repeats:])
        if len(tail) == period * repeats and all(tail[i] == tail[i % period] for i in range(len(tail))):
            return period
    return None


def check_output(token_ids: Sequence[int], logprobs: Sequence[float | None] | None, text: str, *,
                 cumulative_logprob: float | None = None, max_token0_run: int = 4,
                 max_repeat_frac: float = 0.8, min_len_for_repeat: int = 16,
                 loop_repeats: int = 6, max_loop_period: int = 8, repetition: bool = True) -> Health:
    """Degenerate-output detector; ``logprobs`` are the chosen tokens' logprobs (or None).

    Every check is computed (``checks``), so a stored result shows how close it came;
    ``reason`` names the first that failed. ``repetition=False`` for output a grammar shaped
    (a JSON array of similar items repeats by design): the engine checks still apply.
    """
    lps = [x for x in (logprobs or []) if x is not None]
    if cumulative_logprob is not None:
        lps.append(cumulative_logprob)
    nonfinite = sum(1 for x in lps if not math.isfinite(x))
    run = best = 0
    for t in token_ids:
        run = run + 1 if t == 0 else 0
        best = max(best, run)
    stripped = text.strip()
    all_bang = bool(stripped) and set(stripped) == {"!"}
    n = len(token_ids)
    top = Counter(token_ids).most_common(1)[0][1] if n else 0
    long_enough = n >= min_len_for_repeat
    period = _tail_loop_period(token_ids, loop_repeats, max_loop_period) if long_enough else None
    checks: dict[str, Any] = {
        "tokens": n,
        "logprobs_finite": nonfinite == 0,
        "token0_run": best,
        "all_bang": all_bang,
        "top_token_frac": round(top / n, 3) if n else 0.0,
        "loop_period": period,
    }
    reason = None
    if nonfinite:
        reason = f"non-finite logprobs ({nonfinite})"
    elif best >= max_token0_run:
        reason = f"token id 0 generated {best} times in a row"
    elif all_bang:
        reason = "all-'!' text"
    elif repetition and long_enough and top / n >= max_repeat_frac:
        reason = f"runaway repetition ({top}/{n} identical tokens)"
    elif repetition and period is not None:
        reason = f"runaway repetition (period {period})"
    return Health(reason is None, reason, checks)


def health_of(request_output: Any) -> Health:
    """check_output for a vllm RequestOutput (first completion)."""
    c = request_output.outputs[0]
    lps = None
    if c.logprobs:
        lps = [d[t].logprob if t in d else float("nan") for t, d in zip(c.token_ids, c.logprobs)]
    return check_output(list(c.token_ids), lps, c.text, cumulative_logprob=c.cumulative_logprob)


# -- the guard --------------------------------------------------------------------------------


class GuardedEngine(Protocol):
    """What the guard needs from the engine host (workers.engine_host.EngineHost)."""

    def run_batch(self, requests: Sequence[Any]) -> list[Any]:
        """Run ``requests`` as one batch; one output per request, in order."""

    def check(self, output: Any) -> Health | None:
        """Judge one output; None for an output that is an error (deadline, bad input...),
        which is the host's to report and not a degenerate generation."""

    def adapter_of(self, request: Any) -> str | None: ...

    def same_output(self, a: Any, b: Any) -> bool:
        """The two outputs are the same tokens (a reproduction)."""

    def reset_prefix_cache(self) -> None: ...

    def reload_adapter(self, adapter: str) -> None: ...

    def rebuild_engine(self) -> None: ...

    def canary(self, adapter: str | None, step: str) -> Health: ...


@dataclass(slots=True)
class Verdict:
    """The guard's word on one request; ``as_health()`` is what the host stores."""
    ok: bool
    reason: str | None = None
    checks: dict[str, Any] = field(default_factory=dict)
    judged: bool = True  # False: the output is an error the guard does not judge
    isolated_rerun: bool = False  # the output kept came from a run of this request alone
    recovery: list[str] = field(default_factory=list)  # ladder steps run for its adapter
    recovered_by: str | None = None  # the step after which it came back healthy
    quarantined: bool = False  # refused: its adapter is quarantined
    runs: int = 1  # engine runs of this request
    quality: str | None = None  # the model's own degenerate answer, reproduced: a flag, not a fault

    @classmethod
    def of(cls, health: Health | None, **kw: Any) -> "Verdict":
        if health is None:
            return cls(ok=False, judged=False, **kw)
        return cls(ok=health.ok, reason=health.reason, checks=dict(health.checks), **kw)

    def as_health(self) -> dict[str, Any]:
        return {"ok": self.ok, "reason": self.reason, "checks": self.checks,
                "isolated_rerun": self.isolated_rerun, "recovery": list(self.recovery),
                "recovered_by": self.recovered_by, "quarantined": self.quarantined,
                "runs": self.runs, "quality": self.quality}


@dataclass(frozen=True, slots=True)
class Recovery:
    ok: bool
    step: str | None  # the step whose canary passed
    steps: list[str]  # the steps run, in order
    detail: str | None = None  # why it failed


def event(kind: str, **fields: Any) -> dict[str, Any]:
    """Every guard event carries vLLM/torch/Triton/ptxas versions and the device."""
    rec = {"event": kind, "time": time.time(), **fields, **versions()}
    log.warning("engine_patch guard %s", rec)
    return rec


class Guard:
    """Judges every output of ``engine``; isolates, recovers and quarantines (module doc)."""

    def __init__(self, engine: GuardedEngine, *, quarantine_after: int = DEFAULT_QUARANTINE_AFTER,
                 max_events: int = 256) -> None:
        self.engine = engine
        self.quarantine_after = max(1, int(quarantine_after))
        self.events: deque[dict[str, Any]] = deque(maxlen=max_events)
        self.failures: Counter[str] = Counter()  # failed ladders per adapter
        self.quarantined: dict[str, str] = {}  # adapter -> why

    # -- quarantine ---------------------------------------------------------------------
    def is_quarantined(self, adapter: str | None) -> bool:
        return adapter is not None and adapter in self.quarantined

    def release(self, adapter: str) -> None:
        """Forget an adapter's failures (a new version of it was deployed)."""
        if self.quarantined.pop(adapter, None) is not None:
            self.note("release", adapter=adapter)
        self.failures.pop(adapter, None)

    # -- generation ---------------------------------------------------------------------
    def generate(self, requests: Sequence[Any]) -> list[tuple[Any | None, Verdict]]:
        """(output, verdict) per request, in order; output is None for a refused request."""
        results: list[tuple[Any | None, Verdict] | None] = [None] * len(requests)
        run_idx: list[int] = []
        for i, req in enumerate(requests):
            adapter = self.engine.adapter_of(req)
            if self.is_quarantined(adapter):
                results[i] = (None, Verdict(ok=False, reason=f"adapter quarantined: {self.quarantined[adapter]}",
                                            quarantined=True, runs=0))
            else:
                run_idx.append(i)
        if run_idx:
            batch = [requests[i] for i in run_idx]
            try:
                outs = self.engine.run_batch(batch)
            except EngineReplaceRequired:
                raise
            except Exception as exc:  # noqa: BLE001 - an engine error is an outcome to isolate
                _replace_if_context_lost(exc, f"a batch of {len(batch)}")
                self._on_exception(requests, results, run_idx, exc)
            else:
                for i, out in zip(run_idx, outs, strict=True):
                    results[i] = (out, Verdict.of(self.engine.check(out)))
            self._resolve(requests, results, run_idx, len(run_idx))
        return [r for r in results if r is not None]  # every slot is filled by now

    # -- a streaming engine: outputs finish one by one, the resolution waits for an idle engine --
    def judge(self, output: Any) -> Verdict:
        """The verdict on one output as it finishes; a bad one goes to ``settle`` later."""
        return Verdict.of(self.engine.check(output))

    def settle(self, requests: Sequence[Any], firsts: Sequence[tuple[Any, Verdict]],
               ran_with: int) -> list[tuple[Any, Verdict]]:
        """Resolve outputs judged bad as they finished in a running set of ``ran_with``
        requests, exactly as ``generate`` resolves a batch's bad outputs (re-run alone, the
        model's own repetition flagged, the recovery ladder, quarantine). The engine must be
        idle: every re-run and ladder step runs alone."""
        results: list[tuple[Any, Verdict] | None] = list(firsts)
        self._resolve(requests, results, list(range(len(requests))), ran_with)
        return results  # type: ignore[return-value]

    def after_exception(self, requests: Sequence[Any], exc: Exception) -> list[tuple[Any | None, Verdict]]:
        """A streaming engine raised with ``requests`` in flight (now aborted): each is re-run
        alone, as ``generate`` does for a batch that raised."""
        _replace_if_context_lost(exc, f"a running set of {len(requests)}")
        results: list[tuple[Any | None, Verdict] | None] = [None] * len(requests)
        idx = list(range(len(requests)))
        self._on_exception(requests, results, idx, exc)
        self._resolve(requests, results, idx, len(idx))
        return results  # type: ignore[return-value]

    def _resolve(self, requests, results, run_idx: list[int], ran_with: int) -> None:
        bad = [i for i in run_idx if self._bad(results[i])]
        if not bad:
            return
        self.note("bad_batch", size=ran_with, bad=len(bad),
                  adapters=sorted({str(self.engine.adapter_of(requests[i])) for i in bad}),
                  reasons=sorted({str(results[i][1].reason) for i in bad}))
        if ran_with > 1:
            bad = self._isolate(requests, results, bad)
        bad = self._flag_model_behaviour(requests, results, bad)
        if bad:
            self._recover_all(requests, results, bad)

    def _on_exception(self, requests, results, run_idx: list[int], exc: Exception) -> None:
        """The batch raised: run each request alone; one that raises alone fails with the
        error and counts against its adapter, the others are served."""
        log.warning("guard: engine raised on a batch of %d", len(run_idx), exc_info=exc)
        self.note("batch_raised", size=len(run_idx), error=f"{type(exc).__name__}: {exc}"[:300])
        for i in run_idx:
            req = requests[i]
            if len(run_idx) == 1:  # it already ran alone
                results[i] = (None, self._raised_alone(req, exc))
                continue
            try:
                [out] = self.engine.run_batch([req])
            except EngineReplaceRequired:
                raise
            except Exception as alone_exc:  # noqa: BLE001
                _replace_if_context_lost(alone_exc, "a request run alone")
                results[i] = (None, self._raised_alone(req, alone_exc))
                continue
            results[i] = (out, Verdict.of(self.engine.check(out), isolated_rerun=True, runs=2))

    def _raised_alone(self, request, exc: Exception) -> Verdict:
        adapter = self.engine.adapter_of(request)
        why = f"engine raised {type(exc).__name__}: {exc}"[:600]
        base = self._canary(None, "after_exception")
        if not base.ok:
            # The exception broke the engine itself: its fault, not the adapter's.
            rec = self.recover(None)
            self.note("engine_unhealthy_after_exception", ok=rec.ok, steps=rec.steps, reason=base.reason)
            return Verdict(ok=False, reason=f"{why}; engine unhealthy after it ({base.reason}); "
                                            f"recovered by {rec.step}" if rec.ok else f"{why}; {rec.detail}",
                           recovery=list(rec.steps), runs=2, judged=False)
        if adapter is not None:
            why += self._count_failure(adapter, why)
        self.note("raised_alone", adapter=adapter, reason=why)
        # judged=False: an error, final as it is (no isolation or ladder run for it again).
        return Verdict(ok=False, reason=why, runs=2, judged=False)

    def _flag_model_behaviour(self, requests, results, bad: list[int]) -> list[int]:
        """Repetition the model reproduces alone on a clean cache is its answer, flagged;
        return the requests that still need the recovery ladder."""
        still: list[int] = []
        for i in bad:
            out, first = results[i]
            if not is_model_behaviour(Health(first.ok, first.reason, first.checks)):
                still.append(i)
                continue
            try:
                self.engine.reset_prefix_cache()
                again, v = self._run_alone(requests[i], first)
            except EngineReplaceRequired:
                raise
            except Exception as exc:  # noqa: BLE001 - could not reproduce: treat as an engine fault
                log.warning("guard: reproduction run raised", exc_info=exc)
                still.append(i)
                continue
            if v.ok:  # healthy on a clean cache: the first run was the engine's, keep this one
                results[i] = (again, v)
            elif self.engine.same_output(again, out):
                v.ok, v.quality, v.reason = True, first.reason, None
                results[i] = (again, v)
                self.note("model_quality", adapter=self.engine.adapter_of(requests[i]), reason=first.reason)
            else:
                results[i] = (again, v)
                still.append(i)
        return still

    @staticmethod
    def _bad(result: tuple[Any | None, Verdict] | None) -> bool:
        return result is not None and result[1].judged and not result[1].ok

    def _run_alone(self, request: Any, before: Verdict) -> tuple[Any, Verdict]:
        [out] = self.engine.run_batch([request])
        v = Verdict.of(self.engine.check(out), isolated_rerun=True, recovery=list(before.recovery),
                       runs=before.runs + 1)
        return out, v

    def _isolate(self, requests, results, bad: list[int]) -> list[int]:
        """Re-run each bad request alone; return those still bad."""
        still: list[int] = []
        for i in bad:
            first = results[i][1]
            results[i] = self._run_alone(requests[i], first)
            v = results[i][1]
            self.note("isolated_rerun", adapter=self.engine.adapter_of(requests[i]), ok=v.ok,
                        reason=v.reason, batch_reason=first.reason)
            if self._bad(results[i]):
                still.append(i)
        return still

    def _recover_all(self, requests, results, bad: list[int]) -> None:
        by_adapter: dict[str | None, list[int]] = {}
        for i in bad:
            by_adapter.setdefault(self.engine.adapter_of(requests[i]), []).append(i)
        for adapter, idxs in by_adapter.items():
            rec = self.recover(adapter)
            for i in idxs:
                out, v = results[i]
                v.recovery = list(rec.steps)
                if not rec.ok:
                    v.reason = f"{v.reason}; {rec.detail}"
                    continue
                out, v2 = self._run_alone(requests[i], v)
                v2.recovered_by = rec.step if v2.ok else None
                if not v2.ok and v2.judged:
                    v2.reason = f"{v2.reason}; still degenerate after {rec.step} (canary ok)"
                    if adapter is not None:
                        # A healthy engine (its canaries pass) still breaks on this input with
                        # this adapter: the adapter's fault on such inputs; it counts.
                        v2.reason += self._count_failure(adapter, v2.reason)
                results[i] = (out, v2)
                self.note("retry_after_recovery", adapter=adapter, step=rec.step, ok=v2.ok,
                            reason=v2.reason)

    # -- recovery ladder ----------------------------------------------------------------
    def recover(self, adapter: str | None) -> Recovery:
        """reset prefix cache -> reload adapter -> rebuild engine, a canary after each step."""
        steps: list[tuple[str, Callable[[], None]]] = [("reset_prefix_cache", self.engine.reset_prefix_cache)]
        if adapter is not None:
            steps.append(("reload_adapter", lambda: self.engine.reload_adapter(adapter)))
        steps.append(("rebuild_engine", self.engine.rebuild_engine))
        done: list[str] = []
        last = Health(False, "no step ran")
        for name, action in steps:
            done.append(name)
            try:
                action()
            except EngineReplaceRequired:
                raise
            except Exception as exc:  # noqa: BLE001 - a failed step is the next step's job
                log.exception("guard recovery step %s failed", name)
                last = Health(False, f"{name} raised {type(exc).__name__}: {exc}")
                self.note("recovery_step", step=name, adapter=adapter, ok=False, reason=last.reason)
                continue
            last = self._canary(adapter, name)
            self.note("recovery_step", step=name, adapter=adapter, ok=last.ok, reason=last.reason)
            if last.ok:
                return Recovery(True, name, done)
        detail = f"recovery failed ({' -> '.join(done)}): {last.reason}"
        if adapter is None:
            self.note("engine_unhealthy", steps=done, reason=last.reason)
            return Recovery(False, None, done, detail + "; engine unhealthy")
        base = self._canary(None, "base_after_ladder")
        if not base.ok:
            # Not the adapter's fault: count nothing against it.
            self.note("engine_unhealthy", adapter=adapter, steps=done, reason=base.reason)
            return Recovery(False, None, done, f"{detail}; base model canary fails too ({base.reason}): "
                                               "engine unhealthy")
        detail += self._count_failure(adapter, f"{last.reason} after {' -> '.join(done)}")
        return Recovery(False, None, done, detail)

    def _count_failure(self, adapter: str, why: str) -> str:
        """One failure against ``adapter``; quarantined at ``quarantine_after``. Returns the
        suffix for the request's reason."""
        self.failures[adapter] += 1
        n = self.failures[adapter]
        if n < self.quarantine_after:
            return ""
        self.quarantined[adapter] = f"{why} ({n} failures)"
        self.note("quarantine", adapter=adapter, failures=n, reason=self.quarantined[adapter])
        return "; adapter now quarantined"

    def _canary(self, adapter: str | None, step: str) -> Health:
        try:
            return self.engine.canary(adapter, step)
        except EngineReplaceRequired:
            raise
        except Exception as exc:  # noqa: BLE001 - a canary that cannot run has failed
            log.exception("guard canary after %s failed to run", step)
            return Health(False, f"canary raised {type(exc).__name__}: {exc}")

    def note(self, kind: str, **fields: Any) -> None:
        """Log and keep a guard event (versions and device included)."""
        self.events.append(event(kind, **fields))
