"""Issue 36: LoRA on a Qwen3.5/3.6 MoE base (35B-A3B shape on the device, the tiny MoE model on
the CPU): the evidence `engine_patch.moe.VERIFIED` needs, in one process.

    python -m bench.gpu.moe_check --model M [--adapter A ...] [--lengths 16,128,1024]
        [--json out.json] [--llm-kwargs JSON] [--base-only] [--engines both|on|off] [--workdir DIR]

1. registration: every adapter through `engine_patch.registration.AdapterRegistry` (the
   workers' one adapter path), verdicts recorded: on an unverified vLLM/platform every
   adapter on a MoE base is refused, expert-side ones with the expert reason.
2. the #49063 check: the same no-adapter requests (greedy continuation, then teacher-forced
   prompt logprobs) on an engine without LoRA and on one with ``enable_lora``; the base
   output must not change (tokens equal, logprob differences within verify's floors; whether
   it is bit-identical is recorded too). An engine that fails is recorded with its error.
3. exactness (not with ``--base-only`` or ``load_format: dummy``): each adapter with no
   expert-side module, normalised exactly as registration would serve it once verified
   (`adapters.prepare_adapter`), through `engine_patch.verify` (dyn == merged == fp32 ref).

Exit status 0 iff everything that ran passed. The JSON (``--json``) is the evidence format
`engine_patch.moe.evidence_problems` reads; the last stdout line ``RESULT {...}`` is a summary.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

log = logging.getLogger("bench.moe_check")


def _engine_outputs(model: Path, o, lora: bool, prompts: list[list[int]], new_tokens: int,
                    seqs: list[list[int]] | None) -> dict[str, Any]:
    """Greedy tokens for ``prompts`` and teacher-forced scores of ``seqs`` (default: the
    prompts with their own continuation), no adapter, on an engine with or without LoRA."""
    from engine_patch import verify

    out: dict[str, Any] = {"enable_lora": lora}
    t = time.time()
    llm = None
    try:
        llm = verify.make_llm(**verify.llm_args(model, o, lora=lora, max_rank=16, max_loras=1))
        out["start_s"] = round(time.time() - t, 1)
        gens = verify.generate(llm, prompts, [None] * len(prompts), new_tokens)
        out["tokens"] = [g["tokens"] for g in gens]
        seqs = seqs or [p + g["tokens"] for p, g in zip(prompts, gens)]
        out["seqs"] = seqs
        out["scores"] = verify.score(llm, seqs, [None] * len(seqs))
    except Exception as exc:  # noqa: BLE001 - an engine that cannot serve is the finding
        out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        out["trace"] = traceback.format_exc()[-3000:]
        log.error("engine (enable_lora=%s) failed: %s", lora, out["error"])
    finally:
        if llm is not None:
            verify.close_llm(llm)
    out["s"] = round(time.time() - t, 1)
    return out


def base_unchanged(off: dict[str, Any], on: dict[str, Any]) -> dict[str, Any]:
    """The #49063 verdict: no-adapter output with enable_lora vs without."""
    from engine_patch import verify

    if off.get("error") or on.get("error"):
        return {"ok": False, "error": on.get("error") or off.get("error")}
    same_tokens = off["tokens"] == on["tokens"]
    cmp = [verify.compare(a, b) for a, b in zip(off["scores"], on["scores"])]
    mean = max(c["mean"] for c in cmp)
    mx = max(c["max"] for c in cmp)
    ok = same_tokens and all(c["finite"] for c in cmp) and mean <= verify.FLOOR_MEAN and mx <= verify.FLOOR_MAX
    return {"ok": ok, "tokens_equal": same_tokens, "bit_identical": same_tokens and mx == 0.0,
            "max_mean_abs_dlogprob": mean, "max_abs_dlogprob": mx,
            "tolerance": {"mean": verify.FLOOR_MEAN, "max": verify.FLOOR_MAX}}


