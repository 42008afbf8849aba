"""Turn the device run's JSON into bench/results/gpu_*.json and gpu_summary.md tables.

    python -m gpukit.summarize --res DIR [--res DIR2 ...] --out bench/results

DIR holds what gpukit/stages.sh wrote (graphs_patch.json, graphs_nopatch.json,
eager_patch.json, fault_{on,off}.json, verify_{on,off}.json, *.log).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

TARGETS = {"one": 0.85, "mixed": 0.80, "worker": 0.95}


def load(dirs: list[Path], name: str) -> dict | None:
    for d in dirs:
        p = d / name
        if p.is_file():
            return json.loads(p.read_text())
    return None


def log_facts(dirs: list[Path], label: str) -> dict[str, Any]:
    for d in dirs:
        p = d / f"{label}.log"
        if not p.is_file():
            continue
        text = p.read_text(errors="replace")
        facts: dict[str, Any] = {}
        for key, pat in {
            "model_load_gib": r"Model loading took ([\d.]+) GiB",
            "kv_cache_tokens": r"GPU KV cache size: ([\d,]+) tokens",
            "max_concurrency": r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x",
            "available_kv_gib": r"Available KV cache memory: ([\d.]+) GiB",
            "graph_capture_s": r"Graph capturing finished in ([\d.]+) secs",
            "compile_s": r"torch.compile takes ([\d.]+) s in total",
            "init_engine_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) seconds",
        }.items():
            m = re.findall(pat, text)
            if m:
                facts[key] = m[-1]
        return facts
    return {}


def ratio(a: dict | None, b: dict | None, key: str = "total_tok_s") -> float | None:
    if not a or not b or not b.get(key):
        return None
    return round(a[key] / b[key], 3)


def fmt(x: Any, nd: int = 3) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def throughput_table(run: dict) -> list[str]:
    ph = run.get("phases", {})
    base = ph.get("bare_nolora")
    rows = ["| run | batches | requests | s | prompt tok | output tok | output tok/s | total tok/s | req/s | × no-LoRA | non-finite |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    names = {
        "bare_nolora": "no LoRA (bare llm.generate)",
        "bare_one": "1 adapter",
        "bare_mixed3": "3 adapters mixed (one submission, round-robin)",
        "bare_sorted3": "3 adapters, one submission sorted by adapter",
        "bare_grouped3": "3 adapters grouped by dispatcher (3 batches, bare)",
        "host_mixed3": "3 adapters mixed via EngineHost.generate",
        "host_grouped3": "3 adapters grouped by dispatcher via EngineHost",
        "bare_nolora_repeat": "no LoRA again (noise check)",
    }
    for key, label in names.items():
        r = ph.get(key)
        if not r:
            continue
        rows.append(f"| {label} | {r['batches']} | {r['requests']} | {r['seconds']:.2f} | {r['prompt_tokens']} | "
                    f"{r['output_tokens']} | {r['output_tok_s']:.0f} | {r['total_tok_s']:.0f} | {r['req_s']:.3f} | "
                    f"{fmt(ratio(r, base))} | {r['nonfinite_requests']} |")
    return rows


def targets(run: dict) -> list[str]:
    ph = run.get("phases", {})
    g = ph.get
    out = ["| target | measured | met |", "| --- | --- | --- |"]

    def line(name, val, ok):
        out.append(f"| {name} | {fmt(val)} | {'—' if val is None else ('yes' if ok else 'no')} |")

    r1 = ratio(g("bare_one"), g("bare_nolora"))
    line("one adapter ≥ 0.85× no-LoRA (total tok/s)", r1, r1 is not None and r1 >= TARGETS["one"])
    r3 = ratio(g("bare_mixed3"), g("bare_nolora"))
    line("three mixed ≥ 0.8× no-LoRA", r3, r3 is not None and r3 >= TARGETS["mixed"])
    rg = ratio(g("host_grouped3"), g("host_mixed3"))
    line("grouped (dispatcher, EngineHost) ≥ mixed (EngineHost)", rg, rg is not None and rg >= 1.0)
    rgb = ratio(g("bare_grouped3"), g("bare_mixed3"))
    line("grouped (dispatcher, bare) ≥ mixed (bare)", rgb, rgb is not None and rgb >= 1.0)
    rw = ratio(g("host_mixed3"), g("bare_mixed3"))
    line("worker (EngineHost) ≥ 0.95× bare, mixed", rw, rw is not None and rw >= TARGETS["worker"])
    rw2 = ratio(g("host_grouped3"), g("bare_grouped3"))
    line("worker (EngineHost) ≥ 0.95× bare, grouped", rw2, rw2 is not None and rw2 >= TARGETS["worker"])
    noise = ratio(g("bare_nolora_repeat"), g("bare_nolora"))
    out.append(f"| (noise: no-LoRA run twice, ratio) | {fmt(noise)} | |")
    return out


def prefill_table(run: dict) -> list[str]:
    ph = run.get("phases", {})
    rows = ["| prefill batch (16 × ~2,000 tokens, 1 output token) | s | prompt tok/s | model TFLOP | TFLOP/s | MFU vs 790 |",
            "| --- | --- | --- | --- | --- | --- |"]
    for key in ("prefill_nolora", "prefill_one", "prefill_mixed3"):
        r = ph.get(key)
        if r:
            rows.append(f"| {key.split('_', 1)[1]} | {r['seconds']:.2f} | {r['prompt_tokens'] / r['seconds']:.0f} | "
                        f"{r['model_tflop']} | {r['tflops']} | {r['mfu']:.3f} |")
    return rows


def memory_lines(run: dict, facts: dict) -> list[str]:
    m = run.get("memory", {})
    a = run.get("phases", {}).get("adapters20", {})
    kw = run.get("engine_kwargs", {})
    out = [f"- engine: `max_loras={kw.get('max_loras')}`, `max_cpu_loras={kw.get('max_cpu_loras')}`, "
           f"`max_lora_rank={kw.get('max_lora_rank')}`, `max_num_seqs={kw.get('max_num_seqs')}`, "
           f"`max_model_len={kw.get('max_model_len')}`, `gpu_memory_utilization={kw.get('gpu_memory_utilization')}`, "
           f"max_num_batched_tokens={m.get('max_num_batched_tokens')}, prefix caching={m.get('enable_prefix_caching')}"]
    if m.get("weight_gib") is not None:
        out.append(f"- base weights on the GPU: {m['weight_gib']:.1f} GiB (vLLM log: model loading took "
                   f"{facts.get('model_load_gib', '?')} GiB)")
    if m.get("lora_slot_gib_total") is not None:
        out.append(f"- LoRA slots: {m['lora_slot_gib_total']:.2f} GiB for {kw.get('max_loras')} slots = "
                   f"**{m['lora_slot_gib_per_adapter']:.3f} GiB per rank-64 adapter** on the GPU")
    if m.get("kv_and_state_cache_gib") is not None:
        out.append(f"- KV + GDN state cache: {m['kv_and_state_cache_gib']:.1f} GiB; vLLM: KV cache "
                   f"{facts.get('kv_cache_tokens', '?')} tokens, maximum concurrency "
                   f"{facts.get('max_concurrency', '?')} (tokens per request, ×)")
    if m.get("gpu_total_gib") is not None:
        out.append(f"- GPU memory after start: {m['gpu_total_gib'] - m['gpu_free_gib']:.1f} of "
                   f"{m['gpu_total_gib']:.1f} GiB in use")
    if a:
        st = a.get("vllm_lora_state") or {}
        out.append(f"- 20 adapters: `add_lora` (disk → host cache) median {a.get('add_lora_ms_median')} ms each; "
                   f"vLLM then holds {len(st.get('registered', []))} registered (host) and "
                   f"{len(st.get('active', []))} active (GPU slots)")
        out.append(f"- swap-in (host cache → GPU slot): a 16-token, 1-output request takes "
                   f"{a.get('req_ms_swap_in_median')} ms with a swap vs {a.get('req_ms_resident_median')} ms "
                   f"resident → **{a.get('swap_in_cost_ms')} ms per swap**; the LoRA manager's own "
                   f"`activate_adapter` copy: {fmt((a.get('direct_activate_ms') or {}).get('median'))} ms")
    return out


def profile_lines(run: dict) -> list[str]:
    p = run.get("phases", {}).get("profile")
    if not p:
        return []
    out = []
    for kind, d in p.items():
        if not isinstance(d, dict):
            continue
        out.append(f"- {kind}: GPU kernel time {d['gpu_kernel_ms']} ms, of which LoRA kernels "
                   f"{d['lora_kernel_ms']} ms")
        out.append("  | kernel | ms | calls |")
        out.append("  | --- | --- | --- |")
        for k, t, c in d["top"][:10]:
            out.append(f"  | `{k[:80]}` | {t} | {c} |")
    return out


def fault_lines(dirs: list[Path]) -> list[str]:
    out = []
    for patch in ("off", "on"):
        r = load(dirs, f"fault_{patch}.json")
        if not r:
            continue
        if "summary" not in r:
            out.append(f"- engine_patch {patch}: run failed: `{str(r.get('error'))[-300:]}`")
            continue
        s = r["summary"]
        out.append(f"- engine_patch **{patch}**: faulty adapter on a long prompt → {s['bad_long_returned_as']} "
                   f"(text `{s['bad_long_text']!r}`); its short prompt ok: {s['bad_short_ok']}; "
                   f"co-batched good requests damaged: {s['cobatched_damaged'] or 'none'} of {s['good_requests']}; "
                   f"later requests damaged: {s['later_damaged'] or 'none'} of {s['good_requests']}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--res", action="append", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    a = ap.parse_args()
    dirs = a.res
    A = load(dirs, "graphs_patch.json")
    A2 = load(dirs, "graphs_patch2.json")  # a second start of the same engine settings
    if A and A2:
        for k, v in A2.get("phases", {}).items():
            if k not in A["phases"] and k != "warmup":
                A["phases"][k] = dict(v, engine="second start, same settings")
        A["second_engine"] = {k: A2.get(k) for k in ("engine_start_s", "memory", "engine_patch_status")}
    B = load(dirs, "graphs_nopatch.json")
    C = load(dirs, "eager_patch.json")
    md: list[str] = []
    if A:
        fa = log_facts(dirs, "graphs_patch")
        md += ["### Throughput (Qwen3.5-27B shape, dummy weights, CUDA graphs, engine_patch on)", ""]
        md += throughput_table(A) + [""] + targets(A) + [""] + prefill_table(A) + [""]
        md += ["### Memory and adapter swaps", ""] + memory_lines(A, fa) + [""]
        md += ["### Kernel profile (4 × ~2,000-token prompts, 32 output tokens)", ""] + profile_lines(A) + [""]
        A["log_facts"] = fa
    for run, title in ((B, "engine_patch off"), (C, "enforce_eager")):
        if run and A:
            md += [f"### {title} vs the main engine", "", "| run | main engine tok/s | this engine tok/s | ratio |",
                   "| --- | --- | --- | --- |"]
            for k, r in run.get("phases", {}).items():
                ra = A.get("phases", {}).get(k)
                if ra and "total_tok_s" in r:
                    md.append(f"| {k} | {ra['total_tok_s']:.0f} | {r['total_tok_s']:.0f} | {fmt(ratio(r, ra))} |")
            md.append("")
    fl = fault_lines(dirs)
    if fl:
        md += ["### Fault injection (tiny model)", ""] + fl + [""]
    a.out.mkdir(parents=True, exist_ok=True)
    for name, run in (("gpu_throughput_h200.json", A), ("gpu_nopatch_h200.json", B), ("gpu_eager_h200.json", C)):
        if run:
            (a.out / name).write_text(json.dumps(run, indent=2) + "\n")
    for name in ("fault_off.json", "fault_on.json", "verify_on.json", "verify_off.json"):
        r = load(dirs, name)
        if r:
            (a.out / f"gpu_{name.replace('.json', '')}_h200.json").write_text(json.dumps(r, indent=2) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
