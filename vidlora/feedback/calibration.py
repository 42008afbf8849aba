"""Calibration per adapter version: does the model's confidence mean what it says?

Each reviewed answer with a confidence (``vidlora.results.confidence``) is one point: the
confidence, and whether the answer was right.

- **Reviews**: the model's answer against the one the review left, by the rule agreement and
  the gold comparison use (``scores.answer_right``: exact choices, a tolerance for numbers,
  normalised text), so an edit within the number tolerance leaves the answer right, as a gold
  answer within it does; a rejected answer is wrong. Per top-level field: an approved or
  edited answer's field is right when the reviewed answer kept it, by the same rule; a
  rejected answer says nothing about which field was wrong, so its fields are left out.
- **The gold set**: a candidate version's answers on the gold videos (``vidlora eval
  --compare``) against the reviewed gold answers, the same way.

Points fall in equal-width bins of confidence; each bin's accuracy beside its mean confidence
is the reliability table, and the expected calibration error (ECE) is the bins' gap weighted
by their share of points: 0 is a model whose "80 %" is right 80 % of the time.

The map (issue 61): the model's own confidence orders the review queue well but is
over-confident. Each adapter version gets a map from it to the share of answers like it that
were right, fitted on the version's points above: isotonic regression (pool adjacent
violators), so the map never reverses the queue's order, each pooled block's rate shrunk by one
pseudo-answer towards its mean raw confidence (a block of 3 answers does not say "100 %").
Below ``VIDLORA_CALIBRATION_MIN_ANSWERS`` points a version has no map and its confidence is shown
as the model gave it. The map is fitted from the points whenever it is asked for, so every
new review refits it; its error is measured on answers it was not fitted on (k-fold).

How low that error can go depends on the count, not only on the map: even a confidence that is
exactly right scatters around its bins' means, by chance which answers came out right, and the
ECE adds those gaps up. ``ece_floor`` is that chance part (what a perfectly calibrated confidence
shows on the same answers, on average): with 150 answers mostly near "95 %", about 6 %, so an
error near the floor is all that many answers can tell, and a goal under it needs more answers.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from vidlora.feedback.gold import gold_results
from vidlora.feedback.scores import ScenarioReviews, Scored, reviewed_answer, scenario_reviews, score
from vidlora.models import AdapterRelease, Result, Scenario
from vidlora.results.fields import FieldSpec

BINS = 10


@dataclass(frozen=True)
class Bin:
    low: float
    high: float
    count: int
    confidence: float  # mean confidence of its points
    accuracy: float  # share of its points that were right

    def as_dict(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high, "count": self.count,
                "confidence": round(self.confidence, 4), "accuracy": round(self.accuracy, 4),
                "gap": round(self.accuracy - self.confidence, 4)}


@dataclass(frozen=True)
class Reliability:
    count: int
    right: int
    ece: float | None
    bins: list[Bin]

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "right": self.right, "ece": None if self.ece is None else round(self.ece, 4),
                "bins": [b.as_dict() for b in self.bins]}


def reliability(points: Iterable[tuple[float, bool]], bins: int = BINS) -> Reliability:
    """The reliability table (non-empty bins only) and ECE of (confidence, right) points."""
    count, right, total = [0] * bins, [0] * bins, [0.0] * bins  # per bin: sums, not lists (10,000 points a view)
    for conf, ok in points:
        i = min(int(max(conf, 0.0) * bins), bins - 1)
        count[i] += 1
        right[i] += bool(ok)
        total[i] += conf
    n = sum(count)
    out, ece = [], 0.0
    for i in range(bins):
        if not count[i]:
            continue
        conf, acc = total[i] / count[i], right[i] / count[i]
        out.append(Bin(i / bins, (i + 1) / bins, count[i], conf, acc))
        ece += count[i] / n * abs(acc - conf)
    return Reliability(n, sum(right), ece if n else None, out)


EXACT_BIN = 200  # points in a bin up to which its floor is summed exactly (quadratic in them)


def ece_floor(confidences: Iterable[float], bins: int = BINS) -> float | None:
    """The ECE that a perfectly calibrated confidence shows on these answers, on average: each
    answer right with probability its confidence, independently. Per bin the number right is then
    a sum of unequal coin flips (Poisson binomial), summed exactly; a bin of more than
    ``EXACT_BIN`` answers takes its normal approximation (E|N(0, s)| = s * sqrt(2 / pi))."""
    groups: list[list[float]] = [[] for _ in range(bins)]
    for conf in confidences:
        groups[min(int(max(conf, 0.0) * bins), bins - 1)].append(min(max(float(conf), 0.0), 1.0))
    n = sum(len(g) for g in groups)
    if not n:
        return None
    total = 0.0
    for g in groups:
        if not g:
            continue
        mean = sum(g) / len(g)
        if len(g) > EXACT_BIN:
            total += math.sqrt(2 / math.pi) * math.sqrt(sum(p * (1 - p) for p in g)) / n
            continue
        dist = [1.0]  # dist[k]: probability that k of the bin's answers so far are right
        for p in g:
            nxt = [0.0] * (len(dist) + 1)
            for k, q in enumerate(dist):
                nxt[k] += q * (1 - p)
                nxt[k + 1] += q * p
            dist = nxt
        total += len(g) / n * sum(q * abs(k / len(g) - mean) for k, q in enumerate(dist))
    return total


FOLDS = 5  # held-out error of a map: fitted on 4 fifths, measured on the fifth left


@dataclass(frozen=True)
class Calibrator:
    """A non-decreasing piecewise-linear map from raw to calibrated confidence."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]
    count: int  # the points it was fitted on

    def __call__(self, confidence: float) -> float:
        xs, ys = self.xs, self.ys
        if confidence <= xs[0]:
            return ys[0]
        if confidence >= xs[-1]:
            return ys[-1]
        i = bisect_right(xs, confidence)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (confidence - x0) / (x1 - x0) if x1 > x0 else y1

    def as_dict(self) -> dict[str, Any]:
        return {"method": "isotonic", "count": self.count,
                "knots": [[round(x, 4), round(y, 4)] for x, y in zip(self.xs, self.ys)]}


