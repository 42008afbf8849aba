"""LoRA linears, side by side in one process: base GEMM alone, + Punica, + dense (issue 14).

Each module of one Qwen3.5 layer runs through vLLM's own Punica wrapper of this platform
(`PunicaWrapperGPU` with Triton on CUDA, `PunicaWrapperCPU` otherwise) with engine_patch
applied: the stock Punica side is the same wrapper with the dense path switched off
(`dense_lora.set_enabled(False)`), so both sides share the wrapper, the weights and the inputs.
Every case is also checked against an fp32 reference of `x W^T + x A^T B^T`: the error of each
path's LoRA delta relative to the delta's largest entry.

    python -m bench.lora_paths --shape 27b --json bench/results/lora_paths_h200.json   # H200
    python -m bench.lora_paths --shape cpu --json bench/results/lora_paths_cpu.json    # CPU
    python -m bench.lora_paths --graphs --json graphs.json                             # H200, issue 35

`--graphs` (CUDA only): decode-sized steps as vLLM runs them, inside CUDA graphs. Each module
is captured three times (base alone; + LoRA with Punica captured; + LoRA with engine_patch's
all-slots form captured) with one mapping, then replayed after the wrapper is given other
mappings of the same length (one adapter, three runs, every slot interleaved with base rows):
each replay's LoRA delta is checked against fp32 for the mapping it replayed with (what makes a
captured form right), and the replays are timed.

Ratios are (base + LoRA) / base time; "layer" weighs GDN layers 3 : 1 attention, as Qwen3.5
stacks them, with the MLP in every layer.
"""
from __future__ import annotations

import argparse
import inspect
import json
import statistics
import time
from pathlib import Path

import torch

# (module, layer kind, input width, output slices, row-parallel)
SHAPES = {
    "27b": dict(hidden=5120, gdn_qkvz=(2048, 2048, 6144, 6144), gdn_ba=(48, 48), gdn_v=6144,
                attn_qkv=(12288, 1024, 1024), attn_o=6144, mlp=17408),
    "cpu": dict(hidden=1024, gdn_qkvz=(256, 256, 1024, 1024), gdn_ba=(8, 8), gdn_v=1024,
                attn_qkv=(2048, 256, 256), attn_o=1024, mlp=3072),
}
SLOT_IDS = [1, 2, 3, None]


def modules(s: dict) -> list[tuple[str, str, int, tuple[int, ...], bool]]:
    h = s["hidden"]
    return [
        ("gdn.in_proj_qkvz", "gdn", h, s["gdn_qkvz"], False),
        ("gdn.in_proj_ba", "gdn", h, s["gdn_ba"], False),
        ("gdn.out_proj", "gdn", s["gdn_v"], (h,), True),
        ("attn.qkv_proj", "attn", h, s["attn_qkv"], False),
        ("attn.o_proj", "attn", s["attn_o"], (h,), True),
        ("mlp.gate_up_proj", "mlp", h, (s["mlp"], s["mlp"]), False),
        ("mlp.down_proj", "mlp", s["mlp"], (h,), True),
    ]


def make_wrapper(device: str, max_tokens: int, rank: int, index_mapping: tuple[int, ...]):
    if device == "cuda":
        from vllm.lora.punica_wrapper.punica_gpu import PunicaWrapperGPU as cls
    else:
        from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU as cls
    from vllm.lora.layers import LoRAMapping

    kwargs = {"max_loras": len(SLOT_IDS)}
    try:  # 0.32 reads lora_config in meta_args; 0.26 takes only max_loras
        from vllm.config.lora import LoRAConfig

        kwargs["lora_config"] = LoRAConfig(max_lora_rank=rank, max_loras=len(SLOT_IDS))
    except Exception:  # noqa: BLE001
        pass
    w = cls(max_tokens, 64, device, **kwargs)
    mapping = LoRAMapping(index_mapping=index_mapping, prompt_mapping=(index_mapping[-1],), is_prefill=True)
    extra = [0] if "extra_vocab_size" in inspect.signature(cls.update_metadata).parameters else []
    w.update_metadata(mapping, SLOT_IDS, len(SLOT_IDS), 248320, *extra)
    return w


