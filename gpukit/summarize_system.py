"""The `system` stage's results (issue 56) -> NAME.json and NAME.md.

    python -m gpukit.summarize_system --res RES [--out bench/results] [--name system_gpu] [--card "NVIDIA H100 80GB HBM3"]

RES holds gpukit/system/run.py's system_run.json (the product, measured end to end) and
bench_engine's system_bench.json (the bench loop on the same assets, settings and clips). The
ratio is the system's steady-state videos per hour over the bench loop's stream_videos phase.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _vllm(bench: dict) -> str | None:
    v = bench.get("versions") or {}
    if isinstance(v, dict) and v.get("vllm"):
        return str(v["vllm"])
    try:
        import vllm

        return vllm.__version__
    except ImportError:
        return None


def summarize(res: Path, card: str) -> dict:
    run = _read(res / "system_run.json")
    bench = _read(res / "system_bench.json")
    row = (bench.get("phases") or {}).get("stream_videos") or {}
    vph, bvph = run.get("videos_per_hour"), row.get("videos_per_hour")
    kill = run.get("kill") or {}
    return {
        "card": card or (bench.get("versions") or {}).get("device") or None,
        "vllm": _vllm(bench),
        "database": f"PostgreSQL {run['database']}" if run.get("database") else None,
        "broker": f"Redis {run['broker']}" if run.get("broker") else None,
        "videos_per_hour": vph,
        "bench_videos_per_hour": bvph,
        "ratio_to_bench": round(vph / bvph, 3) if vph and bvph else None,
        "gpu_busy": run.get("gpu_busy"),
        "cpu_cores_used": run.get("cpu_cores_used"),
        "gpu_worker_cores_used": run.get("gpu_worker_cores_used"),
        "time_split": run.get("time_split"),
        "kill": {"lost": kill.get("lost"), "duplicated": kill.get("duplicated"), "stuck": kill.get("stuck"),
                 "in_flight_at_kill": kill.get("in_flight_at_kill"), "restart_ready_s": kill.get("restart_ready_s"),
                 "audit": kill.get("audit")},
        "schema_check": run.get("schema_check"),
        "failed_in_window": run.get("failed_in_window"), "failed_reasons": run.get("failed_reasons"),
        "window_s": run.get("window_s"), "videos_in_window": run.get("videos_in_window"),
        "in_flight_mean": run.get("in_flight_mean"), "analyses_per_hour": run.get("analyses_per_hour"),
        "whole_run": run.get("whole_run"), "gpu_worker_start_s": run.get("gpu_worker_start_s"),
        "clips": run.get("clips"), "cpu_workers": run.get("cpu_workers"), "settings": run.get("settings"),
        "bench": {k: row.get(k) for k in ("clips", "scenarios", "seconds", "analyses_per_hour", "capacity",
                                          "admitted_in_flight", "engine_running_mean", "prompt_tokens_per_request",
                                          "output_tokens", "errors") if k in row} or None,
        "bench_engine_kwargs": bench.get("engine_kwargs"),
        "errors": [e for e in [run.get("error")] + [f"bench {k}: {str(v)[-300:]}" for k, v in
                                                    (bench.get("errors") or {}).items()] if e],
        "commands": {"system": run.get("command"), "bench": "bench_engine --label system_bench (gpukit/stages.sh system)"},
    }


def markdown(s: dict, title: str) -> str:
    ts = s.get("time_split") or {}
    lines = [f"# {title}", "",
             f"Card: {s['card'] or 'none (CPU)'}; vLLM {s['vllm']}; {s['database']}; {s['broker']}.", "",
             "| figure | value |", "| --- | --- |"]
    for k in ("videos_per_hour", "bench_videos_per_hour", "ratio_to_bench", "gpu_busy", "cpu_cores_used",
              "gpu_worker_cores_used", "analyses_per_hour", "in_flight_mean", "window_s", "videos_in_window",
              "gpu_worker_start_s"):
        lines.append(f"| {k} | {s.get(k)} |")
    k = s.get("kill") or {}
    lines.append(f"| kill: lost / duplicated / stuck | {k.get('lost')} / {k.get('duplicated')} / {k.get('stuck')} "
                 f"({k.get('in_flight_at_kill')} in flight at the SIGKILL; ready again after {k.get('restart_ready_s')} s) |")
    lines.append(f"| stored answers against their schemas | {s.get('schema_check')} |")
    lines.append(f"| failed analyses in the window / by reason (whole run) | {s.get('failed_in_window')} / {s.get('failed_reasons')} |")
    lines += ["", "Time split of the analyses stored in the window (seconds, mean / p50):", "",
              "| step | mean | p50 |", "| --- | --- | --- |"]
    for name, v in ts.items():
        if isinstance(v, dict):
            lines.append(f"| {name} | {v['mean']} | {v['p50']} |")
    if s.get("errors"):
        lines += ["", "Errors: " + "; ".join(s["errors"])]
    lines += ["", "Commands:", "", f"    {s['commands']['system']}", f"    {s['commands']['bench']}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--res", required=True, type=Path)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--name", default="system_gpu")
    ap.add_argument("--card", default="")
    ap.add_argument("--title", default="The whole product on one GPU host (issue 56)")
    a = ap.parse_args(argv)
    s = summarize(a.res, a.card.strip())
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{a.name}.json").write_text(json.dumps(s, indent=1) + "\n")
    (a.out / f"{a.name}.md").write_text(markdown(s, a.title))
    print(json.dumps({k: s[k] for k in ("videos_per_hour", "bench_videos_per_hour", "ratio_to_bench", "kill")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
