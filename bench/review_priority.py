"""Does "least certain first" put the wrong answers at the top of the review queue? (issue 51)

    .venv/bin/python bench/review_priority.py [--per-kind 100] [--seed-base 2000000000 3000000000]

The demo model (demo_model/weights, with its three adapters) answers freshly generated scenes
harder than those it was trained on (``vidlora.scenes.Hardness``: heavier sensor noise, a
static occluder hiding part of the view, tombs of up to 6 chambers where training saw 4),
through the GPU worker's own engine host on the CPU, so each answer carries the confidence the
worker stores. Each answer is scored against the scene's truth (``scenes.correct``).

The review queue is every answer sorted by its confidence, least certain first (ties in the
order they were made). Reported:

- ``recall_at_20pct``: the share of the wrong answers among the first 20 % of the queue;
- ``random_recall_at_20pct``: the same for a random order (its expectation: 20 % of the queue
  holds 20 % of anything), and ``best_recall_at_20pct``: what a perfect order could reach
  (1.0 unless more than 20 % of the answers are wrong);
- ``ece``: the expected calibration error of the answer confidence (10 bins);
- ``recall_share_of_best``: ``recall_at_20pct`` / ``best_recall_at_20pct`` (issue 61's goal: 0.9);
- ``ece_calibrated``: the ECE of the confidence the product shows (``vidlora.feedback.calibration``,
  a map per adapter fitted on the other seed base's answers), and the same per seed base, each
  beside ``ece_floor``: what a perfectly calibrated confidence shows on those answers by chance
  (the goal, at most 5 % on each seed base, is ``calibration_goal_met``);
- ``calibrated_order``: the queue of all kinds ordered by that calibrated confidence, and
  ``best_order_found``: the order with the best share of perfect and whether the product has it;
  ``stored_signals_bound``: every stored signal together, fitted on the answers it ranks (a bound);
- the same for the geometric-mean and product aggregations (``vidlora.results.confidence``
  stores the minimum) and for the scored field's own confidence, and per scene kind.

Writes bench/results/review_priority.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

SHARE = 0.2  # the first 20 % of the queue
# What the answers' correctness is scored on, per kind (scenes.correct): that field's own confidence.
SCORED_FIELD = {"artifact": "finds", "tomb": "chamber_count", "mural": "inscriptions"}


# Scene difficulty, drawn per scene with these weights: half as trained, half harder. (A pilot
# of 24 scenes at noise 24/40 with 20 %/32 % occluders got 17 %/50 % right: a queue whose
# wrong answers are most of it cannot put them all in its first fifth, whatever the order.)
WEIGHTS = {"clean": 0.5, "harder": 0.3, "hardest": 0.2}


def levels():
    """Scene difficulty: clean (as trained), harder, hardest."""
    from vidlora.scenes import Hardness

    return {"clean": Hardness(), "harder": Hardness(noise=12, occlusion=0.1, max_chambers=5),
            "hardest": Hardness(noise=24, occlusion=0.2, max_chambers=6)}


def make_scenes(per_kind: int, seed_base: int, out: Path):
    """(kind, level, scene, frame paths, timestamps) for each scene, frames as JPEG files the
    way the CPU workers store them (the scenario's sampling plan, JPEG at the workers' quality)."""
    import numpy as np
    from PIL import Image

    from demo_model.data import ScenarioText, sampled_frames
    from vidlora import scenes

    texts = ScenarioText.load(ROOT / "scenarios.yaml")
    hard = levels()
    names = list(hard)
    made = []
    for kind in scenes.KINDS:
        for i in range(per_kind):
            seed = seed_base + i
            level = str(np.random.default_rng([seed, 7]).choice(names, p=[WEIGHTS[n] for n in names]))
            scene = scenes.hard_scene(kind, seed, hard[level])
            frames, ts = sampled_frames(scene, texts[scenes.SCENARIO_OF[kind]].sampling, hard[level])
            d = out / f"{kind}-{seed}"
            d.mkdir(parents=True, exist_ok=True)
            paths = []
            for j, frame in enumerate(frames):
                p = d / f"{j:04d}.jpg"
                Image.fromarray(frame).save(p, quality=95)  # already round-tripped at the workers' quality
                paths.append(str(p))
            made.append((kind, level, scene, paths, ts))
    return made


def recall_at(ranked_wrong: list[bool], share: float = SHARE) -> float | None:
    """Share of the wrong answers among the first ``share`` of a queue (True = wrong)."""
    wrong = sum(ranked_wrong)
    if not wrong:
        return None
    k = math.ceil(share * len(ranked_wrong))
    return sum(ranked_wrong[:k]) / wrong


def queue_stats(points: list[tuple[float, bool]]) -> dict:
    """points: (confidence, right) in the order the answers were made."""
    from vidlora.feedback.calibration import reliability

    order = sorted(range(len(points)), key=lambda i: (points[i][0], i))
    ranked_wrong = [not points[i][1] for i in order]
    n, wrong = len(points), sum(ranked_wrong)
    k = math.ceil(SHARE * n)
    rel = reliability(points)
    return {"answers": n, "wrong": wrong, "queue_head": k,
            "recall_at_20pct": recall_at(ranked_wrong),
            "random_recall_at_20pct": k / n if wrong else None,
            "best_recall_at_20pct": min(1.0, k / wrong) if wrong else None,
            "ece": rel.ece, "reliability": [b.as_dict() for b in rel.bins]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-kind", type=int, default=100, help="scenes per scene kind (3 kinds)")
    ap.add_argument("--seed-base", type=int, nargs="+", default=[2 * 10**9, 3 * 10**9],
                    help="first seed of each set of scenes (fresh: above scenes.FRESH_SEEDS); with two, each "
                         "set's confidence is also calibrated by the map fitted on the other")
    ap.add_argument("--batch", type=int, default=64, help="requests per engine batch")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--from-rows", type=Path, nargs="+", default=None,
                    help="recompute the report from runs' answers instead of answering scenes: their results "
                         "JSON (bench/results/review_priority*.json) or var/bench/review-priority/rows.json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.from_rows:
        rows, gen_s, made_by = [], 0.0, []
        for path in args.from_rows:
            saved = json.loads(path.read_text())
            first = min(r["seed"] for r in saved["rows"])
            # Results written before issue 61 hold one seed base per file, its first seed.
            rows += [{**r, "seed_base": r.get("seed_base", first)} for r in saved["rows"]]
            gen_s += saved["generate_s"]
            made_by.append(saved.get("command") or str(path))
        args.seed_base = sorted({r["seed_base"] for r in rows})
        args.made_by = made_by
        summarise(args, rows, gen_s, t0)
    else:
        rows, gen_s = answer_scenes(args)
        summarise(args, rows, gen_s, t0)


def answer_scenes(args) -> tuple[list[dict], float]:
    """Each scene's answer through the engine host, scored; also kept in var/bench for --from-rows."""

    from demo_model import ADAPTERS, BASE
    from vidlora import scenes
    from vidlora.config import Settings
    from vidlora.engine_io import AnalysisRequest
    from vidlora.results.confidence import field_confidence
    from vidlora.scenarios import Generation, load_scenarios
    from workers.confidence import token_ends
    from workers.engine_env import platform_is_cpu
    from workers.engine_host import EngineHost

    work = ROOT / "var" / "bench" / "review-priority"
    made, base_of = [], []
    for base in args.seed_base:
        scenes_made = make_scenes(args.per_kind, base, work)
        made += scenes_made
        base_of += [base] * len(scenes_made)
    specs = {s.name: s for s in load_scenarios(ROOT / "scenarios.yaml", ADAPTERS)}
    host = EngineHost(Settings(var_dir=ROOT / "var" / "bench", model=str(BASE), adapter_root=ADAPTERS,
                               max_loras=3, max_cpu_loras=3, max_lora_rank=64, max_model_len=8192,
                               max_num_seqs=args.batch, enforce_eager=platform_is_cpu()))
    host.start()
    reqs = []
    for i, (kind, _level, _scene, paths, ts) in enumerate(made):
        spec = specs[scenes.SCENARIO_OF[kind]]
        gen = Generation.of(spec.generation)
        reqs.append(AnalysisRequest(
            request_key=str(i), prompt=spec.prompt, system=spec.system, frames=paths, timestamps=ts,
            adapter_name=spec.name, adapter_path=spec.adapter_path, max_tokens=gen.max_tokens,
            temperature=gen.temperature, top_p=gen.top_p, seed=gen.seed, repetition_penalty=gen.repetition_penalty,
            output_schema=spec.output_schema))
    t1 = time.perf_counter()
    outs = []
    for start in range(0, len(reqs), args.batch):
        outs += host.generate(reqs[start:start + args.batch])
    gen_s = time.perf_counter() - t1

    rows = []
    for (kind, level, scene, _paths, _ts), out, base in zip(made, outs, base_of):
        parsed = None
        try:
            parsed = json.loads(out.text, strict=False) if out.error is None else None
        except ValueError:
            pass
        conf = out.confidence or {}
        ends = token_ends(host.tokenizer, out.token_ids, out.text) if out.error is None else None
        geo = field_confidence(out.text, ends, out.logprobs, method="geomean") if ends else None
        prod = field_confidence(out.text, ends, out.logprobs, method="product") if ends else None
        rows.append({"kind": kind, "level": level, "seed_base": base, "seed": scene.seed,
                     "truth": scenes.truth_text(scene),
                     "answer": scenes.answer_text(kind, parsed), "right": scenes.correct(scene, parsed),
                     "error": out.error, "confidence": conf.get("answer"),
                     "field_confidence": (conf.get("fields") or {}).get(SCORED_FIELD[kind]),
                     "geomean_confidence": geo.answer if geo else None,
                     "product_confidence": prod.answer if prod else None, "fields": conf.get("fields")})
    (work / "rows.json").write_text(json.dumps({"generate_s": gen_s, "rows": rows}))
    return rows, gen_s