def timer(device: str):
    if device == "cuda":
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, warmup=25, rep=100)

    def cpu(fn, reps: int = 5) -> float:
        fn()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts)
    return cpu


def _operands(device, dtype, in_w, slices, rank, tokens):
    """Input, base weight and every slot's A and B, seeded, scaled so the outputs stay O(1)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(tokens, in_w, generator=g).to(device, dtype)
    W = (torch.randn(sum(slices), in_w, generator=g) / in_w ** 0.5).to(device, dtype)
    A = tuple((torch.randn(len(SLOT_IDS), 1, rank, in_w, generator=g) / in_w ** 0.5).to(device, dtype) for _ in slices)
    B = tuple((torch.randn(len(SLOT_IDS), 1, n, rank, generator=g) / rank ** 0.5).to(device, dtype) for n in slices)
    return x, W, A, B


def _reference(x, A, B, slices, mapping) -> torch.Tensor:
    """fp32 LoRA delta of each token under its own slot (none for id 0)."""
    slot_of = {lid: k for k, lid in enumerate(SLOT_IDS) if lid is not None}
    slots = torch.tensor([slot_of.get(m, -1) for m in mapping], device=x.device)
    ref = torch.zeros(x.shape[0], sum(slices), device=x.device)
    for s in set(slots.tolist()) - {-1}:
        rows = slots == s
        off = 0
        for a, b, n in zip(A, B, slices):
            ref[rows, off:off + n] = (x.float()[rows] @ a[s, 0].float().t()) @ b[s, 0].float().t()
            off += n
    return ref


def _module_calls(w, x, W, A, B, y, slices, row: bool, rank: int):
    """The base GEMM into ``y``, and the same plus LoRA as vLLM's layer calls the wrapper
    (row-parallel: shrink into a buffer, then expand; otherwise add_lora_linear)."""
    def base():
        torch.mm(x, W.t(), out=y)

    def with_lora():
        torch.mm(x, W.t(), out=y)
        if row:
            buf = torch.zeros((1, x.shape[0], rank), dtype=torch.float32, device=x.device)
            w.add_shrink(buf, x, A, 1.0)
            w.add_expand(y, buf, B, slices, offset_start=0, add_inputs=True)
        else:
            w.add_lora_linear(y, x, A, B, 1.0, slices)
    return base, with_lora


def case(device, dtype, in_w, slices, row, rank, tokens, mapping, bench):
    from engine_patch.patches import dense_lora

    out_w = sum(slices)
    x, W, A, B = _operands(device, dtype, in_w, slices, rank, tokens)
    w = make_wrapper(device, max(tokens, 256), rank, mapping)
    y = torch.empty(tokens, out_w, device=device, dtype=dtype)

    base, with_lora = _module_calls(w, x, W, A, B, y, slices, row, rank)

    ref = _reference(x, A, B, slices, mapping)
    base()
    y0 = y.float().clone()
    res = {"base_ms": bench(base)}
    for path, on in (("punica", False), ("dense", True)):
        dense_lora.set_enabled(on)
        before = dense_lora.counts()
        with_lora()
        ran = {k: v - before[k] for k, v in dense_lora.counts().items()}
        err = ((y.float() - y0) - ref).abs().max().item() / max(ref.abs().max().item(), 1e-12)
        res[path] = {"ms": bench(with_lora), "ratio": None, "rel_err_vs_fp32": err, "ran": ran}
        res[path]["ratio"] = res[path]["ms"] / res["base_ms"]
    dense_lora.set_enabled(True)
    return res


GRAPH_MAPPINGS = {
    "1 adapter": lambda T: (1,) * T,
    "3 runs": lambda T: (1,) * (T // 3) + (2,) * (T // 3) + (3,) * (T - 2 * (T // 3)),
    "interleaved with base": lambda T: tuple((0, 1, 2, 3, 0, 3, 2, 1)[k % 8] for k in range(T)),
}


def _capture(fn):
    """``fn`` as a CUDA graph (warmed up on a side stream first, as torch asks)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def _replay_ms(graph, reps: int = 200) -> float:
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def graph_case(in_w, slices, row, rank, tokens) -> dict:
    from vllm.lora.layers import LoRAMapping

    dtype, device = torch.bfloat16, "cuda"
    out_w = sum(slices)
    x, W, A, B = _operands(device, dtype, in_w, slices, rank, tokens)
    capture_mapping = GRAPH_MAPPINGS["1 adapter"](tokens)
    w = make_wrapper(device, max(tokens, 256), rank, capture_mapping)
    y = torch.empty(tokens, out_w, device=device, dtype=dtype)

    base, with_lora = _module_calls(w, x, W, A, B, y, slices, row, rank)

    def set_mapping(mapping):
        extra = [0] if "extra_vocab_size" in inspect.signature(type(w).update_metadata).parameters else []
        w.update_metadata(LoRAMapping(index_mapping=mapping, prompt_mapping=(mapping[-1],), is_prefill=True),
                          SLOT_IDS, len(SLOT_IDS), 248320, *extra)

    base_graph = _capture(base)
    base_graph.replay()
    torch.cuda.synchronize()
    y0 = y.float().clone()
    res = {"base_ms": _replay_ms(base_graph)}
    for path, mode in (("punica", "off"), ("all_slots", "on")):
        w._vidlora_graph_mode = mode
        set_mapping(capture_mapping)
        graph = _capture(with_lora)
        entry = {"ms": _replay_ms(graph), "rel_err_vs_fp32": {}}
        for name, make in GRAPH_MAPPINGS.items():
            mapping = make(tokens)
            set_mapping(mapping)
            graph.replay()
            torch.cuda.synchronize()
            ref = _reference(x, A, B, slices, mapping)
            entry["rel_err_vs_fp32"][name] = ((y.float() - y0) - ref).abs().max().item() / max(ref.abs().max().item(), 1e-12)
        entry["ratio"] = entry["ms"] / res["base_ms"]
        res[path] = entry
    return res


