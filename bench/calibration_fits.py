"""Which calibration fit, on the review-priority bench's answers? (issue 61)

    .venv/bin/python bench/calibration_fits.py --from-rows bench/results/review_priority_seed2000000000.json \
        bench/results/review_priority_seed3000000000.json

The product's map (``vidlora.feedback.calibration.fit``: isotonic per adapter version, each block
shrunk by one pseudo-answer) beside the alternatives issue 61 names: Platt scaling on the logit
of the confidence (a slope and an offset), temperature (the slope alone), isotonic shrunk towards
a Platt fit by k pseudo-answers per block (falls back to the smooth fit where a block is small),
and each fitted per scene kind (per adapter, as the product) or pooled over the kinds (one map
for the base model; the product has no such pool: a version sees only its own answers).

The method is to be chosen on one criterion fixed beforehand, and the other numbers only
reported: the held-out ECE of repeated 5-fold cross-validation inside seed base 2000000000 (its
answers only, 30 shuffles). Then each method is fitted on one seed base
and measured on the other, both ways, beside ``ece_floor`` (what a perfectly calibrated
confidence shows on those answers by chance).

Writes bench/results/calibration_fits.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vidlora.feedback.calibration import Calibrator, ece_floor, fit, reliability  # noqa: E402

Points = Sequence[tuple[float, bool]]
Map = Callable[[float], float]
SELECT_ON = 2000000000  # the seed base whose cross-validation picks the method
SHUFFLES = 30


def _logit(c: float) -> float:
    c = min(max(c, 1e-6), 1 - 1e-6)
    return math.log(c / (1 - c))


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


def platt(points: Points, slope_only: bool = False) -> Map:
    """Logistic regression of right on logit(confidence) (Newton, halving steps); ``slope_only``:
    temperature scaling (offset 0)."""
    zs, ys = [_logit(c) for c, _ in points], [float(r) for _, r in points]

    def loss(a: float, b: float) -> float:
        return -sum(y * math.log(max(_sigmoid(a * z + b), 1e-12)) + (1 - y) * math.log(max(1 - _sigmoid(a * z + b), 1e-12))
                    for z, y in zip(zs, ys))

    a, b = 1.0, 0.0
    cur = loss(a, b)
    for _ in range(100):
        ga = gb = haa = hab = hbb = 0.0
        for z, y in zip(zs, ys):
            p = _sigmoid(a * z + b)
            w = p * (1 - p)
            ga, gb, haa, hab, hbb = ga + (p - y) * z, gb + (p - y), haa + w * z * z, hab + w * z, hbb + w
        if slope_only:
            da, db = ga / (haa + 1e-9), 0.0
        else:
            det = haa * hbb - hab * hab + 1e-12
            da, db = (hbb * ga - hab * gb) / det, (haa * gb - hab * ga) / det
        step = 1.0
        while step > 1e-6 and loss(a - step * da, b - step * db) > cur:
            step /= 2
        if step <= 1e-6:
            break
        a, b = a - step * da, b - step * db
        new = loss(a, b)
        if cur - new < 1e-10:
            break
        cur = new
    return lambda c: _sigmoid(a * _logit(c) + b)


def isotonic_towards(points: Points, prior: Map, k: float) -> Map:
    """The product's isotonic blocks, each block's rate shrunk by ``k`` pseudo-answers towards
    ``prior`` at the block's mean confidence instead of towards that confidence itself."""
    blocks = _blocks(points)
    xs = [total / n for _, n, total in blocks]
    ys = [(right + k * prior(x)) / (n + k) for (right, n, _), x in zip(blocks, xs)]
    for i in range(1, len(ys)):
        ys[i] = max(ys[i], ys[i - 1])
    return Calibrator(tuple(xs), tuple(ys), len(points))


def _blocks(points: Points) -> list[list[float]]:
    """Pool adjacent violators, as ``calibration.fit`` does: [right, count, sum of confidence]."""
    tied: dict[float, list[float]] = {}
    for c, r in points:
        t = tied.setdefault(float(c), [0.0, 0.0, 0.0])
        t[0], t[1], t[2] = t[0] + bool(r), t[1] + 1, t[2] + c
    blocks: list[list[float]] = []
    for c in sorted(tied):
        blocks.append(list(tied[c]))
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] >= blocks[-1][0] / blocks[-1][1]:
            r, n, t = blocks.pop()
            blocks[-1] = [blocks[-1][0] + r, blocks[-1][1] + n, blocks[-1][2] + t]
    return blocks


def _product(points: Points) -> Map:
    from vidlora.config import Settings

    cal = fit(points, Settings().calibration_min_answers)
    if cal is None:
        raise SystemExit(f"{len(points)} answers: under the product's minimum count")
    return cal


