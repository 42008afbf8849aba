"""The report: paths as a committed result may show them, the Markdown tables, and JSON that
survives infinities."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def shown(path: Any, work: Path | None = None) -> str | None:
    """A path for the report: relative to the working directory (or marked as inside the work
    directory) when under it, so committed results carry no machine's layout."""
    if path is None:
        return None
    p = Path(path).resolve()
    for base, prefix in ((Path.cwd(), ""), (work, "<workdir>/")):
        if base is not None and p.is_relative_to(Path(base).resolve()):
            return prefix + p.relative_to(Path(base).resolve()).as_posix()
    return str(path)


def _f(x: Any, nd: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return "inf" if math.isinf(x) else f"{x:.{nd}f}"
    return str(x)


def table(res: dict) -> str:
    lines = ["| adapter | length | pair | mean abs dlogprob | max abs dlogprob | greedy agree | tol mean/max | result |",
             "|---|---|---|---|---|---|---|---|"]
    for r in res.get("rows", []):
        tol = f"{_f(r.get('tol_mean'))}/{_f(r.get('tol_max'))}" if r.get("tol_mean") is not None else ""
        verdict = {"check": "PASS" if r["ok"] else "FAIL", "merged_sanity": "ok" if r["ok"] else "FAIL"}.get(r["role"], r["role"])
        if r.get("inconclusive"):
            verdict += " (inconclusive)"
        if r.get("identical"):
            verdict += " (bit-identical)"
        agree = "-" if r.get("agree") is None else f"{100 * r['agree']:.1f}%"
        pair = r["pair"] if r.get("positions", "continuation") == "continuation" else f"{r['pair']} @{r['positions']}"
        lines.append(f"| {r['adapter']} | {r['length']} | {pair} | {_f(r.get('mean'))} | {_f(r.get('max'))} | "
                     f"{agree} | {tol} | {verdict} |")
    lines += ["", "| mixed batch | index | adapter | generate (diverge@, max) | teacher-forced max | result |", "|---|---|---|---|---|---|"]
    for m in res.get("mixed", []):
        g = m.get("generate") or {}
        tf = m.get("teacher_forced") or {}
        lines.append(f"| {m['batch']} | {m['index']} | {m['adapter'] or '(none)'} | {g.get('diverge_at', '-')}, {_f(g.get('max'))} | "
                     f"{_f(tf.get('max'))} | {'PASS' if m['ok'] else 'FAIL'} |")
    lines += ["", "| long-then-short: variant | after long of | max abs dlogprob | tokens equal | result |", "|---|---|---|---|---|"]
    for e in res.get("long_short", []):
        per = e.get("prompts") or []
        mx = max((p["max"] for p in per), default=None)
        eq = all(p["diverge_at"] is None for p in per) if per else None
        lines.append(f"| {e['variant']} | {e['after_long_of']} | {_f(mx)} | {eq} | {'PASS' if e['ok'] else 'FAIL'} |")
    return "\n".join(lines)


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x