def graphs_main(a) -> int:
    from engine_patch.env import versions

    shape = SHAPES[a.shape]
    tokens = [int(t) for t in (a.tokens or "16,64,152,256,512").split(",")]
    rows, layers = [], []
    for rank in [int(r) for r in a.ranks.split(",")]:
        for T in tokens:
            sel = []
            for name, kind, in_w, slices, row in modules(shape):
                r = graph_case(in_w, slices, row, rank, T)
                row_ = {"rank": rank, "tokens": T, "module": name, "kind": kind, **r}
                rows.append(row_)
                sel.append(row_)
                errs = {p: max(r[p]["rel_err_vs_fp32"].values()) for p in ("punica", "all_slots")}
                print(f"[lora_graphs] r={rank} T={T} {name:18s} base {r['base_ms']:.4f} ms  punica x{r['punica']['ratio']:.3f} "
                      f"(err {errs['punica']:.1e})  all_slots x{r['all_slots']['ratio']:.3f} (err {errs['all_slots']:.1e})", flush=True)
            wt = {"gdn": 3, "attn": 1, "mlp": 4}
            tot = {k: sum(wt[r["kind"]] * (r[k]["ms"] if k != "base_ms" else r[k]) for r in sel)
                   for k in ("base_ms", "punica", "all_slots")}
            layers.append({"rank": rank, "tokens": T, "punica_ratio": tot["punica"] / tot["base_ms"],
                           "all_slots_ratio": tot["all_slots"] / tot["base_ms"],
                           "punica_extra_ms_per_4_layers": tot["punica"] - tot["base_ms"],
                           "all_slots_extra_ms_per_4_layers": tot["all_slots"] - tot["base_ms"],
                           "max_rel_err": {p: max(max(r[p]["rel_err_vs_fp32"].values()) for r in sel)
                                           for p in ("punica", "all_slots")}})
            L = layers[-1]
            print(f"[lora_graphs] LAYER r={rank} T={T}: punica x{L['punica_ratio']:.3f} all_slots x{L['all_slots_ratio']:.3f} "
                  f"max err punica {L['max_rel_err']['punica']:.1e} all_slots {L['max_rel_err']['all_slots']:.1e}", flush=True)
    out = {"command": "python -m bench.lora_paths --graphs " + " ".join(
               f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items() if v and k != "graphs"),
           "device": "cuda", "versions": versions(), "shape": a.shape, "dtype": "torch.bfloat16",
           "capture_mapping": "1 adapter", "replayed_mappings": list(GRAPH_MAPPINGS), "rows": rows, "layers": layers}
    Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), default="27b")
    ap.add_argument("--tokens", default="")
    ap.add_argument("--ranks", default="64,128")
    ap.add_argument("--json", required=True)
    ap.add_argument("--graphs", action="store_true", help="decode sizes inside CUDA graphs: Punica vs all-slots")
    a = ap.parse_args()
    import engine_patch
    from engine_patch.env import versions

    applied = engine_patch.apply()
    if "dense_lora" not in applied:
        raise SystemExit(f"dense_lora not applied ({applied}); unset VIDLORA_DENSE_LORA=off")
    if a.graphs:
        if not torch.cuda.is_available():
            raise SystemExit("--graphs needs CUDA")
        return graphs_main(a)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16
    tokens = [int(t) for t in (a.tokens or ("256,2048,8192" if device == "cuda" else "64,512")).split(",")]
    bench = timer(device)
    shape = SHAPES[a.shape]
    rows = []
    for rank in [int(r) for r in a.ranks.split(",")]:
        for T in tokens:
            third = T // 3
            layouts = {"1 adapter": (1,) * T, "3 runs": (1,) * third + (2,) * third + (3,) * (T - 2 * third)}
            for layout, mapping in layouts.items():
                for name, kind, in_w, slices, row in modules(shape):
                    r = case(device, dtype, in_w, slices, row, rank, T, mapping, bench)
                    rows.append({"rank": rank, "tokens": T, "layout": layout, "module": name, "kind": kind, **r})
                    print(f"[lora_paths] r={rank} T={T} {layout:9s} {name:18s} base {r['base_ms']:.3f} ms  "
                          f"punica x{r['punica']['ratio']:.3f} (err {r['punica']['rel_err_vs_fp32']:.1e})  "
                          f"dense x{r['dense']['ratio']:.3f} (err {r['dense']['rel_err_vs_fp32']:.1e})", flush=True)
    layers = []
    for rank in sorted({r["rank"] for r in rows}):
        for T in tokens:
            for layout in ("1 adapter", "3 runs"):
                sel = [r for r in rows if r["rank"] == rank and r["tokens"] == T and r["layout"] == layout]
                wt = {"gdn": 3, "attn": 1, "mlp": 4}
                tot = {k: sum(wt[r["kind"]] * (r[k]["ms"] if k != "base_ms" else r[k]) for r in sel)
                       for k in ("base_ms", "punica", "dense")}
                layers.append({"rank": rank, "tokens": T, "layout": layout,
                               "punica_ratio": tot["punica"] / tot["base_ms"], "dense_ratio": tot["dense"] / tot["base_ms"],
                               "max_rel_err": {p: max(r[p]["rel_err_vs_fp32"] for r in sel) for p in ("punica", "dense")}})
                L = layers[-1]
                print(f"[lora_paths] LAYER r={rank} T={T} {layout}: punica x{L['punica_ratio']:.3f} dense x{L['dense_ratio']:.3f} "
                      f"max err punica {L['max_rel_err']['punica']:.1e} dense {L['max_rel_err']['dense']:.1e}", flush=True)
    out = {"command": "python -m bench.lora_paths " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items() if v),
           "device": device, "versions": versions(), "shape": a.shape, "dtype": str(dtype), "rows": rows, "layers": layers}
    Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