def summarise(args, rows: list[dict], gen_s: float, t0: float) -> None:
    from vidlora import scenes

    known = [r for r in rows if r["confidence"] is not None]
    unknown = len(rows) - len(known)

    def stats(key: str, subset: list[dict]) -> dict:
        return queue_stats([(r[key], r["right"]) for r in subset if r[key] is not None])

    calibrated = cross_calibrate(known)
    calibrated_order = calibrated.pop("calibrated_order")
    summary = {
        "what": "review queue least certain first, demo model on fresh harder scenes (issue 51); the shown "
                "confidence calibrated per adapter on the other seed base's answers (issue 61)",
        "command": (f"python bench/review_priority.py --from-rows {' '.join(map(str, args.from_rows))}"
                    if args.from_rows else f"python bench/review_priority.py --per-kind {args.per_kind} --seed-base "
                    + " ".join(map(str, args.seed_base))),
        "answers_from": getattr(args, "made_by", None),
        "device": platform.processor() or platform.machine(), "engine": "vLLM CPU, EngineHost (the GPU worker's)",
        "scenes": len(rows), "without_confidence": unknown, "generate_s": round(gen_s, 1),
        "total_s": round(time.perf_counter() - t0, 1),
        "levels": {k: vars(v) for k, v in levels().items()},
        "accuracy": sum(r["right"] for r in rows) / len(rows),
        **stats("confidence", known),
        **calibrated,
        "per_seed_base": {str(b): {**stats("confidence", [r for r in known if r["seed_base"] == b]),
                                   **cross_calibrate([r for r in known if r["seed_base"] == b], known)}
                          for b in args.seed_base},
        "geomean": stats("geomean_confidence", known),
        "product": stats("product_confidence", known),
        "scored_field": stats("field_confidence", known),
        "calibrated_order": calibrated_order,
        "stored_signals_bound": stored_signals_bound(known),
        "per_kind": {k: {**stats("confidence", [r for r in known if r["kind"] == k]),
                         "accuracy": sum(r["right"] for r in rows if r["kind"] == k) / max(1, sum(
                             r["kind"] == k for r in rows))} for k in scenes.KINDS},
        "per_level": {lv: {"scenes": sum(r["level"] == lv for r in rows),
                           "accuracy": sum(r["right"] for r in rows if r["level"] == lv) / max(1, sum(
                               r["level"] == lv for r in rows))} for lv in levels()},
    }
    summary["recall_share_of_best"] = share_of_best(summary)
    for part in summary["per_seed_base"].values():
        part["recall_share_of_best"] = share_of_best(part)
    for key in (*ORDERS, "stored_signals_bound"):
        summary[key]["recall_share_of_best"] = share_of_best(summary[key])
    shares = {"confidence": summary["recall_share_of_best"], **{k: summary[k]["recall_share_of_best"] for k in ORDERS}}
    best = max(shares, key=lambda k: shares[k] or 0.0)  # the stored order wins a tie
    summary["best_order_found"] = {"order": best, "recall_share_of_best": shares[best],
                                   "in_product": best == "confidence"}
    summary["goal_met"] = bool(summary["recall_share_of_best"] is not None and summary["recall_share_of_best"] >= 0.9)
    # Issue 61: at most 5 % on each seed base's held-out answers, not only on all of them together.
    summary["calibration_goal_met"] = all(
        part["ece_calibrated"] is not None and part["ece_calibrated"] <= 0.05
        for part in [summary, *summary["per_seed_base"].values()])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "review_priority.json").write_text(dump(summary, rows))
    (args.out / "review_priority.md").write_text(report(summary, rows))
    print(json.dumps({k: v for k, v in summary.items() if k not in ("per_kind", "reliability")}, indent=1))


