"""vidlora.result_health: one shape for a result's health, from the guard's verdict to the
review page; old stored rows stay readable."""
from __future__ import annotations

from engine_patch.guard import Health, Verdict
from vidlora.result_health import Flag, ResultHealth


def test_a_guard_verdict_round_trips_through_the_stored_dict():
    verdict = Verdict.of(Health(True, None, {"tokens": 12, "logprobs_finite": True}), runs=2, isolated_rerun=True)
    health = ResultHealth.of(verdict.as_health()).with_schema(False)
    assert ResultHealth.of(health.as_dict()) == health
    assert health.ok and health.runs == 2 and health.schema_ok is False and health.checks["tokens"] == 12


def test_rows_written_before_a_field_existed_still_read():
    old = ResultHealth.of({"ok": True, "degenerate": False, "repetition": 0.12})
    assert old.ok and old.schema_ok is None and old.runs == 1
    assert old.checks == {"degenerate": False, "repetition": 0.12}  # unknown keys kept, shown
    assert ResultHealth.of(None) == ResultHealth() and not ResultHealth().ok  # no verdict: not healthy


def test_flags_say_what_matters_first_and_in_words():
    bad = ResultHealth(ok=False, reason="token-0 run of 8", schema_ok=True, quarantined=True,
                       checks={"logprobs_finite": False, "all_bang": True, "top_token_frac": 0.5})
    flags = bad.flags()
    assert flags[0] == Flag("guard", "not healthy: token-0 run of 8", "bad")
    assert Flag("schema", "matches", "good") in flags and Flag("adapter", "quarantined", "bad") in flags
    assert Flag("logprobs finite", "no", "bad") in flags and Flag("all bang", "yes", "bad") in flags
    good = ResultHealth(ok=True, checks={"logprobs_finite": True, "all_bang": False})
    assert [f.kind for f in good.flags()] == ["good", "good", "good"]


def test_the_summary_says_the_verdict_in_words():
    assert ResultHealth(ok=True).summary() == Flag("health", "healthy", "good")
    assert ResultHealth(ok=True, isolated_rerun=True, runs=2).summary().value == \
        "healthy, re-run alone after a bad batch-mate"
    assert ResultHealth(ok=False, reason="non-finite logprobs").summary() == \
        Flag("health", "failed: non-finite logprobs", "bad")
    assert ResultHealth(ok=True, recovered_by="reset_prefix_cache").summary().value == \
        "healthy after the engine recovered (reset_prefix_cache)"
    assert ResultHealth(ok=True, schema_ok=False).summary().kind == "bad"
    assert ResultHealth(ok=True, quality="a repetition loop").summary().value.endswith("is a repetition loop")
