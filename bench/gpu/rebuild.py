"""Forced-rebuild fault run: the guard's last recovery step on a real engine.

    python -m bench.gpu.rebuild --tiny var/tiny-model --json out.json [--patch on|off]
        [--utilization 0.3] [--llm-kwargs '{"gdn_prefill_backend": "triton"}']

The fault is device-memory corruption of the running engine (its final norm weight turns
NaN, the same injection as tests/workers/test_engine_host.py): every request and canary is
degenerate until the weights are read again, so only the ladder's rebuild step can cure it.
Runs vidlora's `EngineHost` in this process (the worker's own configuration, engine in
process so the fault can be injected), and records, with versions:
- outputs of a base and an adapter request before the fault;
- the same requests after it: recovery steps, `recovered_by`, equality with before;
- device memory (free / allocated / reserved) before the engine, with it, after the
  rebuild's close, and with the new engine; the rebuild's seconds;
- or, where closing the engine does not free its memory, `EngineReplaceRequired` and the
  shortfall (the worker then exits for its supervisor), plus the allocation sites of the
  largest blocks still held (torch.cuda memory history), to say who holds them.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def corrupt_final_norm(host) -> str:
    """Turn the running engine's final norm weight NaN (in-process engine only). The CPU
    backend repacks matmul weights, so a norm weight is one that is used as stored."""
    import torch

    model = host.llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.model
    name, param = next((n, p) for n, p in model.named_parameters()
                       if "language_model" in n and n.endswith(".norm.weight") and "layers" not in n)
    with torch.no_grad():
        param.fill_(float("nan"))
    return name


def memory() -> dict:
    try:
        import torch

        if not torch.cuda.is_available():
            return {}
        free, total = torch.cuda.mem_get_info()
        return {"free_gib": round(free / 2**30, 2), "total_gib": round(total / 2**30, 2),
                "allocated_gib": round(torch.cuda.memory_allocated() / 2**30, 2),
                "reserved_gib": round(torch.cuda.memory_reserved() / 2**30, 2)}
    except Exception as exc:  # noqa: BLE001
        return {"error": repr(exc)}


def held_blocks(top: int = 6) -> list[dict]:
    """Largest live allocations and the Python frames that made them."""
    import torch

    try:
        snap = torch.cuda.memory._snapshot()
    except Exception as exc:  # noqa: BLE001
        return [{"error": repr(exc)}]
    blocks = []
    for seg in snap.get("segments", []):
        for blk in seg.get("blocks", []):
            if blk.get("state") == "active_allocated":
                frames = [f"{f.get('filename', '?').split('site-packages/')[-1]}:{f.get('line')} {f.get('name')}"
                          for f in (blk.get("frames") or []) if "torch/" not in f.get("filename", "")][:6]
                blocks.append({"gib": round(blk["size"] / 2**30, 3), "frames": frames})
    return sorted(blocks, key=lambda b: -b["gib"])[:top]


def run(a) -> dict:
    import torch

    from engine_patch.env import versions
    from engine_patch.guard import EngineReplaceRequired
    from vidlora.config import Settings
    from vidlora.engine_io import AnalysisRequest
    from workers.engine_host import EngineHost

    tiny = Path(a.tiny)
    res: dict = {"patch": a.patch, "mem_before_engine": memory()}
    if torch.cuda.is_available():
        torch.cuda.memory._record_memory_history(max_entries=20000)
    settings = Settings(
        model=str(tiny / "base"), adapter_root=str(tiny / "adapters"), var_dir=str(Path(a.work)),
        adapter_cache_dir=str(Path(a.work) / "prepared"), max_loras=2, max_cpu_loras=4, max_lora_rank=8,
        max_model_len=2048, max_num_seqs=8, gpu_memory_utilization=a.utilization, enforce_eager=a.eager,
        served_model_name="", kv_cache_memory_bytes=None, guard_quarantine_after=2, engine_rebuild="auto")
    extra = json.loads(a.llm_kwargs or "{}")

    class Host(EngineHost):
        def engine_kwargs(self):
            kw = super().engine_kwargs()
            kw["limit_mm_per_prompt"] = {"video": 0, "image": 0}
            kw.update(extra)
            return kw

    adapter = sorted(p.name for p in (tiny / "adapters").iterdir())[0]

    def reqs(tag):
        return [AnalysisRequest(request_key=f"{tag}-{ad or 'base'}", prompt="Describe the burial chamber.",
                                system=None, frames=[], timestamps=[], adapter_name=ad,
                                adapter_path=str(tiny / "adapters" / ad) if ad else None, max_tokens=16,
                                temperature=0.0, top_p=1.0, seed=None, repetition_penalty=1.3)
                for ad in (None, adapter)]

    t = time.time()
    host = Host(settings)
    host.start()
    res["engine_start_s"] = round(time.time() - t, 1)
    res["mem_with_engine"] = memory()
    before = host.generate(reqs("before"))
    res["before"] = [{"key": o.request_key, "error": o.error, "tokens": o.token_ids} for o in before]
    res["corrupted"] = corrupt_final_norm(host)
    t = time.time()
    try:
        after = host.generate(reqs("after"))
    except EngineReplaceRequired as exc:
        res.update(outcome="replace_required", reason=str(exc), mem_after_close=memory(), held=held_blocks())
        return res
    res["recovery_s"] = round(time.time() - t, 1)
    res["mem_after_rebuild"] = memory()
    res["after"] = [{"key": o.request_key, "error": o.error, "tokens": o.token_ids, "health": o.health}
                    for o in after]
    same = [b.token_ids == x.token_ids and x.error is None for b, x in zip(before, after)]
    res["outcome"] = "rebuilt" if all(same) and host.rebuilds == 1 else "failed"
    res["rebuilds"] = host.rebuilds
    res["versions"] = versions()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu.rebuild")
    ap.add_argument("--tiny", default=str(ROOT / "var" / "tiny-model"))
    ap.add_argument("--work", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "vidlora-rebuild"))
    ap.add_argument("--json", required=True)
    ap.add_argument("--patch", choices=("on", "off"), default="on")
    ap.add_argument("--utilization", type=float, default=0.3)
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--llm-kwargs", default="{}")
    a = ap.parse_args(argv)
    os.environ["VIDLORA_ENGINE_PATCH"] = a.patch
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: the fault is injected here
    t0 = time.time()
    try:
        res = run(a)
    except Exception as exc:  # noqa: BLE001 - a crash is a result to record
        res = {"outcome": "crashed", "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-3000:]}
    res["wall_s"] = round(time.time() - t0, 1)
    res["command"] = "python -m bench.gpu.rebuild " + " ".join(sys.argv[1:] if argv is None else argv)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(res, indent=1, default=str))
    print(json.dumps({k: res.get(k) for k in ("outcome", "reason", "recovery_s", "mem_with_engine",
                                               "mem_after_rebuild", "mem_after_close", "wall_s")}))
    return 0 if res.get("outcome") in ("rebuilt", "replace_required") else 1


if __name__ == "__main__":
    raise SystemExit(main())