def fit(points: Sequence[tuple[float, bool]], minimum: int) -> Calibrator | None:
    """The map fitted on (confidence, right) points; None with fewer than ``minimum``."""
    return _fit(tuple(points), minimum)


# The Scenarios page, the API and each result's calibrated figure ask for a version's map and
# held-out error again and again on the same points: each kept by its points (a few hundred
# kilobytes at 10,000 reviewed answers, hashed in about a millisecond).
@lru_cache(maxsize=64)
def _fit(points: tuple[tuple[float, bool], ...], minimum: int) -> Calibrator | None:
    if len(points) < max(minimum, 1):
        return None
    tied: dict[float, list[float]] = {}  # answers of one confidence are one block from the start
    for conf, right in points:
        t = tied.setdefault(float(conf), [0.0, 0.0, 0.0])
        t[0] += bool(right)
        t[1] += 1
        t[2] += float(conf)
    blocks: list[list[float]] = []  # [right, count, sum of confidence]
    for conf in sorted(tied):
        blocks.append(list(tied[conf]))
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] >= blocks[-1][0] / blocks[-1][1]:
            right_, count, total = blocks.pop()
            blocks[-1][0] += right_
            blocks[-1][1] += count
            blocks[-1][2] += total
    xs, ys = [], []
    for right, count, total in blocks:
        mean = total / count
        xs.append(mean)
        ys.append((right + mean) / (count + 1))  # one pseudo-answer at its raw confidence
    for i in range(1, len(ys)):  # the shrinking can undo the order between blocks: keep it
        ys[i] = max(ys[i], ys[i - 1])
    return Calibrator(tuple(xs), tuple(ys), len(points))


def held_out(points: Sequence[tuple[float, bool]], minimum: int, folds: int = FOLDS) -> dict[str, Any]:
    """ECE of the raw confidence and of the calibrated one on answers the map was not fitted
    on (``folds``-fold, answers dealt to folds in turn; leave-one-out where a fold's training
    share would fall under ``minimum``); None after where even that falls under it. With the
    calibrated one, ``ece_floor``: what a perfect map would show on those answers."""
    return dict(_held_out(tuple(points), minimum, folds))


@lru_cache(maxsize=64)
def _held_out(points: tuple[tuple[float, bool], ...], minimum: int, folds: int) -> dict[str, Any]:
    before, n = reliability(points).ece, len(points)
    if n * (folds - 1) / folds < minimum:
        folds = n  # too few for k folds of the minimum: leave one out
    if folds < 2 or n - math.ceil(n / folds) < minimum:
        return {"ece_before": before, "ece_after": None, "ece_floor": None, "folds": folds}
    shown = []
    for k in range(folds):
        train = [p for i, p in enumerate(points) if i % folds != k]
        cal = fit(train, minimum)
        shown += [(cal(c), r) for i, (c, r) in enumerate(points) if i % folds == k]
    return {"ece_before": before, "ece_after": reliability(shown).ece, "ece_floor": ece_floor(c for c, _ in shown),
            "folds": folds}


