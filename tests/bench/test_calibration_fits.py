"""bench/calibration_fits.py's random halves (issue 61): every answer dealt into two halves per
kind, each half through the maps fitted on the other, against what chance alone gives."""

import random
import statistics

import pytest

from bench.calibration_fits import METHODS, _split_by_kind, random_halves

AS_GIVEN = {"as given": lambda own, pool: (lambda c: c)}  # no map: the confidence itself


def synthetic(seed: int, per_kind: int = 150) -> list[dict]:
    """Answers right with probability their confidence: perfectly calibrated as they stand."""
    rng = random.Random(seed)
    rows = []
    for kind in ("tomb", "mural"):
        for _ in range(per_kind):
            c = rng.uniform(0.3, 1.0)
            rows.append({"kind": kind, "confidence": c, "right": rng.random() < c})
    return rows


def test_the_halves_split_each_kind_in_two():
    rows = synthetic(1, per_kind=151)
    a, b = _split_by_kind(rows, random.Random(0))
    assert sorted(map(id, a + b)) == sorted(map(id, rows))  # every answer in exactly one half
    for kind in ("tomb", "mural"):
        assert (sum(r["kind"] == kind for r in a), sum(r["kind"] == kind for r in b)) == (76, 75)


def test_the_halves_report_per_fit_over_the_same_splits():
    methods = {**AS_GIVEN, "product": METHODS["product: isotonic per kind"], "Platt pooled": METHODS["Platt pooled"]}
    out = random_halves(methods, synthetic(2), splits=4, seed=7)
    assert list(out) == list(methods)
    for e in out.values():
        assert e["splits"] == 4 and e["answers_per_half"] == [150, 150]
        assert 0 < e["ece_floor_mean"] < 0.2 and 0 < e["ece_mean"] < 0.2 and e["ece_sd"] > 0
        assert 0 <= e["both_within_goal"] <= 1 and 0 <= e["chance_both_within_goal"] <= 1
    assert random_halves(methods, synthetic(2), splits=4, seed=7) == out  # the seed fixes the splits and draws
    assert random_halves(AS_GIVEN, synthetic(2), splits=4, seed=8) != random_halves(AS_GIVEN, synthetic(2), 4, 7)
    assert random_halves(AS_GIVEN, synthetic(2), splits=0, seed=7)["as given"]["ece_mean"] is None


def test_a_perfectly_calibrated_confidence_shows_its_floor_on_average():
    # The halves of one set of answers share its luck; over 30 sets the mean ECE of a half is the
    # mean floor (7.3 % on 150 answers), and both halves land within 5 % as often as chance says.
    outs = [random_halves(AS_GIVEN, synthetic(100 + s), splits=5, seed=s)["as given"] for s in range(30)]
    floor = statistics.fmean(o["ece_floor_mean"] for o in outs)
    assert 0.06 < floor < 0.085
    assert statistics.fmean(o["ece_mean"] for o in outs) == pytest.approx(floor, abs=0.008)
    assert statistics.fmean(o["both_within_goal"] for o in outs) == pytest.approx(
        statistics.fmean(o["chance_both_within_goal"] for o in outs), abs=0.05)
