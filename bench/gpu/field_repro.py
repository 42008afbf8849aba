"""The field failure's request sequence on one engine: does dynamic LoRA return `!!!!`, and
does it stay broken for later requests? (issue 18)

    python -m bench.gpu.field_repro --model DIR --adapter A [--adapter B] --frames DIR \
        --json out.json [--eager] [--patch on|off] [--llm-kwargs JSON]

What the field saw (Qwen3.5/3.6 + dynamic LoRA, vLLM >= 0.27 on Hopper): prompts past ~400
tokens and every video prompt answer only `!` (token id 0, what greedy sampling picks from
NaN logits) with status 200, and every later request is broken until a restart. So one
engine runs, in this order, each step one ``generate`` call:

1. ``short``: a short chat prompt, no adapter and with each adapter;
2. ``long``: a ~450-token chat prompt, no adapter and with the first adapter;
3. ``video``: a ~2,000-token video request (pre-sampled frames, the GPU worker's request
   builder ``vidlora.engine_io.build_input``, the real Qwen3.5 processor's pixel budget),
   no adapter and with the first adapter;
4. ``mixed``: long + video + short requests co-batched across adapters;
5. ``short_again`` and ``long_again``: steps 1 and 2 repeated, identical batches.

Every request is greedy, decodes ``--new-tokens`` tokens (``ignore_eos``) and returns its
chosen-token logprobs. Per request: are all logprobs finite, which fraction of tokens is `!`
(and id 0), how many distinct tokens. Per engine (``verdict``):
- ``field_failure``: a LoRA request with a non-finite logprob or mostly `!` where the same
  prompt without LoRA is healthy;
- ``state_carried``: step 5 differs from steps 1/2 (same batch, same engine, greedy: a
  stateless engine gives the same tokens, and logprobs within bf16 noise, ``SAME_TOL``);
- ``lora_inert``: every adapter request equals its no-adapter twin (the adapter did nothing).

``--patch on`` runs ``engine_patch.apply()`` first and registers the adapters through
``engine_patch.registration`` (the workers' one adapter path); ``--patch off`` is stock vLLM
(``VIDLORA_ENGINE_PATCH=off``). Programmatic dependent launch and dual-stream LoRA are
vLLM environment switches (``VLLM_LORA_ENABLE_DUAL_STREAM``, ``VLLM_LORA_DISABLE_PDL``) set by
the caller; the JSON records them, the versions and whether PDL was in effect.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SYSTEM = "You are an archaeologist cataloguing finds from excavation footage."
SHORT = "Name the object in the niche."
LONG_TOKENS = 450
# Two runs of the same batch on the same engine may differ by bf16 noise: the LoRA shrink
# accumulates split-K partial sums with atomics, so their order varies. On the H200 (vLLM
# 0.32, dual-stream LoRA) that moved chosen-token logprobs by up to 0.047 nats with every token
# equal; the field failure is NaN and `!`, orders of magnitude past this.
SAME_TOL = 0.1
ENV_KEYS = ("VLLM_LORA_ENABLE_DUAL_STREAM", "VLLM_LORA_DISABLE_PDL", "VLLM_USE_V2_MODEL_RUNNER",
            "VIDLORA_ENGINE_PATCH", "VIDLORA_HOPPER_EXPAND", "VLLM_ENABLE_V1_MULTIPROCESSING")


def long_prompt(tokenizer, tokens: int) -> str:
    """A natural-text user prompt of about `tokens` tokens (the verifier's corpus)."""
    from engine_patch.verify import CORPUS

    ids = tokenizer(CORPUS, add_special_tokens=False)["input_ids"]
    ids = (ids * (tokens // max(1, len(ids)) + 2))[:tokens]
    return "Describe this excavation record.\n" + tokenizer.decode(ids)


def requests(tokenizer, frames: Path | None, new_tokens: int) -> dict[str, Any]:
    """name -> AnalysisRequest without adapter (the adapter is attached per call)."""
    from vidlora.engine_io import AnalysisRequest

    def req(key: str, prompt: str, files: list[str] = (), ts: list[float] = ()) -> AnalysisRequest:
        return AnalysisRequest(request_key=key, prompt=prompt, system=SYSTEM, frames=list(files),
                               timestamps=list(ts), adapter_name=None, adapter_path=None,
                               max_tokens=new_tokens, temperature=0.0, top_p=1.0, seed=0)

    out = {"short": req("short", SHORT), "long": req("long", long_prompt(tokenizer, LONG_TOKENS))}
    if frames is not None:
        meta = json.loads((frames / "frames.json").read_text())
        out["video"] = req("video", "List every object visible in this footage and the time it first appears.",
                           [str(frames / f) for f in meta["files"]], meta["timestamps"])
    return out


def pdl_in_effect() -> bool | None:
    try:
        from vllm import envs
        from vllm.lora.ops.triton_ops.utils import supports_pdl

        return bool(supports_pdl() and envs.VLLM_LORA_ENABLE_DUAL_STREAM)
    except Exception:  # noqa: BLE001 - CPU builds have no Triton LoRA ops
        return None


def facts(o, bang: int) -> dict[str, Any]:
    from vidlora.engine_io import chosen_logprobs

    c = o.outputs[0]
    ids = list(c.token_ids)
    lps = chosen_logprobs(ids, c.logprobs)
    return {"prompt_tokens": len(o.prompt_token_ids), "tokens": ids, "logprobs": lps,
            "finite": bool(lps) and all(math.isfinite(x) for x in lps),
            "bang_fraction": round(sum(t == bang for t in ids) / max(1, len(ids)), 3),
            "id0_fraction": round(sum(t == 0 for t in ids) / max(1, len(ids)), 3),
            "distinct": len(set(ids))}


def same(a: dict, b: dict) -> bool:
    if a["tokens"] != b["tokens"]:
        return False
    return all((math.isnan(x) and math.isnan(y)) or abs(x - y) <= SAME_TOL
               for x, y in zip(a["logprobs"], b["logprobs"]))


def unhealthy(f: dict, dummy: bool = False) -> bool:
    # A dummy-weight model's greedy output is one repeated token, possibly `!`: there only
    # the cause of the field's `!` (NaN logits, so non-finite logprobs) is evidence.
    if not f["finite"]:
        return True
    return not dummy and (f["bang_fraction"] >= 0.5 or f["id0_fraction"] >= 0.5)


def run(a: argparse.Namespace) -> dict[str, Any]:
    os.environ["VIDLORA_ENGINE_PATCH"] = a.patch
    res: dict[str, Any] = {"label": a.label, "patch": a.patch, "eager": a.eager,
                           "env": {k: os.environ.get(k) for k in ENV_KEYS}, "steps": {}}
    import engine_patch
    from engine_patch.env import versions

    res["patches_applied"] = engine_patch.apply() if a.patch == "on" else []
    res["versions"] = versions()
    adapters = [Path(p) for p in a.adapter]
    names = [p.name for p in adapters]
    if a.patch == "on":  # the workers' adapter path: normalised, checked, content-addressed
        from engine_patch.registration import AdapterRegistry

        registry = AdapterRegistry(a.model, a.max_rank, a.work / "adapter-cache")
        regs = [registry.register(n, p) for n, p in zip(names, adapters)]
        refused = [f"{r.name}: {r.reason}" for r in regs if not r.ok]
        if refused:
            raise SystemExit(f"adapters refused by registration: {refused}")
        adapters = [Path(r.path) for r in regs]

    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    from vidlora.engine_io import build_input

    tok = AutoTokenizer.from_pretrained(str(a.model))
    bang = tok.convert_tokens_to_ids("!")
    res["bang_id"] = bang
    reqs = requests(tok, a.frames, a.new_tokens)
    kw: dict[str, Any] = dict(model=str(a.model), dtype="bfloat16", seed=0, enforce_eager=a.eager,
                              enable_lora=True, max_lora_rank=a.max_rank, max_loras=len(adapters),
                              max_num_seqs=8, max_model_len=a.max_model_len,
                              limit_mm_per_prompt={"image": 0, "video": 1 if a.frames else 0})
    if a.frames:  # the real Qwen3.5 video processor's pixel budget (the tiny model's is 32x smaller)
        kw["mm_processor_kwargs"] = {"size": {"longest_edge": a.video_pixels, "shortest_edge": 4096}}
    kw.update(json.loads(a.llm_kwargs))
    res["llm_kwargs"] = kw
    t0 = time.time()
    llm = LLM(**kw)
    res["engine_start_s"] = round(time.time() - t0, 1)
    res["pdl_in_effect"] = pdl_in_effect()
    loras = {n: LoRARequest(n, i + 1, str(p)) for i, (n, p) in enumerate(zip(names, adapters))}
    first = names[0]
    sp = SamplingParams(temperature=0.0, max_tokens=a.new_tokens, ignore_eos=True, logprobs=1,
                        detokenize=False)

    def step(name: str, batch: list[tuple[str, str | None]]) -> None:
        inputs = [build_input(tok, reqs[r]) for r, _ in batch]
        lr = [loras[ad] if ad else None for _, ad in batch]
        t = time.time()
        try:
            outs = llm.generate(inputs, sp, lora_request=lr, use_tqdm=False)
            res["steps"][name] = {"s": round(time.time() - t, 2), "requests": [
                {"prompt": r, "adapter": ad, **facts(o, bang)} for (r, ad), o in zip(batch, outs)]}
        except Exception as exc:  # noqa: BLE001 - a failed step is a finding, not the end
            res["steps"][name] = {"error": f"{type(exc).__name__}: {exc}"[:2000], "trace": traceback.format_exc()[-4000:]}
        shown = res["steps"][name]
        print(f"[field {a.label}] {name}: " + ("; ".join(
            f"{q['prompt']}/{q['adapter'] or 'base'} n={q['prompt_tokens']} finite={q['finite']} "
            f"bang={q['bang_fraction']} distinct={q['distinct']}" for q in shown.get("requests", []))
            or shown.get("error", "")), flush=True)

    short = [("short", None)] + [("short", n) for n in names]
    long = [("long", None), ("long", first)]
    step("short", short)
    step("long", long)
    if "video" in reqs:
        step("video", [("video", None), ("video", first)])
    mixed = [("long", first), ("short", names[-1]), ("short", None)]
    if "video" in reqs:
        mixed.insert(1, ("video", names[-1]))
    step("mixed", mixed)
    step("short_again", short)
    step("long_again", long)
    res["verdict"] = verdict(res["steps"], dummy=kw.get("load_format") == "dummy")
    res["total_s"] = round(time.time() - t0, 1)
    return res


def verdict(steps: dict[str, Any], dummy: bool = False) -> dict[str, Any]:
    errors = {k: v["error"] for k, v in steps.items() if "error" in v}
    rq = {k: v["requests"] for k, v in steps.items() if "requests" in v}
    bad = []
    for name, qs in rq.items():
        base = {q["prompt"]: q for q in qs if q["adapter"] is None}
        for q in qs:
            if q["adapter"] and unhealthy(q, dummy) and not (q["prompt"] in base and unhealthy(base[q["prompt"]], dummy)):
                bad.append(f"{name}:{q['prompt']}/{q['adapter']}")
    base_bad = [f"{n}:{q['prompt']}" for n, qs in rq.items() for q in qs
                if q["adapter"] is None and unhealthy(q, dummy)]
    carried = []
    for later, earlier in (("short_again", "short"), ("long_again", "long")):
        if later in rq and earlier in rq:
            carried += [f"{later}:{x['prompt']}/{x['adapter'] or 'base'}"
                        for x, y in zip(rq[later], rq[earlier]) if not same(x, y)]
    repeat = max((abs(x - y) for later, earlier in (("short_again", "short"), ("long_again", "long"))
                  if later in rq and earlier in rq for a, b in zip(rq[later], rq[earlier])
                  for x, y in zip(a["logprobs"], b["logprobs"]) if math.isfinite(x) and math.isfinite(y)), default=None)
    twins = [(q, b) for qs in rq.values() for q in qs if q["adapter"]
             for b in qs if b["adapter"] is None and b["prompt"] == q["prompt"]]
    # Inert means bit-identical to the no-adapter twin: a small adapter on dummy weights may
    # move logprobs by less than any tolerance, and that is still an effect.
    effect = max((abs(x - y) for q, b in twins for x, y in zip(q["logprobs"], b["logprobs"])
                  if math.isfinite(x) and math.isfinite(y)), default=None)
    inert = bool(twins) and all(q["tokens"] == b["tokens"] and q["logprobs"] == b["logprobs"] for q, b in twins)
    return {"field_failure": bool(bad), "failing_requests": bad, "base_unhealthy": base_bad,
            "state_carried": bool(carried), "carried_requests": carried, "repeat_max_logprob_diff": repeat,
            "lora_inert": inert,
            "lora_max_logprob_effect": effect,
            "errors": errors,
            "ok": not bad and not base_bad and not carried and not inert and not errors}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu.field_repro", description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--adapter", action="append", required=True)
    p.add_argument("--frames", type=Path, default=None, help="pre-sampled frames (engine_patch.verify.video --out)")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--label", default="field")
    p.add_argument("--patch", choices=["on", "off"], default="off")
    p.add_argument("--eager", action="store_true")
    p.add_argument("--video-pixels", type=int, default=25_165_824,
                   help="the video processor's total pixel budget (48 frames of 320x256: ~2,270 tokens)")
    p.add_argument("--max-rank", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--work", type=Path, default=Path("var/field-repro"))
    p.add_argument("--llm-kwargs", default="{}")
    a = p.parse_args(argv)
    a.json.parent.mkdir(parents=True, exist_ok=True)
    try:
        res = run(a)
    except BaseException as exc:  # noqa: BLE001 - record why the engine did not come up
        res = {"label": a.label, "patch": a.patch, "eager": a.eager, "fatal": f"{type(exc).__name__}: {exc}"[:2000],
               "trace": traceback.format_exc()[-4000:], "env": {k: os.environ.get(k) for k in ENV_KEYS}}
    a.json.write_text(json.dumps(res, indent=1) + "\n")
    v = res.get("verdict")
    print(f"[field {a.label}] " + (json.dumps({k: v[k] for k in ("ok", "field_failure", "state_carried", "lora_inert")})
                                   if v else f"FATAL {res.get('fatal')}"), flush=True)
    return 0 if v else 1


if __name__ == "__main__":
    raise SystemExit(main())
