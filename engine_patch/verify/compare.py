"""The comparisons and the verdict: two runs position by position, the tolerance from the
measured bf16 noise, greedy outputs that may part only at a near tie, and ``evaluate``, which
turns every check's raw runs into rows and failures (the package docstring has the rules)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .options import Options
from .report import _f


def compare(a: dict, b: dict) -> dict:
    """a, b: {"lp": [chosen-token logprob per position], "top": [argmax id per position]}."""
    n = min(len(a["lp"]), len(b["lp"]))
    d = [abs(x - y) for x, y in zip(a["lp"][:n], b["lp"][:n])]
    finite = all(math.isfinite(x) for x in a["lp"][:n] + b["lp"][:n])
    agree = sum(x == y for x, y in zip(a["top"][:n], b["top"][:n])) / n if n else 1.0
    if not finite:
        return {"n": n, "mean": float("inf"), "max": float("inf"), "agree": agree, "finite": False}
    return {"n": n, "mean": sum(d) / n if n else 0.0, "max": max(d) if d else 0.0, "agree": agree, "finite": True}


def tolerance(noise_mean: float | None, noise_max: float | None, o: Options) -> tuple[float, float]:
    tm = o.floor_mean if noise_mean is None or not math.isfinite(noise_mean) else max(o.floor_mean, o.k * noise_mean)
    tx = o.floor_max if noise_max is None or not math.isfinite(noise_max) else max(o.floor_max, o.k * noise_max)
    return tm, tx


def compare_generation(single: dict, other: dict, tol_mean: float, tol_max: float) -> dict:
    """Greedy outputs of the same request; tokens may part only at a near tie."""
    st, ot = single["tokens"], other["tokens"]
    j = next((i for i, (x, y) in enumerate(zip(st, ot)) if x != y), None)
    if j is None and len(st) != len(ot):
        j = min(len(st), len(ot))
    upto = len(st) if j is None else j
    d = [abs(x - y) for x, y in zip(single["lp"][:upto], other["lp"][:upto])]
    finite = all(math.isfinite(x) for x in single["lp"] + other["lp"])
    mean = sum(d) / len(d) if d else 0.0
    mx = max(d) if d else 0.0
    # A genuine near tie: the other run took the single run's runner-up, the single run's
    # top-1/top-2 margin is within tol_max, and the other run scores that token as the single did.
    near_tie = (j is not None and j < len(single["margin"]) and j < len(ot) and single["margin"][j] <= tol_max
                and single.get("second", [None] * (j + 1))[j] == ot[j]
                and abs(other["lp"][j] - single.get("second_lp", [float("nan")] * (j + 1))[j]) <= tol_max)
    ok = finite and mean <= tol_mean and mx <= tol_max and (j is None or near_tie)
    return {"ok": ok, "diverge_at": j, "near_tie": near_tie, "mean": mean if finite else float("inf"),
            "max": mx if finite else float("inf"), "finite": finite, "n": len(st)}


def evaluate(o, lengths, loras, merged_scores, dyn_scores, base_scores, ref_scores, base_ref,
             mixed_raw, long_short, short, no_lora_raw=None) -> dict:
    rows: list[dict] = []
    failures: list[str] = []
    noise: dict[int, tuple[float, float]] = {}
    for L in lengths:
        if 0 in base_scores and L in base_ref:
            c = compare(base_scores[0][L], base_ref[L])
            noise[L] = (c["mean"], c["max"])
            rows.append({"adapter": "-", "length": L, "pair": "base~base_ref", **c, "ok": c["finite"], "role": "noise"})
            if not c["finite"]:
                failures.append(f"base L={L}: non-finite logprobs without any adapter")

    def tol_at(L: int, extra: tuple[float, float] | None = None) -> tuple[float, float]:
        if not noise:
            return tolerance(None, None, o)
        near = min(noise, key=lambda x: abs(x - L))
        nm, nx = noise[near]
        if extra is not None:
            nm, nx = max(nm, extra[0]), max(nx, extra[1])
        return tolerance(nm, nx, o)

    for i, lr in enumerate(loras):
        name = Path(o.adapters[i]).name
        for L in lengths:
            if i not in ref_scores:
                continue
            ref = ref_scores[i][L]
            m = compare(merged_scores[i][L], ref)
            tm_base, tx_base = tol_at(L)
            m_ok = m["finite"] and m["mean"] <= tm_base and m["max"] <= tx_base
            rows.append({"adapter": name, "length": L, "pair": "merged~ref", **m, "tol_mean": tm_base,
                         "tol_max": tx_base, "ok": m_ok, "role": "merged_sanity"})
            if not m_ok:
                failures.append(f"{name} L={L}: merged~ref {m['mean']:.4f}/{m['max']:.4f} exceeds the base noise "
                                f"tolerance {tm_base:.4f}/{tx_base:.4f}: merge or reference broken")
            tm, tx = tol_at(L, (m["mean"], m["max"]))
            if i not in dyn_scores:
                failures.append(f"{name} L={L}: dynamic LoRA scoring failed (see errors)")
                rows.append({"adapter": name, "length": L, "pair": "dyn~ref", "ok": False, "role": "check",
                             "mean": None, "max": None, "agree": None, "error": True})
                continue
            d = compare(dyn_scores[i][L], ref)
            ok = d["finite"] and d["mean"] <= tm and d["max"] <= tx
            effect = compare(dyn_scores[i][L], base_scores[i][L]) if i in base_scores else None
            inconclusive = effect is not None and effect["mean"] <= tm
            rows.append({"adapter": name, "length": L, "pair": "dyn~ref", **d, "tol_mean": tm, "tol_max": tx,
                         "ok": ok, "role": "check", "inconclusive": inconclusive})
            rows.append({"adapter": name, "length": L, "pair": "dyn~merged", **compare(dyn_scores[i][L], merged_scores[i][L]),
                         "ok": True, "role": "info"})
            if effect is not None:
                rows.append({"adapter": name, "length": L, "pair": "dyn~base", **effect, "ok": True, "role": "effect"})
            if not ok:
                failures.append(f"{name} L={L}: dyn~ref mean {d['mean']:.4f} max {d['max']:.4f} > tol {tm:.4f}/{tx:.4f} "
                                f"(merged~ref {m['mean']:.4f}/{m['max']:.4f})")

    mixed: list[dict] = []
    singles = mixed_raw.get("singles", {})
    for name in ("adapters_only", "with_no_adapter"):
        if name not in mixed_raw:
            continue
        entry = mixed_raw[name]
        for j, (p, lr) in enumerate(entry["reqs"]):
            key = (p, 0 if lr is None else lr.lora_int_id)
            tm, tx = tol_at(16 if p == 1 else 129)
            rec: dict[str, Any] = {"batch": name, "index": j, "adapter": getattr(lr, "lora_name", None)}
            if entry.get("gen") is None or key not in singles:
                rec.update(ok=False, error="generation failed")
            else:
                rec["generate"] = compare_generation(singles[key], entry["gen"][j], tm, tx)
                rec["ok"] = rec["generate"]["ok"]
            if "tf_batch" in entry:
                if entry.get("tf_batch") is None or entry.get("tf_alone") is None:
                    rec["teacher_forced"] = {"ok": False, "error": "scoring failed"}
                else:
                    c = compare(entry["tf_alone"][j], entry["tf_batch"][j])
                    c["ok"] = c["finite"] and c["mean"] <= tm and c["max"] <= tx
                    rec["teacher_forced"] = c
                rec["ok"] = rec["ok"] and rec["teacher_forced"]["ok"]
            mixed.append(rec)
            if not rec["ok"]:
                g, tf = rec.get("generate") or {}, rec.get("teacher_forced") or {}
                why = []
                if not g.get("ok", False):
                    why.append(f"generate: diverges at token {g.get('diverge_at')}, max |dlogprob| {_f(g.get('max'))}"
                               if g else "generate failed")
                if tf and not tf.get("ok"):
                    why.append(tf.get("error") or f"teacher-forced max |dlogprob| {_f(tf.get('max'))}")
                failures.append(f"mixed batch {name}[{j}] ({rec['adapter'] or 'no adapter'}) differs from its single run: "
                                + "; ".join(why))

    ls_out: list[dict] = []
    for e in long_short:
        if e["after"] is None or e["fresh"] is None:
            ls_out.append({"variant": e["variant"], "after_long_of": e["after_long_of"], "ok": False, "error": "run failed"})
            failures.append(f"long-then-short variant {e['variant']}: run failed")
            continue
        per = []
        for k, (f, a) in enumerate(zip(e["fresh"], e["after"])):
            tm, tx = tol_at(len(short[k]))
            per.append(compare_generation(f, a, tm, tx))
        ok = all(x["ok"] for x in per)
        ls_out.append({"variant": e["variant"], "after_long_of": e["after_long_of"], "ok": ok, "prompts": per})
        if not ok:
            failures.append(f"long-then-short: variant {e['variant']} after a long prompt of variant "
                            f"{e['after_long_of']} differs from the fresh engine")
    no_lora_raw = no_lora_raw or {}
    for mode, pair in (("lora", "nolora~lora"), ("lora_cobatched", "nolora~lora_cobatched")):
        if "plain" not in no_lora_raw:
            break
        plain, got = no_lora_raw["plain"], no_lora_raw.get(mode)
        for k, L in enumerate(lengths):
            row: dict[str, Any] = {"adapter": "(none)", "length": L, "pair": pair, "role": "check", "agree": None}
            if plain is None or got is None:
                row.update(ok=False, mean=None, max=None, error=True)
                failures.append(f"no-adapter request L={L} ({pair}): a run failed (see errors)")
                rows.append(row)
                continue
            tm, tx = tol_at(L)
            g = compare_generation(plain[k], got[k], tm, tx)
            row.update(ok=g["ok"], mean=g["mean"], max=g["max"], n=g["n"], diverge_at=g["diverge_at"],
                       near_tie=g["near_tie"], tol_mean=tm, tol_max=tx,
                       identical=plain[k]["tokens"] == got[k]["tokens"] and plain[k]["lp"] == got[k]["lp"])
            rows.append(row)
            if not g["ok"]:
                failures.append(f"no-adapter request L={L}: the LoRA engine ({'co-batched with adapters' if mode != 'lora' else 'alone'}) "
                                f"differs from the engine without LoRA: diverges at token {g['diverge_at']}, "
                                f"max |dlogprob| {_f(g['max'])} (vLLM #49063)")
    return {"rows": rows, "mixed": mixed, "long_short": ls_out, "failures": failures,
            "inconclusive": [f"{r['adapter']} L={r['length']}" for r in rows if r.get("inconclusive")]}
