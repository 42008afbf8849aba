"""Which calibration fit, on the review-priority bench's answers? (issue 61)

    .venv/bin/python bench/calibration_fits.py --from-rows bench/results/review_priority_seed2000000000.json \
        bench/results/review_priority_seed3000000000.json bench/results/review_priority_seed3000000050.json \
        --halves 200 --halves-seed 0

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

Random halves (``--halves``, only reported, never used to choose): every answer of every seed base
dealt at random into two halves, stratified by scene kind (each kind's answers shuffled and split
in two, so each half holds half of each kind; the seed bases mixed), each half's answers through
the maps fitted per kind on the other half. Per fit: the mean and SD of the ECE per half, the
mean chance floor of a half, the share of splits where both halves are at most ``GOAL``, and the
same share for a perfectly calibrated confidence (answers drawn right with the calibrated
confidence itself, ``DRAWS`` draws per split): what a goal of ``GOAL`` on each of two sets of
this many answers can tell.

Writes bench/results/calibration_fits.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
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
GOAL = 0.05  # issue 61: ECE at most 5 % after calibration, on held-out answers, on each seed base
DRAWS = 10  # per split: perfectly calibrated answers drawn, for the chance share of both halves within GOAL


def _logit(c: float) -> float:
    c = min(max(c, 1e-6), 1 - 1e-6)
    return math.log(c / (1 - c))


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


def platt(points: Points, slope_only: bool = False) -> Map:
    """Logistic regression of right on logit(confidence) (Newton, halving steps); ``slope_only``:
    temperature scaling (offset 0). The halving is needed: full Newton steps run off (slope or
    offset past 100, most past 1e4) on 541 of the 3,200 Platt and temperature fits of the random
    halves' training sets (``--halves 200 --halves-seed 0``, 532 of them the tomb kind's), where
    every fit with halving ends with a slope of 0.3-3.1."""
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


def _split_by_kind(rows: list[dict], rng: random.Random) -> tuple[list[dict], list[dict]]:
    """``rows`` dealt at random into two halves, each kind's answers shuffled and split in two (an
    odd count gives its extra answer to the first half)."""
    halves: tuple[list[dict], list[dict]] = ([], [])
    for kind in sorted({r["kind"] for r in rows}):
        own = [r for r in rows if r["kind"] == kind]
        rng.shuffle(own)
        halves[0].extend(own[: (len(own) + 1) // 2])
        halves[1].extend(own[(len(own) + 1) // 2:])
    return halves


def random_halves(methods: dict[str, Callable[[Points, Points], Map]], rows: list[dict], splits: int,
                  seed: int) -> dict[str, dict]:
    """Per method, over ``splits`` random halvings of ``rows`` (``_split_by_kind``), each half's
    answers through the maps fitted per kind on the other half: the mean and SD (sample) of the
    ECE per half, the mean chance floor per half, the share of splits with both halves within
    ``GOAL``, and that share for answers drawn right with the calibrated confidence itself (a
    perfect map on these answers, ``DRAWS`` draws a split). Every method sees the same splits."""
    split_rng, chance_rng = random.Random(seed), random.Random(f"{seed}-chance")
    eces: dict[str, list[float]] = {name: [] for name in methods}
    floors: dict[str, list[float]] = {name: [] for name in methods}
    within = dict.fromkeys(methods, 0)
    chance_within = dict.fromkeys(methods, 0)
    for _ in range(splits):
        a, b = _split_by_kind(rows, split_rng)
        for name, method in methods.items():
            shown_halves = [shown(method, b, a), shown(method, a, b)]
            half_eces = [reliability(points).ece for points in shown_halves]
            eces[name] += half_eces
            floors[name] += [ece_floor(c for c, _ in points) for points in shown_halves]
            within[name] += all(e <= GOAL for e in half_eces)
            chance_within[name] += sum(
                all(reliability([(c, chance_rng.random() < c) for c, _ in points]).ece <= GOAL for points in shown_halves)
                for _ in range(DRAWS))
    return {name: {"splits": splits, "answers_per_half": [len(a), len(b)] if splits else None,
                   "ece_mean": statistics.fmean(eces[name]) if splits else None,
                   "ece_sd": statistics.stdev(eces[name]) if splits else None,
                   "ece_floor_mean": statistics.fmean(floors[name]) if splits else None,
                   "both_within_goal": within[name] / splits if splits else None,
                   "chance_both_within_goal": chance_within[name] / (splits * DRAWS) if splits else None}
            for name in methods}


def _repo_path(path: Path) -> str:
    """``path`` as the command line names it from the repository root (no machine's paths)."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from-rows", type=Path, nargs="+", required=True,
                    help="the review-priority bench's results JSON, one per seed base")
    ap.add_argument("--halves", type=int, default=200,
                    help="random halvings of all the answers (stratified by scene kind), each half through maps "
                         "fitted on the other; 0: none")
    ap.add_argument("--halves-seed", type=int, default=0, help="seed of the random halvings")
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
    command = ("python bench/calibration_fits.py --from-rows " + " ".join(map(_repo_path, args.from_rows))
               + f" --halves {args.halves} --halves-seed {args.halves_seed}")
    summary = {"command": command, "select_on": f"cv_ece_{SELECT_ON}", "chosen": chosen, "methods": results,
               "goal": GOAL}
    if args.halves:
        summary["halves"] = {"splits": args.halves, "seed": args.halves_seed, "stratified_by": "kind",
                             "kinds": sorted({r["kind"] for r in rows}),
                             "answers": len(rows), "chance_draws_per_split": DRAWS,
                             "methods": random_halves(METHODS, rows, args.halves, args.halves_seed)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "calibration_fits.json").write_text(json.dumps(summary, indent=1) + "\n")
    (args.out / "calibration_fits.md").write_text(report(summary, bases))
    print(json.dumps(summary, indent=1))


