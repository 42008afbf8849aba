"""Issue 35's table from the device's bench_engine JSONs (device stages ``stream``, ``stream2k*``):
python -m gpukit.summarize_stream --res bench/results/h200_stream bench/results/h200_stream2k \
    --out bench/results/streaming_h200

Each phase: analyses/s, videos/h (3 analyses per video, the shipped scenarios), the ratio to the
bare engine's no-LoRA rate measured on the same engine at the same shape, and MFU (model FLOPs of
every prompt and output token over the phase's time, 790 TFLOP/s bf16 peak). Streaming phases
traced per step (``bench.gpu.step_trace``) add the share of time in decode-only steps, the cost
of one, and the utilisation inside the mixed steps (what a queue longer than the engine holds
sustains). Phases profiled with torch.profiler (``streamprof_*``, device stage ``decodeprof``) add
a second table: GPU milliseconds per engine step by kernel class, each beside the same run's
no-LoRA window, so what one adapter adds is read class by class.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

ANALYSES_PER_VIDEO = 3
WHAT = {
    "all_nolora": "bare `llm.generate`, no LoRA, everything at once",
    "all_one": "bare `llm.generate`, 1 adapter, everything at once",
    "all_mixed3": "bare `llm.generate`, 3 adapters interleaved, everything at once",
    "stream_nolora": "streaming worker loop (`EngineStream`), no LoRA",
    "stream_one": "streaming worker loop, 1 adapter",
    "stream_mixed3": "streaming worker loop, 3 adapters as they arrive",
    "closed_grouped3": "today's worker: closed batches of 16 by adapter (`EngineHost.generate`)",
    "streamprof_one": "streaming worker loop, 1 adapter, under torch.profiler for 40 steps",
    "streamprof_nolora": "streaming worker loop, no LoRA, under torch.profiler for 40 steps",
}
STEP_FIELDS = ("share_of_time_decode_only", "decode_only_ms_per_step", "decode_only_mean_batch",
               "mixed_mean_prefill_tokens", "mfu_in_mixed_steps")


def rows(res: list[Path]) -> list[dict]:
    out = []
    for path in sorted(p for r in res for p in r.glob("*.json")):
        run = json.loads(path.read_text())
        phases = run.get("phases") or {}  # other stages' JSONs (cpufeed manifests) share the folder
        for key, row in phases.items():
            name, _, shape = key.partition("#")
            if not shape:
                continue
            prompt, output, _ = shape.split("x")
            # The bare engine's no-LoRA rate on this engine at this request shape (any count).
            bare = next((v for k, v in phases.items() if k.startswith(f"all_nolora#{prompt}x{output}x")), None)
            out.append({
                "run": path.stem, "phase": key, "what": WHAT.get(name, name), "prompt_tokens": int(prompt),
                "output_tokens": int(output), "requests": row["requests"], "seconds": row["seconds"],
                "analyses_per_s": row["req_s"], "videos_per_hour": round(row["req_s"] * 3600 / ANALYSES_PER_VIDEO),
                "ratio_to_bare_nolora": round(row["req_s"] / bare["req_s"], 3) if bare else None,
                "mfu": row.get("mfu"), "peak_in_flight": row.get("peak_in_flight"),
                "mean_admission_wait_s": row.get("mean_admission_wait_s"), "lora_path": row.get("lora_path"),
                "errors": row.get("errors"), "guard_settled": row.get("guard_settled"),
                "engine_start_s": run.get("engine_start_s"), "versions": run.get("versions"),
                "engine_kwargs": {k: run.get("engine_kwargs", {}).get(k) for k in
                                  ("max_num_seqs", "max_loras", "max_lora_rank", "enforce_eager", "max_num_batched_tokens")},
                "kv_tokens": (run.get("memory", {}).get("num_gpu_blocks") or 0) * (run.get("memory", {}).get("block_size") or 0),
                "steps": {k: row["steps"][k] for k in STEP_FIELDS} if row.get("steps") else None,
            })
    return out


def windows(res: list[Path]) -> list[dict]:
    """Each profiled window per engine step: wall, GPU busy, and GPU time by kernel class, with
    the no-LoRA window of the same run (same engine) beside it where there is one."""
    out = []
    for path in sorted(p for r in res for p in r.glob("*.json")):
        phases = json.loads(path.read_text()).get("phases") or {}
        per_step = {}
        for key, row in phases.items():
            w = row.get("profile_window")
            if not w:
                continue
            n = max(1, len(w.get("steps") or []) or w.get("steps_profiled") or 40)
            per_step[key] = {
                "steps": n, "wall_ms": round(1e3 * w["wall_s"] / n, 2), "gpu_busy_ms": round(1e3 * w["gpu_busy_s"] / n, 2),
                "gpu_idle_share": w.get("gpu_idle_share"),
                "mean_decodes": round(sum(s[2] for s in w.get("steps") or []) / n, 1) if w.get("steps") else None,
                "by_class_ms": {k: round(v / n, 3) for k, v in (w.get("by_class_ms") or {}).items()},
            }
        base = next((v for k, v in per_step.items() if k.startswith("streamprof_nolora")), None)
        for key, row in per_step.items():
            if base is not None and row is not base:
                row["minus_nolora_ms"] = {k: round(row["by_class_ms"].get(k, 0.0) - base["by_class_ms"].get(k, 0.0), 3)
                                          for k in sorted(set(row["by_class_ms"]) | set(base["by_class_ms"]))}
                row["gpu_busy_minus_nolora_ms"] = round(row["gpu_busy_ms"] - base["gpu_busy_ms"], 2)
                row["wall_minus_nolora_ms"] = round(row["wall_ms"] - base["wall_ms"], 2)
            out.append({"run": path.stem, "phase": key, **row})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--res", required=True, nargs="+")
    ap.add_argument("--out", required=True, help="path without suffix: writes .json")
    a = ap.parse_args()
    table = rows([Path(r) for r in a.res])
    profiled = windows([Path(r) for r in a.res])
    Path(a.out + ".json").write_text(json.dumps({"phases": table, **({"profile_windows": profiled} if profiled else {})},
                                                indent=1) + "\n")
    for r in table:
        print(f"| {r['run']} | {r['phase']} | {r['what']} | {r['analyses_per_s']:.2f} | {r['videos_per_hour']:,} | "
              f"{r['ratio_to_bare_nolora'] if r['ratio_to_bare_nolora'] is not None else '-'} | {r['mfu']} | "
              f"{' '.join(f'{k}={v}' for k, v in (r['steps'] or {}).items())} |")
    for w in profiled:
        print(f"| {w['run']} | {w['phase']} | wall {w['wall_ms']} ms/step | GPU busy {w['gpu_busy_ms']} | "
              f"idle {w['gpu_idle_share']} | decodes {w['mean_decodes']} | "
              + " ".join(f"{k}: {v}" + (f" ({w['minus_nolora_ms'][k]:+})" if 'minus_nolora_ms' in w else "")
                         for k, v in w['by_class_ms'].items()) + " |")


if __name__ == "__main__":
    main()