# Other queue orders from what the product has at answer time (the stored one: "confidence").
ORDERS = ("geomean", "product", "scored_field", "calibrated_order")


def stored_signals_bound(rows: list[dict]) -> dict:
    """How far any order made of the stored signals could go: a logistic regression of right on
    all of them together (the logits of the minimum, product, geometric mean and scored-field
    confidences, the kind, the kind times the minimum), fitted on these very answers and ranking
    them; fitted on the answers it ranks, so an optimistic bound, not an order the product has."""
    import numpy as np

    def logit(c: float) -> float:
        c = min(max(c, 1e-6), 1 - 1e-6)
        return math.log(c / (1 - c))

    kinds = sorted({r["kind"] for r in rows})
    x = np.array([[1.0, *(logit(r[k]) for k in ("confidence", "product_confidence", "geomean_confidence",
                                               "field_confidence")),
                   *(float(r["kind"] == k) for k in kinds[1:]),
                   *(logit(r["confidence"]) * (r["kind"] == k) for k in kinds[1:])] for r in rows])
    y = np.array([float(r["right"]) for r in rows])
    w = np.zeros(x.shape[1])
    for _ in range(50):  # Newton; a little ridge keeps a kind that is all right finite
        p = 1 / (1 + np.exp(-(x @ w)))
        grad = x.T @ (p - y) + 1e-2 * w
        hess = (x * (p * (1 - p))[:, None]).T @ x + 1e-2 * np.eye(len(w))
        w -= np.linalg.solve(hess, grad)
    score = x @ w
    ranked = [not rows[i]["right"] for i in sorted(range(len(rows)), key=lambda i: (score[i], i))]
    k, wrong = math.ceil(SHARE * len(ranked)), sum(ranked)
    return {"answers": len(ranked), "wrong": wrong, "recall_at_20pct": recall_at(ranked),
            "best_recall_at_20pct": min(1.0, k / wrong) if wrong else None}