@dataclass
class Calibration:
    version: str | None
    answers: list[tuple[float, bool]] = field(default_factory=list)
    fields: list[tuple[float, bool]] = field(default_factory=list)
    sources: dict[str, int] = field(default_factory=dict)  # answers per source: reviews, gold
    minimum: int = 50  # points before the version's confidence is shown calibrated

    def calibrator(self) -> Calibrator | None:
        return fit(self.answers, self.minimum)

    def as_dict(self) -> dict[str, Any]:
        cal = self.calibrator()
        checked = held_out(self.answers, self.minimum)
        return {"version": self.version, "sources": dict(self.sources),
                "answers": reliability(self.answers).as_dict(), "fields": reliability(self.fields).as_dict(),
                "calibrated": {"applies": cal is not None, "minimum": self.minimum, "count": len(self.answers),
                               "ece_held_out": _r(checked["ece_after"]), "ece_floor": _r(checked["ece_floor"]),
                               "folds": checked["folds"],
                               "map": cal.as_dict() if cal else None}}


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def _add(out: dict[str | None, Calibration], source: str, scored: Scored, minimum: int) -> None:
    cal = out.setdefault(scored.version, Calibration(scored.version, minimum=minimum))
    cal.answers.append((scored.confidence, scored.right))
    cal.fields.extend(scored.kept)  # none for a rejection: which field was wrong is not known
    cal.sources[source] = cal.sources.get(source, 0) + 1


def scenario_calibration(session: Session, scenario: Scenario, version: str | None = None,
                         relative: float = 0.05, minimum: int = 50) -> list[Calibration]:
    """One ``Calibration`` per adapter version with reviewed answers (or gold answers) that have
    a confidence, the newest version first; ``version`` (or a prefix of it) keeps that one."""
    return calibrations(session, scenario, scenario_reviews(session, scenario, version, relative), version,
                        relative, minimum)


def calibrations(session: Session, scenario: Scenario, reviews: ScenarioReviews, version: str | None,
                 relative: float, minimum: int) -> list[Calibration]:
    """From the reviews' scored answers (kept until the scenario's results change: ``memo``) and
    the gold set's (a few candidates' answers on a few videos, read each time)."""
    out: dict[str | None, Calibration] = {}
    for scored in reviews.scored:
        if scored.confidence is not None:
            _add(out, "reviews", scored, minimum)
    _add_gold(session, scenario, reviews.specs, version, relative, out, minimum)
    return list(reversed(out.values()))  # versions in order of their first point: newest last


def _add_gold(session: Session, scenario: Scenario, specs: list[FieldSpec], version: str | None, relative: float,
              out: dict[str | None, Calibration], minimum: int) -> None:
    """Candidate versions' answers on the gold set, against the reviewed gold answers."""
    releases = session.scalars(select(AdapterRelease).where(AdapterRelease.scenario_id == scenario.id,
                                                            AdapterRelease.gold_answers.is_not(None))
                               .order_by(AdapterRelease.id)).all()
    if not releases:
        return
    gold = {str(r.id): reviewed_answer(r.review_state, r.parsed, r.edited_parsed)
            for r in gold_results(session, scenario.id)}
    for release in releases:
        if version and not release.version.startswith(version):
            continue
        for rid, answer in (release.gold_answers or {}).items():
            conf = (answer.get("confidence") or {}) if isinstance(answer, dict) else {}
            reviewed = gold.get(rid)
            if conf.get("answer") is None or reviewed is None or answer.get("parsed") is None:
                continue
            fields = {k: float(v) for k, v in (conf.get("fields") or {}).items()}
            _add(out, "gold", score(specs, release.version, "gold", answer["parsed"], reviewed, relative,
                                    float(conf["answer"]), fields), minimum)


def calibrated_confidence(session: Session, result: Result, relative: float, minimum: int) -> float | None:
    """The result's confidence as its adapter version's map shows it (fitted now, on every
    reviewed and gold answer of that version); None without a confidence or a map yet."""
    if result.confidence is None or not result.adapter_version:
        return None
    scenario = result.analysis.scenario
    mine = [c for c in scenario_calibration(session, scenario, result.adapter_version, relative, minimum)
            if c.version == result.adapter_version]
    cal = mine[0].calibrator() if mine else None
    return None if cal is None else round(cal(result.confidence), 4)
