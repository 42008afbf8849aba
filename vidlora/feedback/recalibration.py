"""Confidence that means what it says: a calibration map per adapter version.

The model's own confidence (``vidlora.results.confidence``: the least probable token of its
answer) orders the review queue well but is over-confident: its "90 %" answers are right less
often than that. Each adapter version gets a map from that confidence to the share of answers
like it that were right, fitted on the version's reviewed answers and its gold answers (the
points ``vidlora.feedback.calibration`` reads): isotonic regression (pool adjacent violators),
so the map never reverses the queue's order, each pooled block's rate shrunk by one pseudo-
answer towards its mean raw confidence (a block of 3 answers does not say "100 %"). Below
``VIDLORA_CALIBRATION_MIN_ANSWERS`` points a version has no map and its confidence is shown as
the model gave it. The map is fitted from the points at the moment it is asked for, so every
new review refits it; its error is measured on answers it was not fitted on (k-fold).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vidlora.feedback.calibration import reliability

FOLDS = 5


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
    if len(points) < max(minimum, 1):
        return None
    blocks: list[list[float]] = []  # [right, count, sum of confidence]
    for conf, right in sorted((float(c), bool(r)) for c, r in points):
        blocks.append([float(right), 1.0, conf])
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
    on (``folds``-fold, answers dealt to folds in turn); None after where too few points."""
    before = reliability(points).ece
    if len(points) < max(minimum, folds) * folds / (folds - 1):
        return {"ece_before": before, "ece_after": None, "folds": folds}
    shown = []
    for k in range(folds):
        train = [p for i, p in enumerate(points) if i % folds != k]
        cal = fit(train, minimum)
        shown += [(cal(c), r) for i, (c, r) in enumerate(points) if i % folds == k]
    return {"ece_before": before, "ece_after": reliability(shown).ece, "folds": folds}