def run(a: argparse.Namespace) -> dict[str, Any]:
    import engine_patch
    from engine_patch import moe, verify
    from engine_patch.adapters import AdapterError, module_names, prepare_adapter, read_config
    from engine_patch.env import versions
    from engine_patch.registration import AdapterRegistry

    work = Path(a.workdir or tempfile.mkdtemp(prefix="vidlora-moe-check-"))
    work.mkdir(parents=True, exist_ok=True)
    llm_kwargs = json.loads(a.llm_kwargs)
    dummy = llm_kwargs.get("load_format") == "dummy"
    res: dict[str, Any] = {"patches": engine_patch.apply(), "versions": versions(), "platform": moe.platform(),
                           "moe": moe.is_moe(a.model), "model": verify.shown(a.model), "dummy_weights": dummy}

    # 1. registration verdicts
    registry = AdapterRegistry(a.model, a.max_rank, work / "registered")
    res["registrations"] = []
    for src in a.adapter:
        reg = registry.register(src.name, src)
        res["registrations"].append({"name": reg.name, "ok": reg.ok, "reason": reg.reason})
        print(f"[moe] registration {reg.name}: " + ("ok" if reg.ok else f"refused: {reg.reason}"), flush=True)

    # 2. base output with and without enable_lora
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(a.model))
    lengths = [int(x) for x in a.lengths.split(",") if x.strip()]
    o = verify.Options(model=a.model, adapters=[], lengths=tuple(lengths), max_new_tokens=a.new_tokens,
                       llm_kwargs=llm_kwargs)
    if a.max_model_len:
        o.llm_kwargs = {"max_model_len": a.max_model_len, **o.llm_kwargs}
    prompts = [verify.make_prompt(tok, n, offset=i) for i, n in enumerate(lengths)]
    skipped = {"skipped": True, "error": "not run (--engines)"}
    off = _engine_outputs(a.model, o, False, prompts, a.new_tokens, None) if a.engines != "on" else skipped
    on = _engine_outputs(a.model, o, True, prompts, a.new_tokens, off.get("seqs")) if a.engines != "off" else skipped
    verdict = base_unchanged(off, on)
    res["lora_off"] = {k: v for k, v in off.items() if k not in ("seqs", "scores")}
    res["lora_on"] = {k: v for k, v in on.items() if k not in ("seqs", "scores")}
    res["base"] = verdict
    res["base_unchanged"] = verdict["ok"]
    print(f"[moe] no-adapter output, enable_lora off vs on: {json.dumps(verdict)}", flush=True)

    # 3. exactness of the attention/GDN adapters, as registration would serve them
    res["verify"] = {}
    res["exact_scopes"] = []
    if not a.base_only and not dummy and verdict["ok"]:
        prepared = []
        for src in a.adapter:
            if moe.expert_modules(read_config(src), module_names(src)):
                continue  # expert side: adapters.normalise places no expert module (moe.py says why)
            try:
                prepared.append(prepare_adapter(src, a.model, a.max_rank, work / "prepared").path)
            except AdapterError as exc:
                res["verify"][src.name] = {"ok": False, "error": str(exc)}
        if prepared:  # one verify run for all of them: mixed batches of different adapters too
            vo = verify.Options(model=a.model, adapters=prepared, lengths=tuple(lengths),
                                max_new_tokens=a.new_tokens, prepare=False, checks=tuple(a.checks.split(",")),
                                llm_kwargs=llm_kwargs, workdir=work / "verify")
            vres = verify.run(vo)
            vres["ok"] = not vres["failures"] and not vres["errors"]
            res["verify"]["attention"] = {k: vres.get(k) for k in ("ok", "failures", "errors", "inconclusive", "rows",
                                                                   "mixed", "long_short", "timing_s")}
            res["verify"]["attention"]["adapters"] = [p.name for p in prepared]
            print(verify.table(vres), flush=True)
            print(f"[moe] verify {[p.name for p in prepared]}: {'PASS' if vres['ok'] else 'FAIL'} "
                  f"{vres['failures'][:3]}", flush=True)
        if res["verify"] and all(v["ok"] for v in res["verify"].values()):
            res["exact_scopes"].append(moe.ATTENTION)
    ran_verify = bool(res["verify"])
    res["ok"] = bool(res["moe"] and verdict["ok"] and (a.base_only or dummy or
                                                       (ran_verify and all(v["ok"] for v in res["verify"].values()))))
    return res


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    ap = argparse.ArgumentParser(prog="python -m bench.gpu.moe_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--adapter", action="append", default=[], type=Path)
    ap.add_argument("--lengths", default="16,128,1024")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--max-rank", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--checks", default="a,b", help="engine_patch.verify checks for step 3")
    ap.add_argument("--llm-kwargs", default="{}")
    ap.add_argument("--base-only", action="store_true", help="steps 1 and 2 only")
    ap.add_argument("--engines", choices=["both", "on", "off"], default="both",
                    help="step 2 with both engines, or only the one with (on) / without (off) enable_lora")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    if not (a.model / "config.json").is_file():
        ap.error(f"--model {a.model}: no config.json")
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    t0 = time.time()
    res = run(a)
    res["wall_s"] = round(time.time() - t0, 1)
    res["command"] = "python -m bench.gpu.moe_check " + " ".join(sys.argv[1:] if argv is None else argv)
    if a.json:
        from engine_patch.verify import _jsonable

        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(_jsonable(res), indent=1))
    summary = {k: res.get(k) for k in ("ok", "moe", "platform", "base_unchanged", "base", "exact_scopes", "wall_s")}
    summary["registrations"] = res["registrations"]
    summary["lora_off"] = {k: res["lora_off"].get(k) for k in ("tokens", "error", "start_s")}
    summary["lora_on"] = {k: res["lora_on"].get(k) for k in ("tokens", "error", "start_s")}
    print("RESULT " + json.dumps(summary, default=lambda x: None if isinstance(x, float) and not math.isfinite(x) else str(x)))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