# name -> (own: the kind's answers, pool: every kind's) -> map
METHODS: dict[str, Callable[[Points, Points], Map]] = {
    "product: isotonic per kind": lambda own, pool: _product(own),
    "isotonic (product's) pooled over kinds": lambda own, pool: _product(pool),
    "Platt per kind": lambda own, pool: platt(own),
    "Platt pooled": lambda own, pool: platt(pool),
    "temperature per kind": lambda own, pool: platt(own, slope_only=True),
    "temperature pooled": lambda own, pool: platt(pool, slope_only=True),
    "isotonic per kind towards its Platt, k=5": lambda own, pool: isotonic_towards(own, platt(own), 5),
    "isotonic per kind towards its Platt, k=20": lambda own, pool: isotonic_towards(own, platt(own), 20),
    "isotonic per kind towards pooled Platt, k=5": lambda own, pool: isotonic_towards(own, platt(pool), 5),
    "isotonic per kind towards pooled Platt, k=20": lambda own, pool: isotonic_towards(own, platt(pool), 20),
    "isotonic per kind towards pooled isotonic, k=20": lambda own, pool: isotonic_towards(own, _product(pool), 20),
    "isotonic per kind towards pooled isotonic, k=50": lambda own, pool: isotonic_towards(own, _product(pool), 50),
}


def shown(method: Callable[[Points, Points], Map], train: list[dict], test: list[dict]) -> list[tuple[float, bool]]:
    """``test``'s answers through maps fitted on ``train``, per kind."""
    pool = [(r["confidence"], r["right"]) for r in train]
    out = []
    for kind in sorted({r["kind"] for r in test}):
        m = method([(r["confidence"], r["right"]) for r in train if r["kind"] == kind], pool)
        out += [(m(r["confidence"]), r["right"]) for r in test if r["kind"] == kind]
    return out


def cross_validated(method, rows: list[dict]) -> float:
    """Mean held-out ECE over ``SHUFFLES`` shuffles of 5-fold cross-validation inside ``rows``."""
    rng, total = random.Random(61), 0.0
    for _ in range(SHUFFLES):
        order = list(range(len(rows)))
        rng.shuffle(order)
        fold = {i: j % 5 for j, i in enumerate(order)}
        points = []
        for f in range(5):
            points += shown(method, [r for i, r in enumerate(rows) if fold[i] != f],
                            [r for i, r in enumerate(rows) if fold[i] == f])
        total += reliability(points).ece
    return total / SHUFFLES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from-rows", type=Path, nargs="+", required=True,
                    help="the review-priority bench's results JSON, one per seed base")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    rows = []
    for path in args.from_rows:
        saved = json.loads(path.read_text())
        first = min(r["seed"] for r in saved["rows"])
        rows += [{**r, "seed_base": r.get("seed_base", first)} for r in saved["rows"] if r["confidence"] is not None]
    bases = sorted({r["seed_base"] for r in rows})
    results = {}
    for name, method in METHODS.items():
        entry = {"cv_ece_" + str(SELECT_ON): cross_validated(method, [r for r in rows if r["seed_base"] == SELECT_ON])}
        for base in bases:
            points = shown(method, [r for r in rows if r["seed_base"] != base], [r for r in rows if r["seed_base"] == base])
            entry[str(base)] = {"answers": len(points), "ece_calibrated": reliability(points).ece,
                                "ece_floor": ece_floor(c for c, _ in points)}
        results[name] = entry
    chosen = min(results, key=lambda n: results[n]["cv_ece_" + str(SELECT_ON)])
    command = "python bench/calibration_fits.py --from-rows " + " ".join(map(str, args.from_rows))
    summary = {"command": command, "select_on": f"cv_ece_{SELECT_ON}", "chosen": chosen, "methods": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "calibration_fits.json").write_text(json.dumps(summary, indent=1) + "\n")
    (args.out / "calibration_fits.md").write_text(report(summary, bases))
    print(json.dumps(summary, indent=1))


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def report(s: dict, bases: list[int]) -> str:
    cv = s["select_on"]
    lines = ["# Calibration fits on the review-priority answers (issue 61)", "",
             f"Command: `{s['command']}`.", "",
             f"Chosen beforehand by `{cv}` (held-out ECE of 5-fold cross-validation inside seed base {SELECT_ON}, "
             f"{SHUFFLES} shuffles); the cross-base columns are only reported: a map fitted on the other seed base's "
             "answers, measured on this one's, beside what chance alone gives there (`calibration.ece_floor`).", "",
             "| fit | " + f"CV inside {SELECT_ON} | " + " | ".join(f"on {b} (chance alone)" for b in bases) + " |",
             "|---|---:|" + "---:|" * len(bases)]
    for name, e in s["methods"].items():
        lines.append(f"| {'**' + name + '**' if name == s['chosen'] else name} | {_pct(e[cv])} | " + " | ".join(
            f"{_pct(e[str(b)]['ece_calibrated'])} ({_pct(e[str(b)]['ece_floor'])})" for b in bases) + " |")
    product = s["methods"]["product: isotonic per kind"][cv]
    every = [n for n, e in s["methods"].items() if all(e[str(b)]["ece_calibrated"] <= 0.05 for b in bases)]
    lines += ["", f"Chosen: **{s['chosen']}**, {_pct(s['methods'][s['chosen']][cv])} against the product's "
              f"{_pct(product)} by the criterion. At most 5 % on every seed base: "
              + (", ".join(every) if every else "none") + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