def share_of_best(stats: dict) -> float | None:
    """Recall at 20 % as a share of what a perfect order reaches (issue 61: at least 0.9)."""
    got, best = stats.get("recall_at_20pct"), stats.get("best_recall_at_20pct")
    return None if got is None or not best else got / best


def cross_calibrate(rows: list[dict], pool: list[dict] | None = None) -> dict:
    """ECE of the confidence the product shows on answers its map was not fitted on: each seed
    base's answers through the map fitted on the other bases' answers of the same kind (one
    adapter version per kind; ``pool``: where those are, default ``rows``), by the product's own
    path (``Calibration.calibrator``, what ``calibrated_confidence`` shows) with its minimum count.
    Beside it ``ece_floor``: what a perfectly calibrated confidence shows on the same answers
    (chance alone), and the queue ordered by the calibrated confidence (``calibrated_order``:
    one queue of all kinds, where a map per adapter can move one kind's answers past another's)."""
    from vidlora.config import Settings
    from vidlora.feedback.calibration import Calibration, ece_floor, reliability

    pool = rows if pool is None else pool
    minimum = Settings().calibration_min_answers
    maps = {}
    for kind, base in {(r["kind"], r["seed_base"]) for r in rows}:
        cal = Calibration(kind, answers=[(o["confidence"], o["right"]) for o in pool
                                         if o["kind"] == kind and o["seed_base"] != base], minimum=minimum)
        maps[kind, base] = cal.calibrator()
    fitted = [r for r in rows if maps[r["kind"], r["seed_base"]] is not None]
    shown = [(maps[r["kind"], r["seed_base"]](r["confidence"]), r["right"]) for r in fitted]
    rel = reliability(shown)
    # Ties (a pooled block of the map) keep the raw order among them.
    order = sorted(range(len(fitted)), key=lambda i: (shown[i][0], fitted[i]["confidence"], i))
    ranked = [not shown[i][1] for i in order]
    k, wrong = math.ceil(SHARE * len(ranked)), sum(ranked)
    return {"ece_calibrated": rel.ece, "ece_floor": ece_floor(c for c, _ in shown),
            "calibrated_answers": len(shown), "uncalibrated_answers": len(rows) - len(shown),
            "reliability_calibrated": [b.as_dict() for b in rel.bins],
            "calibrated_order": {"answers": len(ranked), "wrong": wrong, "recall_at_20pct": recall_at(ranked),
                                 "best_recall_at_20pct": min(1.0, k / wrong) if wrong else None}}


