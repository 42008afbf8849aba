"""Fault injection on the tiny model: an adapter that yields non-finite values on long prompts.

    python -m bench.gpu.fault --tiny var/tiny-model --json out.json --patch off|on

The faulty adapter is one of the tiny model's adapters with its rank-0 direction in layer
0's GDN ``in_proj_z`` (the output gate: per token, no mixing between tokens) replaced:
``lora_A`` row 0 = beta * x_T/|x_T|, where x_t is the layer-0 input (the RMS-normed embedding)
of token t and beta makes the trigger's shrink sum 1.1 x the fp32 maximum; ``lora_B[j, 0] =
1e-37`` for one channel j (other entries of column 0 zero). Every weight is finite (A's row
is ~1e37: "finite but huge"). For the trigger token the fp32 accumulation in the LoRA shrink
overflows to inf, so z_j = inf and the gated norm, the residual and every later position of
that request turn non-finite; for every other token even the worst-case partial sum stays
under 0.82 x the fp32 maximum, so B * u changes z_j by O(10) and stays finite. Long prompts
(long transcripts) contain T; short ones never do. The damage appears only at run time.

Requests are vidlora ``AnalysisRequest``s (text prompts through the model's chat template).
Runs, on one engine: (1) reference: good requests (no adapter and three adapters; short and
long prompts) alone; (2) the same good requests co-batched with the faulty adapter on a long
prompt (and a short one); (3) the good requests again, later, on the same engine. Each good
request is compared with its reference (greedy tokens, chosen-token logprobs). Without
engine_patch the batch goes through a bare ``llm.generate`` on the same engine arguments
(stock vLLM); with it, through vidlora's ``EngineHost.generate`` (engine_patch.apply() and
the run-time guard ``engine_patch.guard.Guard``).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace as dc_replace
import math
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FP32_MAX = 3.4028e38
OVERFLOW_MARGIN = 1.1  # A's row makes the trigger's shrink sum 1.1 x the fp32 maximum
B_VALUE = 1e-37        # tiny: for every other token B*u stays O(10)
LAYER = 0
CHANNEL = 0
GOOD = ["artifact_identification", "murals_inscriptions", "tomb_structure"]
SOURCE = "tomb_structure"


def layer0_inputs(base: Path):
    """x_t = input_layernorm(embed(t)) of layer 0 for every token id (fp32 of bf16 weights)."""
    import torch
    from transformers import AutoModelForImageTextToText

    m = AutoModelForImageTextToText.from_pretrained(str(base), dtype=torch.float32)
    lm = m.model.language_model
    with torch.no_grad():
        e = lm.embed_tokens.weight.detach().clone()
        x = lm.layers[LAYER].input_layernorm(e)
    return x.to(torch.bfloat16).float()


def solve_direction(x, candidates: list[int]):
    """Pick T and a = x_T/|x_T| with the largest gap between the trigger's dot product and
    every other token's worst-case partial sum (sum_i |a_i x_t,i|), so the fp32 shrink
    accumulation overflows for T and for no other token, whatever the summation order."""
    import torch

    best = None
    for T in candidates:
        a = (x[T] / x[T].norm()).to(torch.bfloat16).float()
        others = torch.ones(x.shape[0], dtype=torch.bool)
        others[T] = False
        u_T = float(x[T] @ a)
        l1 = float((x[others].abs() @ a.abs()).max())
        if best is None or l1 / u_T < best[0]:
            best = (l1 / u_T, T, a, u_T, l1)
    ratio, T, a, u_T, l1 = best
    if ratio * OVERFLOW_MARGIN > 0.95:
        raise RuntimeError(f"no trigger token with a safe margin (best ratio {ratio:.3f})")
    return T, a, {"u_trigger": u_T, "others_l1_max": l1, "ratio": ratio}


def registration_token_ids(base: Path) -> set[int]:
    """Token ids of the prompts vidlora's adapter registration and canaries run: a runtime
    fault must not fire there, or registration (rightly) refuses the adapter up front."""
    from transformers import AutoTokenizer

    from engine_patch.probes import ADAPTER_PROMPTS, CANARY_PROMPT

    tok = AutoTokenizer.from_pretrained(str(base))
    return {t for p in (*ADAPTER_PROMPTS, CANARY_PROMPT)
            for t in tok(p, add_special_tokens=False)["input_ids"]}


def make_fault_adapter(tiny: Path, out: Path, source: str = SOURCE,
                       candidates: list[int] | None = None) -> dict[str, Any]:
    """The faulty adapter (module docstring) from ``tiny``'s adapter ``source``; its trigger
    token never occurs in the registration prompts, so the damage appears only at run time.
    ``candidates``: the token ids the trigger may be (default: ordinary BPE tokens)."""
    import torch
    from safetensors.torch import load_file, save_file

    src = tiny / "adapters" / source
    x = layer0_inputs(tiny / "base")
    # Candidates: ordinary BPE tokens (not specials), from the top of the merge list.
    avoid = registration_token_ids(tiny / "base")
    T, a, info = solve_direction(x, [t for t in (candidates or range(256, 448)) if t not in avoid])
    tensors = load_file(str(src / "adapter_model.safetensors"))
    key = f"base_model.model.model.language_model.layers.{LAYER}.linear_attn.in_proj_z"
    A, B = tensors[f"{key}.lora_A.weight"].clone(), tensors[f"{key}.lora_B.weight"].clone()
    beta = OVERFLOW_MARGIN * FP32_MAX / info["u_trigger"]
    A[0] = (a * beta).to(A.dtype)
    info["a_scale"] = beta
    B[:, 0] = 0
    B[CHANNEL, 0] = B_VALUE
    tensors[f"{key}.lora_A.weight"], tensors[f"{key}.lora_B.weight"] = A, B
    assert all(torch.isfinite(t).all() for t in tensors.values())
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    shutil.copy(src / "adapter_config.json", out / "adapter_config.json")
    info.update(trigger_token=T, source=source, module=key, b_value=B_VALUE)
    (out / "fault.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


# Words that never tokenise to the trigger; long prompts add the trigger's own text.
FILLER = ("the excavation of burial chamber began in spring when water table was low enough to "
          "reach lower steps team recorded every piece in place before lifting it pottery sherds "
          "bronze fittings lacquered box with traces red and black paint remains wooden coffin "
          "murals on east wall show procession servants carrying food wine musical instruments").split()


def prompt_text(tok, n_tokens: int, seed: int, trigger: int, with_trigger: bool) -> str:
    rnd = random.Random(seed)
    trig = tok.decode([trigger])
    words: list[str] = []
    while len(tok.encode(" ".join(words), add_special_tokens=False)) < n_tokens:
        words.extend(rnd.choice(FILLER) for _ in range(64))
        if with_trigger:  # long transcripts contain the trigger a few times, past the start
            words.append(f"{trig} {trig}")
    text = " ".join(words)
    ids = tok.encode(text, add_special_tokens=False)
    if (trigger in ids) != with_trigger:
        raise RuntimeError(f"prompt construction: trigger present={trigger in ids}, wanted {with_trigger}")
    return text


def run(args) -> dict[str, Any]:
    from vidlora.config import Settings

    tiny = Path(args.tiny)
    work = Path(args.work)
    res: dict[str, Any] = {"patch": args.patch, "started": time.time()}
    res["fault"] = make_fault_adapter(tiny, work / "fault_adapter")
    T = res["fault"]["trigger_token"]
    import workers.engine_host as eh
    from vidlora.engine_io import AnalysisRequest, build_input, sampling_params

    adapters = work / "adapters"  # the good adapters and the faulty one side by side
    adapters.mkdir(parents=True, exist_ok=True)
    for name in GOOD:
        if not (adapters / name).exists():
            shutil.copytree(tiny / "adapters" / name, adapters / name)
    if not (adapters / "FAULT").exists():
        shutil.copytree(work / "fault_adapter", adapters / "FAULT")
    settings = Settings(
        model=str(tiny / "base"), max_loras=4, max_cpu_loras=8, max_lora_rank=8,
        max_model_len=args.long + 512, max_num_seqs=16, gpu_memory_utilization=0.9,
        enforce_eager=True, served_model_name="", kv_cache_memory_bytes=args.kv_bytes,
        adapter_root=str(adapters), var_dir=str(work), adapter_cache_dir=str(work / "prepared"))
    extra = json.loads(args.llm_kwargs or "{}")

    class Host(eh.EngineHost):
        def engine_kwargs(self):
            kw = super().engine_kwargs()
            # Text-only: with video allowed, vLLM 0.26 hashes a dummy video at start-up and
            # needs blake3, which the carried build lacks (seen on the H200, 2026-11-30).
            kw["limit_mm_per_prompt"] = {"video": 0, "image": 0}
            kw.update(extra)
            return kw

    host = Host(settings)
    t0 = time.time()
    if args.patch == "on":
        host.start()  # engine_patch.apply() + engine + start canary; generate() is guarded
        tok = host.tokenizer
    else:
        from vllm import LLM

        llm = LLM(**host.engine_kwargs())  # the same engine, stock: no patch, no guard
        tok = llm.get_tokenizer()
        host.tokenizer = tok  # lora_request() only
    res["engine_start_s"] = round(time.time() - t0, 1)

    def req(key, ad, n, seed, trig):
        return AnalysisRequest(request_key=key, prompt=prompt_text(tok, n, seed, T, trig), system=None,
                               frames=[], timestamps=[], adapter_name=ad,
                               adapter_path=str(adapters / ad) if ad else None, max_tokens=args.new,
                               temperature=0.0, top_p=1.0, seed=None)

    good = []
    for i, ad in enumerate([None] + GOOD):
        good.append(req(f"{ad or 'base'}-short", ad, args.short, 10 * i + 1, False))
        good.append(req(f"{ad or 'base'}-long", ad, args.long, 10 * i + 2, True))
    bad = [req("FAULT-long", "FAULT", args.long, 77, True), req("FAULT-short", "FAULT", args.short, 78, False)]

    def submit(items):
        if args.patch == "on":
            outs = host.generate(items)
            return [{"tokens": o.token_ids, "lp": list(o.logprobs), "text": o.text[:60],
                     "finite": all(math.isfinite(v) for v in o.logprobs),
                     "status": "ok" if o.error is None else f"failed: {o.error}"[:200],
                     "health": {k: o.health.get(k) for k in ("ok", "reason", "isolated_rerun",
                                                             "recovery", "recovered_by", "runs")}}
                    for o in outs]
        from workers.engine_outputs import to_output  # the host's own output reading

        inputs = [build_input(tok, r) for r in items]
        params = [sampling_params(r) for r in items]
        loras = [host.lora_request(r.adapter_name, str(Path(r.adapter_path).resolve())) if r.adapter_name
                 else None for r in items]
        outs = llm.generate(inputs, params, lora_request=loras, use_tqdm=False)
        rows = []
        for r, o in zip(items, outs):
            a = to_output(r.request_key, o, 0.0)
            rows.append({"tokens": a.token_ids, "lp": list(a.logprobs), "text": a.text[:60],
                         "finite": all(math.isfinite(v) for v in a.logprobs), "status": "ok"})
        return rows

    ref = dict(zip([r.request_key for r in good], submit(good)))
    batch = good + bad
    random.Random(5).shuffle(batch)
    t1 = time.time()
    faulted = dict(zip([r.request_key for r in batch], submit(batch)))
    res["fault_batch_s"] = round(time.time() - t1, 2)
    # Control: the same batch, same order and shape, with the faulty adapter's requests on the
    # adapter it was derived from. Co-batched outputs equal to the control's mean no request
    # was changed by the fault; a difference from `ref` alone can be batch-shape numerics.
    control_batch = [dc_replace(r, adapter_name=SOURCE, adapter_path=str(adapters / SOURCE))
                     if r.adapter_name == "FAULT" else r for r in batch]
    control = dict(zip([r.request_key for r in batch], submit(control_batch)))
    # The control once more: how far two runs of one batch shape differ on this engine with no
    # fault at all (LoRA shrink's split-K atomics are not deterministic; bench/results/h200_field.md).
    control2 = dict(zip([r.request_key for r in batch], submit(control_batch)))
    later = dict(zip([r.request_key for r in good], submit(good)))
    later_short = submit([bad[1]])[0]

    def cmp(a, b):
        n = min(len(a["tokens"]), len(b["tokens"]))
        d = [abs(x - y) for x, y in zip(a["lp"][:n], b["lp"][:n])]
        # Up to and including the first differing token both runs had the same context: a
        # difference there is the step's own numerics; after it the texts simply diverge.
        first = next((i for i, (x, y) in enumerate(zip(a["tokens"], b["tokens"])) if x != y), n)
        pre = d[: first + 1]
        return {"tokens_equal": a["tokens"] == b["tokens"], "first_diff": None if first == n else first,
                "max_dlp": (max(d) if d and all(map(math.isfinite, d)) else None),
                "same_context_max_dlp": (max(pre) if pre and all(map(math.isfinite, pre)) else None),
                "finite": b["finite"], "status": b["status"]}

    keys = [r.request_key for r in good]
    res["bad"] = {r.request_key: {k: faulted[r.request_key].get(k) for k in ("finite", "status", "text", "health")}
                  for r in bad}
    res["bad"]["FAULT-long"]["first_tokens"] = faulted["FAULT-long"]["tokens"][:12]
    res["fault_short_later"] = {k: later_short.get(k) for k in ("finite", "status", "text")}
    res["cobatched"] = {k: cmp(ref[k], faulted[k]) for k in keys}
    res["cobatched_vs_control"] = {k: cmp(control[k], faulted[k]) for k in keys}
    res["control_vs_control"] = {k: cmp(control[k], control2[k]) for k in keys}
    res["later"] = {k: cmp(ref[k], later[k]) for k in keys}
    res["reference_finite"] = all(r["finite"] for r in ref.values())
    res["reference_status"] = {k: v["status"] for k, v in ref.items()}

    def damaged(rows):
        return sorted(k for k, v in rows.items()
                      if not v["finite"] or not v["tokens_equal"] or v["status"] != "ok")

    # Damage, as opposed to run-to-run numerics: not finite, not ok, or a logprob off by more than
    # NOISE_NATS while the context was still the same (a near tie that flips a greedy token and
    # lets the text diverge stays under it; a NaN or a leaked delta does not).
    # NOISE_NATS: verify's floor for the largest one-position difference of two bf16 renderings.
    from engine_patch.verify import FLOOR_MAX as NOISE_NATS

    def damaged_beyond_noise(rows):
        return sorted(k for k, v in rows.items()
                      if not v["finite"] or v["status"] != "ok" or v["same_context_max_dlp"] is None
                      or v["same_context_max_dlp"] > NOISE_NATS)

    fl = res["bad"]["FAULT-long"]
    res["summary"] = {
        "bad_long_returned_as": ("reported failed" if fl["status"] != "ok" else
                                 "text, non-finite logprobs" if not fl["finite"] else "text, finite"),
        "bad_long_text": fl["text"],
        "bad_short_ok": res["bad"]["FAULT-short"]["finite"] and res["bad"]["FAULT-short"]["status"] == "ok",
        "cobatched_damaged": damaged(res["cobatched"]),
        "cobatched_differs_from_control": damaged(res["cobatched_vs_control"]),
        "cobatched_damaged_beyond_noise": damaged_beyond_noise(res["cobatched_vs_control"]),
        "control_repeat_differs": damaged(res["control_vs_control"]),
        "later_damaged": damaged(res["later"]),
        "good_requests": len(good),
    }
    if args.patch == "on":
        res["guard_events"] = [{k: v for k, v in e.items() if k in ("event", "size", "bad", "reasons", "adapter",
                                                                    "adapters", "ok", "reason", "step")}
                               for e in host.guard.events]
        res["engine_patch_status"] = host.patch_status
    return res


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tiny", default=str(ROOT / "var" / "tiny-model"))
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "vl-fault"))
    p.add_argument("--json", required=True)
    p.add_argument("--patch", choices=["on", "off"], default="off")
    p.add_argument("--short", type=int, default=64)
    p.add_argument("--long", type=int, default=4096)
    p.add_argument("--new", type=int, default=10)  # < 12: the guard's loop check needs 12+
    p.add_argument("--kv-bytes", type=int, default=2 << 30)
    p.add_argument("--llm-kwargs", default="")
    p.add_argument("--make-only", action="store_true")
    args = p.parse_args()
    if args.make_only:
        print(json.dumps(make_fault_adapter(Path(args.tiny), Path(args.work) / "fault_adapter")))
        return 0
    try:
        res = run(args)
        rc = 0
    except Exception:  # noqa: BLE001
        res = {"error": traceback.format_exc()[-4000:]}
        rc = 2
    Path(args.json).write_text(json.dumps(res, indent=2, default=str) + "\n")
    print(json.dumps(res.get("summary", res.get("error")), default=str))
    return rc


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    raise SystemExit(main())
