"""One vLLM version's device record (issue 36) from `stages.sh version` + `vbench` results.

    python -m gpukit.summarize_version --res RES_DIR [RES_DIR ...] --out bench/results/vllm_0.33.0
    python -m gpukit.summarize_version --res RES_DIR ... --out bench/results/vllm_0.34.0 --md bench/results/vllm_0.34.md

A check found in several folders is taken from the first (list the newest run first).

Writes OUT/summary.json (per check: passed or not, and the numbers) and OUT/summary.md, and
copies each check's own JSON beside them. A check that did not run is listed as not run,
never as passed.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

FAULT = ("fault_on", "fault_off")
VERIFY = ("verify_on", "verify_video", "verify_long", "verify_nolora")
REBUILD = ("rebuild_on",)


def _load(dirs: list[Path], name: str) -> tuple[Path | None, dict | None]:
    for d in dirs:
        p = d / f"{name}.json"
        if p.is_file():
            return p, json.loads(p.read_text())
    return None, None


def fault_row(d: dict, patch: str) -> dict[str, Any]:
    if "error" in d:
        # Without engine_patch this is upstream's behaviour on record, not a check of ours.
        return {"ran": True, "passed": False if patch == "on" else None,
                "outcome": "process lost: " + d["error"].strip().splitlines()[-1][:300]}
    s = d["summary"]
    passed = (s["bad_long_returned_as"] == "reported failed"
              and not s.get("cobatched_damaged_beyond_noise", s["cobatched_differs_from_control"])
              and not s["later_damaged"] and s["bad_short_ok"])
    return {"ran": True, "passed": passed, "bad_request": s["bad_long_returned_as"],
            "batch_mates_differ_from_control": s["cobatched_differs_from_control"],
            "batch_mates_damaged_beyond_noise": s.get("cobatched_damaged_beyond_noise"),
            "control_repeat_differs": s.get("control_repeat_differs"),
            "later_damaged": s["later_damaged"], "good_requests": s["good_requests"],
            "guard_events": [e.get("event") for e in d.get("guard_events", [])]}


def verify_row(d: dict) -> dict[str, Any]:
    rows = d.get("rows", [])
    lengths = sorted({r.get("length") for r in rows if isinstance(r.get("length"), int)})
    return {"ran": True, "passed": bool(d.get("ok")), "rows": len(rows), "failures": len(d.get("failures", [])),
            "lengths": lengths, "wall_s": d.get("wall_s"), "versions": d.get("versions")}


def field_row(d: dict) -> dict[str, Any]:
    v = d.get("verdict", {})
    return {"ran": True, "passed": bool(v.get("ok")), "field_failure": v.get("field_failure"),
            "state_carried": v.get("state_carried"), "lora_inert": v.get("lora_inert"),
            "adapter_effect": v.get("lora_max_logprob_effect"), "engine_start_s": d.get("engine_start_s"),
            "pdl_in_effect": d.get("pdl_in_effect"), "errors": v.get("errors")}


def rebuild_row(d: dict) -> dict[str, Any]:
    return {"ran": True, "passed": d.get("outcome") == "rebuilt", "outcome": d.get("outcome"),
            "reason": d.get("reason"), "corrupted": d.get("corrupted"), "recovery_s": d.get("recovery_s")}


def selfcheck_row(d: dict) -> dict[str, Any]:
    sc = d.get("startup_checks") or {}
    return {"ran": True, "passed": bool(sc.get("ok")) and bool(d.get("serves")), "detail": sc.get("detail"),
            "seconds": sc.get("seconds"), "eager_at_end": d.get("enforce_eager_at_end"),
            "refused": sc.get("refused")}


def moe_row(d: dict) -> dict[str, Any]:
    return {"ran": True, "passed": bool(d.get("ok")),
            "registrations": {r.get("name"): "served" if r.get("ok") else "refused: " + (r.get("reason") or "")[:100]
                              for r in d.get("registrations") or []},
            "base": d.get("base"), "exact_scopes": d.get("exact_scopes")}


def bench_rows(d: dict) -> list[dict[str, Any]]:
    phases = d.get("phases", {})
    base = {}
    for name, p in phases.items():
        if name.startswith("all_nolora#"):
            base[name.split("x")[-1]] = p.get("req_s")
    out = []
    for name, p in phases.items():
        if not name.startswith("all_"):
            continue
        n = name.split("x")[-1]
        ratio = (p["req_s"] / base[n]) if base.get(n) else None
        out.append({"phase": name, "in_flight": int(n), "analyses_per_s": p.get("req_s"),
                    "ratio_to_nolora": round(ratio, 3) if ratio else None, "mfu": p.get("mfu"),
                    "nonfinite_requests": p.get("nonfinite_requests"), "lora_path": p.get("lora_path")})
    return out


def _versions(summary: dict, d: dict) -> None:
    if d.get("versions") and not summary.get("versions"):
        summary["versions"] = d["versions"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--res", nargs="+", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--md", help="also write the table here, with the command that made it (bench/results/vllm_X.md)")
    a = ap.parse_args()
    dirs = [Path(r) for r in a.res]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"checks": {}}
    for name in FAULT + VERIFY + REBUILD:
        p, d = _load(dirs, name)
        if d is None:
            summary["checks"][name] = {"ran": False}
            continue
        shutil.copy(p, out / p.name)
        summary["checks"][name] = (fault_row(d, name.split("_")[1]) if name in FAULT else verify_row(d) if name in VERIFY
                                   else rebuild_row(d))
        _versions(summary, d)
    for d_ in dirs:  # the first folder holding a check's JSON wins, as above
        for p in sorted(d_.glob("field_*.json")):
            if p.stem in summary["checks"]:
                continue
            d = json.loads(p.read_text())
            shutil.copy(p, out / p.name)
            summary["checks"][p.stem] = field_row(d)
            _versions(summary, d)
        for pattern, row in (("selfcheck_*.json", selfcheck_row), ("moe_*.json", moe_row)):
            for p in sorted(d_.glob(pattern)):
                if p.stem in summary["checks"]:
                    continue
                d = json.loads(p.read_text())
                shutil.copy(p, out / p.name)
                summary["checks"][p.stem] = row(d)
                _versions(summary, d)
        for p in sorted(d_.glob("vbench*.json")):
            if "bench" in summary:
                continue
            d = json.loads(p.read_text())
            shutil.copy(p, out / p.name)
            summary["bench"] = {"label": d.get("label"), "engine_kwargs": d.get("engine_kwargs"),
                                "engine_start_s": d.get("engine_start_s"), "rows": bench_rows(d),
                                "errors": d.get("errors")}
            _versions(summary, d)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    versions = summary.get("versions") or {}
    lines = [f"# vLLM {versions.get('vllm', '?')} on {versions.get('device') or 'the GPU'}: the device record",
             "", f"Versions: `{json.dumps(summary.get('versions'))}`", "",
             "| check | ran | passed | detail |", "|---|---|---|---|"]
    for name, row in summary["checks"].items():
        detail = {k: v for k, v in row.items() if k not in ("ran", "passed", "versions")}
        lines.append(f"| {name} | {row['ran']} | {row.get('passed', '-')} | `{json.dumps(detail, default=str)[:400]}` |")
    if "bench" in summary:
        lines += ["", "| phase | in flight | analyses/s | x no LoRA | MFU | non-finite |", "|---|---:|---:|---:|---:|---:|"]
        for r in summary["bench"]["rows"]:
            lines.append(f"| {r['phase']} | {r['in_flight']} | {r['analyses_per_s']} | {r['ratio_to_nolora']} | "
                         f"{r['mfu']} | {r['nonfinite_requests']} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    if a.md:
        made = "python -m gpukit.summarize_version --res " + " ".join(a.res) + f" --out {a.out} --md {a.md}"
        Path(a.md).write_text("\n".join(lines[:2] + [f"Made by `{made}`; each check's JSON is in `{a.out}/`.", ""]
                                        + lines[2:]) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