def _pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f} %"


def report(s: dict, bases: list[int]) -> str:
    cv = s["select_on"]
    lines = ["# Calibration fits on the review-priority answers (issue 61)", "",
             f"Command: `{s['command']}`.", "",
             f"Chosen beforehand by `{cv}` (held-out ECE of 5-fold cross-validation inside seed base {SELECT_ON}, "
             f"{SHUFFLES} shuffles); the cross-base columns are only reported: a map fitted on the other seed base's "
             "answers, measured on this one's, beside what chance alone gives there (`calibration.ece_floor`).", "",
             "| fit | " + f"CV inside {SELECT_ON} | " + " | ".join(
                 f"on {b}, {next(iter(s['methods'].values()))[str(b)]['answers']} answers (chance alone)" for b in bases)
             + " |",
             "|---|---:|" + "---:|" * len(bases)]
    for name, e in s["methods"].items():
        lines.append(f"| {'**' + name + '**' if name == s['chosen'] else name} | {_pct(e[cv])} | " + " | ".join(
            f"{_pct(e[str(b)]['ece_calibrated'])} ({_pct(e[str(b)]['ece_floor'])})" for b in bases) + " |")
    product = s["methods"]["product: isotonic per kind"][cv]
    every = [n for n, e in s["methods"].items() if all(e[str(b)]["ece_calibrated"] <= 0.05 for b in bases)]
    lines += ["", f"Chosen: **{s['chosen']}**, {_pct(s['methods'][s['chosen']][cv])} against the product's "
              f"{_pct(product)} by the criterion. At most 5 % on every seed base: "
              + (", ".join(every) if every else "none") + "."]
    if "halves" in s:
        lines += [""] + halves_report(s["halves"], s.get("goal", GOAL))
    return "\n".join(lines) + "\n"


