"""engine_patch.guard: the output checks, and the guard's isolate / recover / quarantine logic.

The guard logic is tested here against a narrow fake of the host's ``GuardedEngine``
protocol (faults a real engine cannot be made to produce on demand: poisoned batch-mates,
faults cured by exactly one ladder step). The real engine path is covered by
tests/workers/test_engine_host.py and tests/system/pipelines/test_degenerate_output.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace as NS

import pytest

from engine_patch.guard import Guard, Health, check_output


@pytest.mark.parametrize("tokens,lps,text,ok", [
    ([5, 6, 7], [-0.1, -0.2, -0.3], "a b c", True),
    ([5, 6, 7], [-0.1, float("nan"), -0.3], "a b c", False),
    ([5, 6, 7], [-0.1, float("-inf"), -0.3], "a b c", False),
    ([0, 0, 0, 0, 0], None, "!!!!!", False),
    ([3, 0, 0, 0, 0, 0], None, "x!!!!!", False),
    ([9] * 20, None, "z" * 20, False),
    ([1, 2] * 10, None, "ab" * 10, False),
    ([1], [-1.0], " !!! ", False),
    (list(range(20)), None, "fine text", True),
    ([7, 8, 9] * 3, None, "short loops are not runaway", True),  # under min_len_for_repeat
])
def test_check_output(tokens, lps, text, ok):
    assert check_output(tokens, lps, text).ok is ok


def test_check_output_reports_every_check_and_the_first_reason():
    h = check_output([0] * 20, [float("nan")] * 20, "!" * 20)
    assert not h.ok and h.reason == "non-finite logprobs (20)"
    assert h.checks == {"tokens": 20, "logprobs_finite": False, "token0_run": 20, "all_bang": True,
                        "top_token_frac": 1.0, "loop_period": 2}
    good = check_output(list(range(20)), [-0.5] * 20, "fine", cumulative_logprob=-10.0)
    assert good.ok and good.reason is None and good.checks["logprobs_finite"] is True
    assert not check_output([1, 2], [-0.1, -0.1], "ab", cumulative_logprob=float("nan")).ok
    assert check_output([4, 5] * 12, None, "xy" * 12).reason == "runaway repetition (period 2)"


# -- a fake engine host ------------------------------------------------------------------------

GOOD = ([4, 5, 6], "ok")
BAD = ([0] * 6, "!!!!!!")


@dataclass
class FakeEngine:
    """Requests are NS(key, adapter). ``faults`` maps an adapter to what cures it:
    "reset_prefix_cache" | "reload_adapter" | "rebuild_engine" | "never". An adapter in
    ``poisoners`` also spoils every batch-mate (not itself alone, unless it has a fault)."""

    faults: dict[str, str] = field(default_factory=dict)
    poisoners: set[str] = field(default_factory=set)
    base_broken: bool = False
    fail_step: str | None = None
    log: list = field(default_factory=list)

    def run_batch(self, requests):
        self.log.append(("run", [r.key for r in requests]))
        poisoned = len(requests) > 1 and any(r.adapter in self.poisoners for r in requests)
        outs = []
        for r in requests:
            if getattr(r, "error", None):
                outs.append(NS(key=r.key, error=r.error, tokens=[], text=""))
                continue
            bad = poisoned or r.adapter in self.faults or (r.adapter is None and self.base_broken)
            tokens, text = BAD if bad else GOOD
            outs.append(NS(key=r.key, error=None, tokens=tokens, text=text))
        return outs

    def check(self, out):
        return None if out.error else check_output(out.tokens, None, out.text)

    def adapter_of(self, request):
        return request.adapter

    def same_output(self, a, b):
        return a.tokens == b.tokens

    def _step(self, name, adapter=None):
        self.log.append((name, adapter))
        if name == self.fail_step:
            raise RuntimeError(f"{name} broke")
        for a, cure in list(self.faults.items()):
            if cure == name and (name != "reload_adapter" or a == adapter):
                del self.faults[a]

    def reset_prefix_cache(self):
        self._step("reset_prefix_cache")

    def reload_adapter(self, adapter):
        self._step("reload_adapter", adapter)

    def rebuild_engine(self):
        self._step("rebuild_engine")

    def canary(self, adapter, step):
        self.log.append(("canary", adapter, step))
        ok = not self.base_broken and adapter not in self.faults
        return Health(ok, None if ok else "canary: token-0 run of 8")


def req(key, adapter=None, **kw):
    return NS(key=key, adapter=adapter, **kw)


def runs(engine):
    return [keys for kind, *rest in engine.log if kind == "run" for keys in rest]


# -- the guard ---------------------------------------------------------------------------------


def test_healthy_batch_runs_once():
    engine = FakeEngine()
    guard = Guard(engine)
    results = guard.generate([req("a"), req("b", "x")])
    assert runs(engine) == [["a", "b"]]
    assert [o.key for o, _ in results] == ["a", "b"]
    for _, v in results:
        assert v.as_health() == {"ok": True, "reason": None, "checks": v.checks, "isolated_rerun": False,
                                 "recovery": [], "recovered_by": None, "quarantined": False, "runs": 1,
                                 "quality": None}
        assert v.checks["logprobs_finite"] and v.checks["token0_run"] == 0
    assert not guard.events


def test_poisoned_mates_are_rerun_alone_and_the_culprit_fails():
    engine = FakeEngine(faults={"bad": "never"}, poisoners={"bad"})
    guard = Guard(engine, quarantine_after=5)
    results = guard.generate([req("p1"), req("p2", "good"), req("p3", "bad")])
    (o1, v1), (o2, v2), (o3, v3) = results
    assert runs(engine)[:4] == [["p1", "p2", "p3"], ["p1"], ["p2"], ["p3"]]
    assert v1.ok and v1.isolated_rerun and v1.runs == 2 and o1.text == "ok"
    assert v2.ok and v2.isolated_rerun and v2.recovery == []
    assert not v3.ok and v3.recovery == ["reset_prefix_cache", "reload_adapter", "rebuild_engine"]
    assert v3.reason.startswith("token id 0 generated 6 times in a row; recovery failed")
    # One canary per step, then the base model's canary decides whose fault it is.
    canaries = [e[1:] for e in engine.log if e[0] == "canary"]
    assert canaries == [("bad", "reset_prefix_cache"), ("bad", "reload_adapter"),
                        ("bad", "rebuild_engine"), (None, "base_after_ladder")]
    assert guard.failures["bad"] == 1 and not guard.is_quarantined("bad")
    kinds = [e["event"] for e in guard.events]
    assert kinds[0] == "bad_batch" and kinds.count("isolated_rerun") == 3
    assert kinds.count("recovery_step") == 3
    # Every event names the versions that decide LoRA numerics, and the device.
    assert all({"vllm", "torch", "triton", "ptxas", "device"} <= set(e) for e in guard.events)


@pytest.mark.parametrize("cure,steps", [
    ("reset_prefix_cache", ["reset_prefix_cache"]),
    ("reload_adapter", ["reset_prefix_cache", "reload_adapter"]),
    ("rebuild_engine", ["reset_prefix_cache", "reload_adapter", "rebuild_engine"]),
])
def test_ladder_stops_at_the_first_step_whose_canary_passes(cure, steps):
    engine = FakeEngine(faults={"x": cure})
    guard = Guard(engine)
    [(out, v)] = guard.generate([req("r", "x")])
    assert v.ok and out.text == "ok"
    assert v.recovery == steps and v.recovered_by == cure
    assert v.isolated_rerun and v.runs == 2  # a one-request batch is not re-run before the ladder
    assert [e[0] for e in engine.log if e[0] in ("reset_prefix_cache", "reload_adapter",
                                                  "rebuild_engine")] == steps
    assert not guard.failures


def test_ladder_runs_once_per_adapter_per_batch():
    engine = FakeEngine(faults={"x": "reload_adapter"})
    guard = Guard(engine)
    results = guard.generate([req("r1", "x"), req("r2", "x"), req("r3")])
    assert all(v.ok for _, v in results)
    assert sum(1 for e in engine.log if e[0] == "reset_prefix_cache") == 1
    assert [v.recovered_by for _, v in results] == ["reload_adapter", "reload_adapter", None]


def test_quarantine_after_repeated_failures_refuses_without_running():
    engine = FakeEngine(faults={"bad": "never"})
    guard = Guard(engine, quarantine_after=2)
    [(_, v)] = guard.generate([req("1", "bad")])
    assert not v.ok and not guard.is_quarantined("bad")
    [(_, v)] = guard.generate([req("2", "bad")])
    assert not v.ok and guard.is_quarantined("bad") and v.reason.endswith("adapter now quarantined")
    assert any(e["event"] == "quarantine" and e["adapter"] == "bad" for e in guard.events)

    before = len(runs(engine))
    results = guard.generate([req("3", "bad"), req("4", "good")])
    (o3, v3), (o4, v4) = results
    assert runs(engine)[before:] == [["4"]]  # the quarantined adapter's request never ran
    assert o3 is None and v3.quarantined and v3.runs == 0
    assert v3.reason.startswith("adapter quarantined: canary: token-0 run of 8 after reset_prefix_cache")
    assert v4.ok

    guard.release("bad")  # a new version of it: clean record
    assert not guard.is_quarantined("bad") and guard.failures["bad"] == 0


def test_engine_fault_is_not_counted_against_the_adapter():
    engine = FakeEngine(faults={"x": "never"}, base_broken=True)
    guard = Guard(engine, quarantine_after=1)
    [(_, v)] = guard.generate([req("r", "x")])
    assert not v.ok and "engine unhealthy" in v.reason
    assert not guard.failures and not guard.quarantined
    [(_, v)] = guard.generate([req("base")])  # the base model: no adapter to reload
    assert not v.ok and v.recovery == ["reset_prefix_cache", "rebuild_engine"]
    assert "engine unhealthy" in v.reason


def test_a_step_that_raises_hands_over_to_the_next():
    engine = FakeEngine(faults={"x": "rebuild_engine"}, fail_step="reload_adapter")
    guard = Guard(engine)
    [(_, v)] = guard.generate([req("r", "x")])
    assert v.ok and v.recovered_by == "rebuild_engine"
    step_events = [e for e in guard.events if e["event"] == "recovery_step"]
    assert "reload_adapter raised RuntimeError" in step_events[1]["reason"]


def test_error_outputs_are_not_judged_or_rerun():
    engine = FakeEngine()
    guard = Guard(engine)
    [(out, v), (_, ok)] = guard.generate([req("e", error="frame not found"), req("g")])
    assert out.error == "frame not found"
    assert not v.ok and not v.judged and v.reason is None and v.runs == 1
    assert ok.ok and runs(engine) == [["e", "g"]]


class Looping(FakeEngine):
    """Every request loops ("ab" x 10), with finite logprobs: what a model does by itself."""

    def run_batch(self, requests):
        self.log.append(("run", [r.key for r in requests]))
        return [NS(key=r.key, error=None, tokens=[1, 2] * 10, text="ab" * 10) for r in requests]


def test_repetition_the_model_reproduces_is_its_answer_flagged_not_a_fault():
    engine = Looping()
    guard = Guard(engine, quarantine_after=1)
    [(out, v)] = guard.generate([req("r", "x")])
    assert v.ok and v.quality == "runaway repetition (period 2)" and v.reason is None
    assert v.as_health()["quality"] == v.quality and out.text == "ab" * 10
    # Reproduced alone on a clean cache; no recovery ladder, nothing held against the adapter.
    assert runs(engine) == [["r"], ["r"]] and ("reset_prefix_cache", None) in engine.log
    assert ("rebuild_engine", None) not in engine.log and v.recovery == [] and not guard.failures
    assert [e["event"] for e in guard.events] == ["bad_batch", "model_quality"]


def test_repetition_that_does_not_reproduce_keeps_the_healthy_rerun():
    class Flaky(FakeEngine):
        def run_batch(self, requests):
            self.log.append(("run", [r.key for r in requests]))
            first = len(runs(self)) == 1
            return [NS(key=r.key, error=None, tokens=[1, 2] * 10 if first else [4, 5, 6],
                       text="ab" * 10 if first else "ok") for r in requests]

    engine = Flaky()
    [(out, v)] = Guard(engine).generate([req("r", "x")])
    assert v.ok and v.quality is None and out.text == "ok" and v.runs == 2


def test_engine_signature_still_bad_on_a_healthy_engine_counts_against_the_adapter():
    # Non-finite / token-0 output that survives a recovery step whose canary passes: the
    # adapter breaks on this input; it fails and counts (quarantine_after=1 quarantines).
    class Broken(FakeEngine):
        def run_batch(self, requests):
            self.log.append(("run", [r.key for r in requests]))
            return [NS(key=r.key, error=None, tokens=BAD[0], text=BAD[1]) for r in requests]

    engine = Broken()
    guard = Guard(engine, quarantine_after=1)
    [(_, v)] = guard.generate([req("r", "x")])
    assert not v.ok and v.recovery == ["reset_prefix_cache"] and v.recovered_by is None
    assert "still degenerate after reset_prefix_cache (canary ok)" in v.reason
    assert v.reason.endswith("adapter now quarantined") and guard.is_quarantined("x")


class Raising(FakeEngine):
    """run_batch raises whenever a request of adapter "boom" is in the batch."""

    def run_batch(self, requests):
        if any(r.adapter == "boom" for r in requests):
            self.log.append(("raise", [r.key for r in requests]))
            raise RuntimeError("CUDA error: too many resources requested for launch (boom)")
        return super().run_batch(requests)


def test_an_engine_exception_is_isolated_and_only_its_request_fails():
    engine = Raising()
    guard = Guard(engine, quarantine_after=2)
    results = guard.generate([req("a"), req("b", "boom"), req("c", "good")])
    (oa, va), (ob, vb), (oc, vc) = results
    assert va.ok and vc.ok and oa.text == oc.text == "ok" and va.isolated_rerun
    assert ob is None and not vb.ok and not vb.judged
    assert vb.reason.startswith("engine raised RuntimeError: CUDA error") and "boom" in vb.reason
    assert guard.failures["boom"] == 1 and not guard.is_quarantined("boom")
    assert ("rebuild_engine", None) not in engine.log  # the base canary passed: engine healthy
    guard.generate([req("b2", "boom")])
    assert guard.is_quarantined("boom")
    [(_, v)] = guard.generate([req("b3", "boom")])
    assert v.quarantined and v.runs == 0


def test_an_exception_that_breaks_the_engine_runs_the_engine_ladder():
    class Breaking(Raising):
        def run_batch(self, requests):
            try:
                return super().run_batch(requests)
            except RuntimeError:
                self.base_broken = True  # the error left the engine broken
                self.faults["__engine__"] = "rebuild_engine"
                raise

        def rebuild_engine(self):
            super().rebuild_engine()
            self.base_broken = False

    engine = Breaking()
    guard = Guard(engine)
    [(_, v)] = guard.generate([req("b", "boom")])
    assert not v.ok and "engine unhealthy after it" in v.reason and "recovered by rebuild_engine" in v.reason
    assert v.recovery == ["reset_prefix_cache", "rebuild_engine"]
    assert not guard.failures  # the engine's fault, not the adapter's


def test_engine_replace_required_goes_to_the_worker():
    from engine_patch.guard import EngineReplaceRequired

    class Unrebuildable(FakeEngine):
        def rebuild_engine(self):
            raise EngineReplaceRequired("device memory not freed")

    engine = Unrebuildable(faults={"x": "rebuild_engine"})
    with pytest.raises(EngineReplaceRequired):
        Guard(engine).generate([req("r", "x")])


@pytest.mark.parametrize("error", [
    "CUDA error: device-side assert triggered",
    "CUDA error: an illegal memory access was encountered",
    "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, ...)`",
])
def test_a_sticky_cuda_error_replaces_the_process_without_trying_in_place(error):
    # Seen on the H200 (vLLM 0.32): after one, every later call fails and an in-process
    # rebuild fails too, so the guard neither isolates nor runs the ladder.
    from engine_patch.guard import EngineReplaceRequired, is_context_lost

    class ContextLost(FakeEngine):
        def run_batch(self, requests):
            self.log.append(("run", [r.key for r in requests]))
            raise RuntimeError(error)

    engine = ContextLost()
    with pytest.raises(EngineReplaceRequired, match="device context is lost"):
        Guard(engine).generate([req("a"), req("b", "x")])
    assert runs(engine) == [["a", "b"]]
    assert not any(kind in ("canary", "rebuild_engine", "reset_prefix_cache") for kind, *_ in engine.log)
    assert is_context_lost(RuntimeError(error)) and not is_context_lost(RuntimeError("CUDA out of memory"))


def test_schema_shaped_output_is_not_runaway_repetition():
    """A JSON array of similar items repeats by design; engine faults are still caught in it."""
    items = [11, 12, 13, 14] * 12  # a period-4 loop: repetition for free text
    assert not check_output(items, [-0.1] * len(items), "[...]").ok
    assert check_output(items, [-0.1] * len(items), "[...]", repetition=False).ok
    assert not check_output(items, [float("nan")] * len(items), "[...]", repetition=False).ok
