"""vidlora.feedback.calibration: the model's confidence against what reviewers found, per
adapter version, as a reliability table and its expected calibration error."""

import random

import pytest
from sqlalchemy import select

from tests.support.structured import seed_structured
from vidlora.feedback.calibration import ece_floor, held_out, reliability, scenario_calibration
from vidlora.models import AdapterRelease, Result, Scenario, utcnow


def test_the_reliability_table_and_ece_are_the_textbook_ones():
    # Two bins: 0.9-ish right 3 of 4, 0.2-ish right 1 of 2. ECE = 4/6 |0.75-0.9| + 2/6 |0.5-0.2|.
    points = [(0.9, True), (0.9, True), (0.9, True), (0.9, False), (0.2, True), (0.2, False)]
    rel = reliability(points)
    assert [(b.low, b.count, b.accuracy) for b in rel.bins] == [(0.2, 2, 0.5), (0.9, 4, 0.75)]
    assert rel.ece == pytest.approx(4 / 6 * 0.15 + 2 / 6 * 0.3)
    assert reliability([(1.0, True)]).bins[0].low == 0.9  # 1.0 is in the top bin
    assert reliability([]).ece is None
    assert reliability([(0.5, True), (0.5, False)]).ece == pytest.approx(0.0)  # "50 %" right half the time



def test_chance_alone_is_the_ece_a_perfectly_calibrated_confidence_shows_on_average():
    # Two "50 %" answers: both wrong, one right, both right (1/4, 1/2, 1/4): gaps 0.5, 0, 0.5.
    assert ece_floor([0.5, 0.5]) == pytest.approx(0.25)
    assert ece_floor([1.0, 0.0, 1.0]) == pytest.approx(0.0)  # certain and right: no chance in it
    assert ece_floor([]) is None
    # 150 answers mostly near "93 %", as the demo model's calibrated ones: what drawing each right
    # with its own confidence gives on average, measured, is the floor summed exactly.
    rng = random.Random(61)
    confs = [0.93] * 110 + [0.75] * 20 + [0.5] * 12 + [0.2] * 8
    draws = [reliability([(c, rng.random() < c) for c in confs]).ece for _ in range(3000)]
    assert ece_floor(confs) == pytest.approx(sum(draws) / len(draws), abs=0.002)
    assert 0.03 < ece_floor(confs) < 0.05  # a perfect map, and still 4 points off by chance
    # Four times the answers, half the chance; a bin too big to sum exactly takes the normal law.
    assert ece_floor(confs * 4) == pytest.approx(ece_floor(confs) / 2, rel=0.05)
    big = [0.9] * 1000
    assert ece_floor(big) == pytest.approx((2 / 3.141592653589793) ** 0.5 * (1000 * 0.09) ** 0.5 / 1000)
    draws = [reliability([(c, rng.random() < c) for c in big]).ece for _ in range(1000)]
    assert ece_floor(big) == pytest.approx(sum(draws) / len(draws), rel=0.05)


def test_the_held_out_error_comes_with_the_floor_of_the_answers_it_was_measured_on():
    rng = random.Random(7)
    points = [(c, rng.random() < c) for c in [0.9] * 60 + [0.6] * 40]
    checked = held_out(points, minimum=50)
    assert checked["folds"] == 5 and checked["ece_after"] is not None
    assert 0.0 < checked["ece_floor"] < 0.1
    assert held_out(points[:10], minimum=50)["ece_floor"] is None  # no map: nothing measured


SURE = {"sealed": 0.95, "finds": 0.9}
UNSURE = {"sealed": 0.99, "finds": 0.3}


def test_reviews_say_which_answers_and_fields_were_right(db_session):
    answer = {"sealed": True, "finds": [{"material": "bronze", "period": "han", "confidence": 0.8}]}
    edited = {"sealed": True, "finds": [{"material": "jade", "period": "han", "confidence": 0.8}]}
    seeded = seed_structured([answer] * 5, review_states=["approved", "edited", "rejected", "unreviewed", "approved"],
                             confidences=[SURE, UNSURE, UNSURE, SURE, None], session=db_session)
    db_session.get(Result, seeded.result_ids[1]).edited_parsed = edited  # the reviewer changed the material
    scenario = db_session.scalar(select(Scenario).where(Scenario.name == seeded.scenario))
    [cal] = scenario_calibration(db_session, scenario)
    # approved: right; edited and rejected: wrong; unreviewed and unknown confidence: no point
    assert sorted(cal.answers) == [(0.3, False), (0.3, False), (0.9, True)]
    # fields: the approved answer's both right; the edited one kept "sealed", changed "finds";
    # the rejected one tells nothing per field
    assert sorted(cal.fields) == [(0.3, False), (0.9, True), (0.95, True), (0.99, True)]
    d = cal.as_dict()
    assert d["version"] == "digest-abc" and d["sources"] == {"reviews": 3} and d["answers"]["ece"] == pytest.approx(
        (2 * 0.3 + 0.1) / 3, abs=1e-4)


def test_a_candidates_answers_on_the_gold_set_count_for_its_version(db_session):
    answer = {"sealed": True, "finds": []}
    seeded = seed_structured([answer, answer], review_states=["approved", "approved"], session=db_session)
    for rid in seeded.result_ids:
        db_session.get(Result, rid).gold_at = utcnow()
    scenario = db_session.scalar(select(Scenario).where(Scenario.name == seeded.scenario))
    first, second = (str(r) for r in seeded.result_ids)
    db_session.add(AdapterRelease(scenario_id=scenario.id, version="cand-1", path="/a", status="candidate",
                                  gold_answers={
                                      first: {"parsed": answer, "confidence": {"answer": 0.8, "fields": SURE}},
                                      second: {"parsed": {"sealed": False, "finds": []},
                                               "confidence": {"answer": 0.6, "fields": {"sealed": 0.6, "finds": 1.0}}},
                                  }))
    db_session.flush()
    [cal] = scenario_calibration(db_session, scenario)  # no reviewed answer had a confidence
    assert cal.version == "cand-1" and cal.sources == {"gold": 2}
    assert sorted(cal.answers) == [(0.6, False), (0.8, True)]
    assert sorted(cal.fields) == [(0.6, False), (0.9, True), (0.95, True), (1.0, True)]