def halves_report(h: dict, goal: float) -> list[str]:
    """The random halves' section of the markdown, and what it says in words."""
    g = f"{100 * goal:g} %"
    ms = h["methods"]
    product = ms["product: isotonic per kind"]
    half = product["answers_per_half"][0]
    lines = ["## Random halves (only reported, not used to choose)", "",
             f"All {h['answers']} answers (every seed base) dealt {h['splits']} times at random into two halves "
             f"(`--halves-seed {h['seed']}`), stratified by scene kind: each kind's answers shuffled and split in two, "
             f"so each half holds half of each kind ({half} answers), the seed bases mixed. Each half's answers go "
             "through the maps fitted per kind on the other half. Per fit: the ECE of a half (mean and SD over the "
             f"{2 * h['splits']} halves), what chance alone gives on it (`calibration.ece_floor`, mean), the share of "
             f"splits with both halves at most {g}, and beside it that share for a perfectly calibrated confidence: "
             f"each answer drawn right with the calibrated confidence itself ({h['chance_draws_per_split']} draws a "
             "split).", "",
             f"| fit | ECE per half, mean | SD | chance alone, mean | splits with both halves <= {g} | "
             f"perfectly calibrated: both <= {g} |", "|---|---:|---:|---:|---:|---:|"]
    for name, e in ms.items():
        lines.append(f"| {name} | {_pct(e['ece_mean'])} | {_pct(e['ece_sd'])} | {_pct(e['ece_floor_mean'])} | "
                     f"{_pct(e['both_within_goal'], 0)} | {_pct(e['chance_both_within_goal'], 0)} |")
    floors = [e["ece_floor_mean"] for e in ms.values()]
    chance = [e["chance_both_within_goal"] for e in ms.values()]
    sds = [e["ece_sd"] for e in ms.values()]
    above = {n: e["ece_mean"] - e["ece_floor_mean"] for n, e in ms.items()}
    closest, farthest = min(above, key=above.get), max(above, key=above.get)
    meeting = [n for n, e in ms.items() if e["ece_mean"] <= goal]
    best = max(ms, key=lambda n: ms[n]["both_within_goal"])
    lowest = min(ms, key=lambda n: ms[n]["ece_mean"])
    per_kind = f", {half // len(h['kinds'])} a kind" if half % len(h.get("kinds") or [0]) == 0 else ""
    lines += ["", f"What the halves show. The goal asks for an ECE of at most {g} on each of two seed bases of {half} "
              f"held-out answers. Two random halves of {half} answers stand in for the two seed bases here, with no "
              "seed-base shift between the answers a map is fitted on and those it is measured on (the bases mixed), "
              "which should only make the goal easier. Even so:", "",
              f"- Measuring on {half} answers: chance alone gives {_pct(min(floors))} to {_pct(max(floors))} on "
              f"average, so a perfectly calibrated confidence has both halves within {g} in only "
              f"{_pct(min(chance), 0)} to {_pct(max(chance), 0)} of splits, and one half's ECE moves by "
              f"{_pct(min(sds))} to {_pct(max(sds))} (SD) from split to split.",
              f"- Fitting on {half} answers (the other half's{per_kind}): every fit's mean is above its floor, by "
              f"{100 * above[closest]:.1f} points ({closest}) to {100 * above[farthest]:.1f} ({farthest}); "
              + ("none has" if not meeting else ", ".join(meeting) + (" has" if len(meeting) == 1 else " have"))
              + f" a mean per half at or under {g} (the lowest, {lowest}, {_pct(ms[lowest]['ece_mean'], 2)}). The "
              f"product's isotonic per kind shows {_pct(product['ece_mean'])} a half (SD {_pct(product['ece_sd'])}), "
              f"{100 * above['product: isotonic per kind']:.1f} points above its floor, with both halves within {g} "
              f"in {_pct(product['both_within_goal'], 0)} of splits; the most often, {best}, in "
              f"{_pct(ms[best]['both_within_goal'], 0)}.", "",
              f"So with {half} answers a seed base the goal is within chance of what even a perfect map shows, and "
              f"every fit adds its own error, from being fitted on {half} answers, on top: "
              + ("no fit compared here meets" if all(e["both_within_goal"] < 0.5 for e in ms.values())
                 else "not every fit meets")
              + " the goal on both halves in most splits, and a pass or a miss by a point on one seed base says "
              "little about the fit. The count of answers limits both parts (the floor falls as one over the square "
              "root of the count: four times the answers, half the floor), so telling a fit's ECE from "
              f"{g} to within half a point takes several times the answers a seed base."]
    return lines


if __name__ == "__main__":
    main()
