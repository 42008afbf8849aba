"""Issue 45's table from the device stage ``fit80`` (``bench_engine`` JSONs, one engine each):

    python -m gpukit.summarize_fit --res bench/results/h100_fit80 --out bench/results/fit_80gb

One row per phase: the card, vLLM, how the weights were held, videos per hour (three analyses a
video: the shipped scenarios), the ratio to the same engine's streamed no-LoRA phase, the mean
decode batch vLLM ran in decode-only steps, and what the stream had admitted beside what vLLM
ran and kept waiting, per step while analyses were still waiting to be admitted.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

ANALYSES_PER_VIDEO = 3
WHAT = {
    "stream_videos_nolora": "worker loop, no LoRA",
    "stream_videos": "worker loop, 3 adapters",
    "all_videos_nolora": "bare `llm.generate`, no LoRA",
    "all_videos": "bare `llm.generate`, 3 adapters",
    "hostprof_videos": "worker loop, 3 adapters, engine thread profiled",
    "hostprof_videos_nolora": "worker loop, no LoRA, engine thread profiled",
}


def rows(res: list[Path]) -> list[dict]:
    out = []
    for path in sorted(p for r in res for p in r.glob("fit80_*.json")):
        run = json.loads(path.read_text())
        phases = run.get("phases") or {}
        kw = run.get("engine_kwargs") or {}
        for name, row in phases.items():
            base = name.split("@")[0].split("#")[0].replace("_noschema", "")
            if base not in WHAT or not isinstance(row, dict):
                continue
            schemas = row.get("schemas", run.get("schemas", True))
            # the ratio's no-LoRA phase: the same engine, with the schemas as this phase had them
            nolora = phases.get("stream_videos_nolora" + ("" if schemas else "_noschema"))
            steps = row.get("steps") or {}
            out.append({
                "run": path.stem, "phase": name, "what": WHAT[base],
                "card": (run.get("versions") or {}).get("device"), "vllm": (run.get("versions") or {}).get("vllm"),
                "dtype": kw.get("quantization") or "bf16", "kv_cache_dtype": kw.get("kv_cache_dtype", "auto"),
                "analyses": row.get("requests"), "seconds": row.get("seconds"),
                "videos_per_hour": row.get("videos_per_hour"),
                "ratio_to_nolora": (round(row["req_s"] / nolora["req_s"], 3)
                                    if nolora and not name.startswith("all") else None),
                "decode_batch_mean": steps.get("decode_only_mean_batch"),
                "decode_only_ms_per_step": steps.get("decode_only_ms_per_step"),
                "mfu_in_mixed_steps": steps.get("mfu_in_mixed_steps"),
                "admitted_in_flight": row.get("admitted_in_flight"),
                "engine_running_mean": row.get("engine_running_mean"),
                "engine_waiting_mean": row.get("engine_waiting_mean"),
                "capacity": row.get("capacity"), "tokens_per_request": row.get("tokens_per_request"),
                "output_tokens_per_analysis": round(row["output_tokens"] / row["requests"], 1) if row.get("requests") else None,
                "errors": row.get("errors"), "engine_start_s": run.get("engine_start_s"),
                "schemas": schemas,
                "host_profile": row.get("host_profile"),
                "cache_layout": run.get("cache_layout"),
                "weight_gib": (run.get("memory") or {}).get("weight_gib"),
                "kv_and_state_cache_gib": (run.get("memory") or {}).get("kv_and_state_cache_gib"),
                "lora_slot_gib_total": (run.get("memory") or {}).get("lora_slot_gib_total"),
            })
        for name, err in (run.get("errors") or {}).items():
            out.append({"run": path.stem, "phase": name, "what": "failed", "error": str(err)[-600:]})
    return out


def table(rs: list[dict]) -> str:
    head = ("| run | phase | card | weights | schemas | videos/h | x no-LoRA | decode batch | decode step ms | "
            "admitted | vLLM running | vLLM waiting |\n|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
    body = []
    for r in rs:
        if "error" in r:
            body.append(f"| {r['run']} | {r['phase']} | failed: {r['error'].splitlines()[-1][:120]} ||||||||||")
            continue
        body.append("| " + " | ".join(str(x if x is not None else "") for x in (
            r["run"], r["what"], r["card"], r["dtype"], "on" if r["schemas"] else "off", f"{r['videos_per_hour']:,}" if r["videos_per_hour"] else "",
            r["ratio_to_nolora"], r["decode_batch_mean"], r["decode_only_ms_per_step"], r["admitted_in_flight"],
            r["engine_running_mean"], r["engine_waiting_mean"])) + " |")
    return head + "\n".join(body) + "\n"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--res", nargs="+", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True, help="path stem: writes STEM.json and STEM_table.md")
    a = p.parse_args()
    rs = rows(a.res)
    a.out.with_suffix(".json").write_text(json.dumps({"phases": rs}, indent=2) + "\n")
    a.out.with_name(a.out.name + "_table.md").write_text(table(rs))
    print(table(rs))


if __name__ == "__main__":
    main()
