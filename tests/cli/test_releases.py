"""`vidlora scenarios promote | versions` and `vidlora eval --compare` on a candidate's gold run
(issue 61): a version that cannot answer never serves; a worse one waits; a person may force
either with a reason the history keeps; every command says what happened in words.

The gold runs are stored by the product's own ``tasks.gold_run.store_answers`` from engine
outputs of the shapes the engine host returns (an answer; the refusal its guard gives an
adapter that changes nothing); ``tests/system/pipelines/test_feedback_loop.py`` makes the same
refusal through the real engine."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.support.cli import vidlora
from tests.support.structured import seed_structured
from vidlora.db import session_scope
from vidlora.engine_io import AnalysisOutput
from vidlora.models import AdapterRelease

BRONZE = {"sealed": True, "finds": [{"material": "bronze", "period": "han", "confidence": 0.8}]}
JADE = {"sealed": True, "finds": [{"material": "jade", "period": "han", "confidence": 0.8}]}
NOOP = ("adapter 'tomb-candidate-x' refused: adapter changes nothing (max logprob change 0.00015): "
        "modules not placed? (#49354)")


def answer(key: str, value: dict) -> AnalysisOutput:
    return AnalysisOutput(request_key=key, text=json.dumps(value), token_ids=[], prompt_tokens=10, output_tokens=5,
                          latency_s=0.1, finish_reason="stop", cumulative_logprob=None)


def gold_scenario(n: int) -> tuple[str, list[int]]:
    """n approved results of a new scenario, all marked gold (as `vidlora gold add` does)."""
    from vidlora.models import Result
    from web.review.actions import apply_review

    seeded = seed_structured([BRONZE] * n)
    with session_scope() as session:
        for rid in seeded.result_ids:
            result = session.get(Result, rid)
            apply_review(session, result, "approve", None, version=result.review_version)
    out = vidlora("gold", "add", *map(str, seeded.result_ids))
    assert out.returncode == 0, out.stderr
    return seeded.scenario, seeded.result_ids


def candidate(scenario: str, tmp_path, name: str) -> tuple[int, str]:
    from demo_model import ADAPTERS

    folder = tmp_path / name
    shutil.copytree(ADAPTERS / "tomb_structure", folder)
    (folder / "README.md").write_text(f"{name} of {scenario}\n")  # a version of its own, by content
    out = vidlora("scenarios", "register", scenario, str(folder), "--no-gold-run")
    assert out.returncode == 0, out.stderr
    version = out.stdout.split("adapter version ")[1].split()[0]
    with session_scope() as session:
        release_id = session.query(AdapterRelease).filter_by(version=version).one().id
    return release_id, version


def gold_run(release_id: int, outputs: list[AnalysisOutput]) -> None:
    from tasks.gold_run import store_answers
    from tests.support.structured import CATALOGUE

    store_answers(release_id, outputs, CATALOGUE)


def test_a_candidate_whose_gold_run_was_refused_never_serves_unless_forced_with_a_reason(database, tmp_path):
    scenario, ids = gold_scenario(3)
    release_id, version = candidate(scenario, tmp_path, "v2")

    out = vidlora("scenarios", "promote", scenario, version[:12])
    assert out.returncode != 0 and "has not answered the gold set" in out.stderr, out.stderr

    gold_run(release_id, [AnalysisOutput.failed(str(rid), NOOP) for rid in ids])
    text = vidlora("eval", scenario, "--compare", version[:12]).stdout
    assert "answered 0 of 3 gold videos; 3 refused: adapter changes nothing (max logprob change 0.00015)" in text
    assert "candidate: no answer (refused: adapter changes nothing" in text and "promote: refuses" in text
    report = json.loads(vidlora("eval", scenario, "--compare", version[:12], "--json").stdout)
    assert (report["candidate_answered"], report["gold_run"]["refused"], report["promotable"]) == (0, 3, False)
    assert {c["why"] for c in report["changed"]} == {"refused: " + NOOP.split("refused: ", 1)[1]}

    out = vidlora("scenarios", "promote", scenario, version[:12])
    assert out.returncode != 0
    assert "3 refused: adapter changes nothing" in out.stderr and '--force --reason "why"' in out.stderr
    listed = vidlora("scenarios", "versions", scenario).stdout
    assert "answered 0 of 3 gold videos; 3 refused" in listed and "promote: refuses" in listed
    assert f"serving: {version}" not in listed

    out = vidlora("scenarios", "promote", scenario, version[:12], "--force")
    assert out.returncode == 2 and "--reason" in out.stderr
    out = vidlora("scenarios", "promote", scenario, version[:12], "--force", "--reason", "the guard misjudges it")
    assert out.returncode == 0 and "now serving" in out.stdout and "reason kept: the guard misjudges it" in out.stderr
    listed = vidlora("scenarios", "versions", scenario).stdout
    assert f"serving: {version}" in listed
    assert "promoted by force over: its gold run answered 0 of 3" in listed and "reason: the guard misjudges it" in listed


def test_a_candidate_worse_than_the_stored_answers_beyond_the_interval_waits(database, tmp_path):
    scenario, ids = gold_scenario(12)
    worse_id, worse = candidate(scenario, tmp_path, "worse")
    gold_run(worse_id, [answer(str(rid), JADE) for rid in ids])  # every material wrong: 0 of 12 (0-24 %)
    out = vidlora("scenarios", "promote", scenario, worse[:12])
    assert out.returncode != 0, out.stdout
    assert "right 0 % (0 of 12) on the gold set, worse than the stored answers, 100 % (12 of 12), beyond the 95 % intervals (up to 24 % against at least 76 %)" in out.stderr

    close_id, close = candidate(scenario, tmp_path, "close")
    gold_run(close_id, [answer(str(rid), JADE if i == 0 else BRONZE) for i, rid in enumerate(ids)])  # 11 of 12
    report = json.loads(vidlora("eval", scenario, "--compare", close[:12], "--json").stdout)
    assert report["promotable"] and report["gold_run"]["summary"] == "answered 12 of 12 gold videos"
    out = vidlora("scenarios", "promote", scenario, close[:12])
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("outputs, words", [
    (lambda ids: [answer(str(ids[0]), BRONZE)], "answered 1 of 2 gold videos; 1 not answered"),
    (lambda ids: [answer(str(ids[0]), BRONZE), AnalysisOutput.failed(str(ids[1]), "engine error: out of memory")],
     "answered 1 of 2 gold videos; 1 failed: engine error: out of memory"),
])
def test_a_gold_run_with_an_error_or_a_missing_answer_is_not_enough(database, tmp_path, outputs, words):
    scenario, ids = gold_scenario(2)
    release_id, version = candidate(scenario, tmp_path, "v2")
    gold_run(release_id, outputs(ids))
    out = vidlora("scenarios", "promote", scenario, version[:12])
    assert out.returncode != 0 and words in out.stderr, out.stderr