def dump(summary: dict, rows: list[dict]) -> str:
    """The summary indented, each scene's row on one line."""
    head = json.dumps(summary, indent=1)[:-2]
    return head + ',\n "rows": [\n' + ",\n".join("  " + json.dumps(r) for r in rows) + "\n ]\n}\n"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


ORDER_LABELS = {"geomean": "answer confidence, geometric mean", "product": "answer confidence, product over tokens",
                "scored_field": "the scored field's confidence only (minimum)",
                "calibrated_order": "calibrated confidence (one queue of all kinds, per-kind maps from the other "
                                    "seed base)"}


def report(s: dict, rows: list[dict]) -> str:
    lines = [
        "# Review priority: the model's doubts first (issues 51, 61)", "",
        f"Command: `{s['command']}` ({s['engine']}, {s['device']}; {s['generate_s']} s of generation, "
        f"{s['total_s']} s in all)" + (f"; the answers were made by {', '.join(f'`{c}`' for c in s['answers_from'])}"
                                        if s.get("answers_from") else "") + ".", "",
        f"{s['scenes']} fresh scenes (seeds from the command, above `scenes.FRESH_SEEDS`), a third of each kind, "
        "each at a difficulty drawn from its seed: " + "; ".join(
            f"**{k}** ({WEIGHTS[k]:.0%} of scenes) noise ±{v['noise']}, occluder {v['occlusion']:.0%} of the frame, tombs of up to "
            f"{v['max_chambers']} chambers" for k, v in s["levels"].items()) + ".", "",
        f"Accuracy {_pct(s['accuracy'])}: {s['wrong']} wrong answers of {s['answers']} with a confidence "
        f"({s['without_confidence']} without).", "",
        "| queue order | wrong answers in the first 20 % (`recall_at_20pct`) | random order | perfect order | "
        "share of perfect | ECE |",
        "|---|---:|---:|---:|---:|---:|",
        f"| answer confidence, minimum over tokens (stored) | **{_pct(s['recall_at_20pct'])}** | "
        f"{_pct(s['random_recall_at_20pct'])} | {_pct(s['best_recall_at_20pct'])} | {_share(s['recall_share_of_best'])} | "
        f"{_pct(s['ece'])} |",
        *[f"| {label} | {_pct(s[key]['recall_at_20pct'])} | {_pct(s[key].get('random_recall_at_20pct'))} | "
          f"{_pct(s[key]['best_recall_at_20pct'])} | {_share(s[key]['recall_share_of_best'])} | {_pct(s[key].get('ece'))} |"
          for key, label in ORDER_LABELS.items()],
        f"| all the stored signals together, fitted on these answers (an optimistic bound, not in the product) | "
        f"{_pct(s['stored_signals_bound']['recall_at_20pct'])} | - | {_pct(s['stored_signals_bound']['best_recall_at_20pct'])}"
        f" | {_share(s['stored_signals_bound']['recall_share_of_best'])} | - |", "",
        f"Best order found: `{s['best_order_found']['order']}`, share of perfect "
        f"{_share(s['best_order_found']['recall_share_of_best'])} "
        f"({'the stored one, what the product sorts by' if s['best_order_found']['in_product'] else 'not in the product'}). "
        "Even every stored signal together, fitted on the answers it ranks, stays far under 0.9: the wrong answers "
        "the model is surest of look like right ones to every token probability it gives. A runner-up token's "
        "probability (the engine asked for 2 logprobs, not 1) is unlikely to lift them: under a chosen token of "
        "probability p the runner-up has at most 1 - p, so the margin between them stays between 2p - 1 and p "
        "(not measured: it needs new engine runs).",
        "",
        "**Issue 51's goal (at least 80 % of the wrong answers in the first 20 %): "
        f"{'met' if (s['recall_at_20pct'] or 0.0) >= 0.8 else 'not met'}.** "
        "With more than 20 % of the answers wrong, no order can put every wrong answer in the first fifth: "
        "*perfect order* is that ceiling (the first fifth all wrong answers). Token probabilities say how "
        "sure the model is between the choices it learnt; a scene beyond them (a tomb of 5 or 6 chambers, "
        "trained on up to 4) can be answered wrong with near certainty, and those answers sit at the end "
        "of the queue (the table at the end).", "",
        f"**Recall at 20 % as a share of the perfect order's (`recall_share_of_best`): "
        f"{s['recall_share_of_best']:.3f}** (goal at least 0.9: {'met' if s['goal_met'] else 'not met'}). "
        "Within one adapter calibration does not change the order (its map never reverses it); in one queue of "
        "several adapters it can (the calibrated row above), but the product's queue sorts by the stored "
        "confidence, so this is the raw order's.", "",
        "Calibrated confidence (issue 61; `vidlora.feedback.calibration`, the map per adapter version the product "
        "shows, here per scene kind, fitted on the *other* seed base's answers, then applied to these: answers it was "
        f"not fitted on): **ECE {_pct(s['ece'])} before, {_pct(s['ece_calibrated'])} after** over "
        f"{s['calibrated_answers']} answers (goal at most 5 % on each seed base: "
        f"{'met' if s['calibration_goal_met'] else 'not met'}). *Chance alone* is the ECE a perfectly calibrated "
        "confidence shows on the same answers, on average (`calibration.ece_floor`: each answer right with "
        f"probability its calibrated confidence): {_pct(s['ece_floor'])} over all of them; a seed base's ECE after "
        "calibration near its floor is all its count of answers can tell.", "",
        "| seed base | answers | wrong | recall at 20 % | perfect | share of perfect | ECE before | ECE after | "
        "chance alone |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *[f"| {b} | {v['answers']} | {v['wrong']} | {_pct(v['recall_at_20pct'])} | {_pct(v['best_recall_at_20pct'])} | "
          f"{_share(v['recall_share_of_best'])} | {_pct(v['ece'])} | {_pct(v['ece_calibrated'])} | {_pct(v['ece_floor'])} |"
          for b, v in s["per_seed_base"].items()], "",
        "Per scene kind (each kind's own queue):", "",
        "| kind | accuracy | wrong | recall at 20 % | random | perfect | ECE |", "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for k, v in s["per_kind"].items():
        lines.append(f"| {k} | {_pct(v['accuracy'])} | {v['wrong']} | {_pct(v['recall_at_20pct'])} | "
                     f"{_pct(v['random_recall_at_20pct'])} | {_pct(v['best_recall_at_20pct'])} | {_pct(v['ece'])} |")
    lines += ["", "Per difficulty: " + ", ".join(f"{k} {_pct(v['accuracy'])} of {v['scenes']}"
                                               for k, v in s["per_level"].items()) + ".", "",
              "Reliability of the stored answer confidence (10 bins):", "",
              "| confidence | answers | mean confidence | right |", "|---|---:|---:|---:|"]
    for b in s["reliability"]:
        lines.append(f"| {100 * b['low']:.0f}-{100 * b['high']:.0f} % | {b['count']} | {_pct(b['confidence'])} | "
                     f"{_pct(b['accuracy'])} |")
    wrong = sorted((r for r in rows if not r["right"] and r["confidence"] is not None), key=lambda r: -r["confidence"])
    lines += ["", "The wrong answers the model was surest of (where the queue fails):", "",
              "| kind | level | truth | answer | confidence |", "|---|---|---|---|---:|"]
    for r in wrong[:10]:
        lines.append(f"| {r['kind']} | {r['level']} | {r['truth']} | {r['answer']} | {_pct(r['confidence'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
