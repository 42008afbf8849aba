"""vidlora.memo: the Scenarios page scores a scenario's reviewed answers once, and again only
once its results changed: a review, a new result."""

from sqlalchemy import select

from tests.support.reads import answers_read
from tests.support.structured import seed_structured
from vidlora.db import session_scope
from vidlora.feedback.calibration import scenario_calibration
from vidlora.feedback.measure import scenario_agreement
from vidlora.models import Result, Scenario

ANSWER = {"sealed": True, "finds": [{"material": "bronze", "period": "han", "confidence": 0.8}]}
SURE = {"sealed": 0.95, "finds": 0.9}


def _measures(name: str):
    with session_scope() as session:
        scenario = session.scalar(select(Scenario).where(Scenario.name == name))
        [agreement] = scenario_agreement(session, scenario)
        [calibration] = scenario_calibration(session, scenario)
        return agreement.as_dict(), calibration.as_dict()


def test_a_scenarios_measures_are_scored_once_until_a_review_changes_them(database):
    from web.review.actions import apply_review

    seeded = seed_structured([ANSWER] * 3, review_states=["approved", "unreviewed", "unreviewed"],
                             confidences=[SURE] * 3)
    with answers_read() as reads:
        first = _measures(seeded.scenario)
        assert reads and first[0]["approved"]["count"] == 1 and first[1]["sources"] == {"reviews": 1}
        reads.clear()
        assert _measures(seeded.scenario) == first and not reads  # the page seen again: nothing re-read
        with session_scope() as session:
            apply_review(session, session.get(Result, seeded.result_ids[1]), "reject", None, version=0)
        after = _measures(seeded.scenario)
    assert reads and after[0]["rejected"]["count"] == 1 and after[0]["unreviewed"] == 1
    assert after[1]["sources"] == {"reviews": 2}


def test_a_new_result_is_counted_at_once(database):
    seeded = seed_structured([ANSWER], review_states=["approved"])
    assert _measures_agreement(seeded.scenario)["results"] == 1
    more = seed_structured([ANSWER])  # its own scenario: move the result into the first one
    with session_scope() as session:
        result = session.get(Result, more.result_ids[0])
        mine = session.scalar(select(Scenario.id).where(Scenario.name == seeded.scenario))
        result.analysis.scenario_id = mine
    assert _measures_agreement(seeded.scenario)["results"] == 2


def _measures_agreement(name: str) -> dict:
    with session_scope() as session:
        scenario = session.scalar(select(Scenario).where(Scenario.name == name))
        return scenario_agreement(session, scenario)[0].as_dict()


def test_agreement_and_calibration_read_and_score_the_answers_once_between_them(database):
    """The Scenarios page shows both measures: one read of the reviewed answers serves both."""
    seeded = seed_structured([ANSWER] * 3, review_states=["approved", "rejected", "unreviewed"],
                             confidences=[SURE] * 3)
    with answers_read() as reads:
        agreement, calibration = _measures(seeded.scenario)
    assert len(reads) == 1, reads
    assert agreement["approved"]["count"] == 1 and agreement["rejected"]["count"] == 1
    assert calibration["sources"] == {"reviews": 2} and calibration["answers"]["right"] == 1


def test_after_a_review_only_the_reviewed_answer_is_read_and_scored_again(database):
    from web.review.actions import apply_review

    seeded = seed_structured([ANSWER] * 4, review_states=["approved", "approved", "rejected", "unreviewed"],
                             confidences=[SURE] * 4)
    first = _measures(seeded.scenario)
    with session_scope() as session:
        apply_review(session, session.get(Result, seeded.result_ids[3]), "approve", None, version=0)
    with answers_read() as reads:
        after = _measures(seeded.scenario)
    [(statement, parameters)] = reads
    ids = [v for k, v in parameters.items() if k.startswith("id_")]  # the expanded IN list
    assert "result.id IN" in statement and ids == [seeded.result_ids[3]], (statement, parameters)
    assert (first[0]["approved"]["count"], after[0]["approved"]["count"]) == (2, 3)
    assert after[1]["sources"] == {"reviews": 4} and after[1]["answers"]["right"] == 3


def test_a_process_forked_while_another_thread_held_the_memo_can_use_it():
    """A server that forks its workers (gunicorn --preload) while the start-up warm-up may be
    keeping a measure."""
    import os

    from vidlora import memo

    memo.remembered(("fork test",), lambda: 1)
    with memo._lock:  # the warm-up thread, mid-update, at the moment of the fork
        pid = os.fork()
        if pid == 0:  # the worker: its copy of the lock must not be held
            import signal

            signal.alarm(10)
            ok = memo.remembered(("fork test",), lambda: 2) == 1 and memo.remembered(("other",), lambda: 3) == 3
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
