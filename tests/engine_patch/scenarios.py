"""Failures 1-4 (and 5: stale GDN state blocks) as runnable scenarios; `python -m tests.engine_patch.scenarios` runs them
in a fresh process (the unpatched case must never see engine_patch)."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import traceback
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

P1 = "hello world, this is a test prompt"
P2 = "a different and somewhat longer prompt for the other request"


def make_llm(model: Path, max_loras: int = 2):
    from vllm import LLM

    return LLM(str(model / "base"), enable_lora=True, max_lora_rank=8, max_loras=max_loras,
               max_model_len=1024, limit_mm_per_prompt={"image": 0, "video": 0}, dtype="bfloat16",
               max_num_seqs=8, seed=0, enforce_eager=True, kv_cache_memory_bytes=1 << 28)


def _out(o) -> dict:
    c = o.outputs[0]
    lps = [next(iter(d.values())).logprob for d in (c.logprobs or [])]
    return {"tokens": list(c.token_ids), "finite": all(math.isfinite(x) for x in lps), "lps": lps}


def run(llm, adapters: dict[str, Path], names: list[str]) -> dict[str, dict]:
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    ids = {"A": 1, "B": 2, "zonly": 3, "boom": 4}
    R = {n: LoRARequest(n, ids[n], str(p)) for n, p in adapters.items()}
    sp = SamplingParams(temperature=0, max_tokens=6, logprobs=1)

    def gen(prompts, loras, params=sp):
        return [_out(o) for o in llm.generate(prompts, params, lora_request=loras, use_tqdm=False)]

    res: dict[str, dict] = {}
    for name in names:
        try:
            if name == "2":
                alone = gen([P1], [None])[0]
                mixed = gen([P1, P1, P2], [R["A"], R["B"], None])
                mixed_alone = gen([P2], [None])[0]
                res[name] = {"ok": mixed[2]["tokens"] == mixed_alone["tokens"]
                             and gen([P1, P1], [None, R["A"]])[0]["tokens"] == alone["tokens"]}
            elif name == "4":
                base_alone = gen([P1], [None])[0]
                a_alone = gen([P2], [R["A"]])[0]
                batch = gen([P1, P2, P1, P1], [None, R["A"], R["boom"], None])
                after = gen([P1, P2], [None, R["A"]])
                res[name] = {
                    "ok": batch[0]["finite"] and batch[3]["finite"]
                    and batch[0]["tokens"] == base_alone["tokens"] == batch[3]["tokens"]
                    and batch[1]["tokens"] == a_alone["tokens"] and batch[1]["finite"],
                    "boom_finite": batch[2]["finite"],
                    "bad_mates": sum(not b["finite"] for i, b in enumerate(batch) if i != 2),
                    "after_ok": all(a["finite"] for a in after),
                }
            elif name == "3":
                plp = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=1)
                outs = llm.generate([P1, P2, P1], plp, lora_request=[R["A"], R["B"], None], use_tqdm=False)
                alone = [llm.generate([p], plp, lora_request=r, use_tqdm=False)[0]
                         for p, r in ((P1, R["A"]), (P2, R["B"]), (P1, None))]

                def vals(o):
                    return [next(iter(d.values())).logprob for d in o.prompt_logprobs[1:]]

                diff = max(max(abs(x - y) for x, y in zip(vals(o), vals(a))) for o, a in zip(outs, alone))
                res[name] = {"ok": diff < 0.05, "max_abs_diff": diff}
            elif name == "1":
                z = gen([P1], [R["zonly"]])[0]
                base = gen([P1], [None])[0]
                change = max(abs(x - y) for x, y in zip(z["lps"], base["lps"]))
                res[name] = {"ok": z["finite"], "changes_output": z["tokens"] != base["tokens"] or change > 1e-3,
                             "max_logprob_change": change}
            elif name == "5":
                res[name] = _state_reuse(llm, gen)
        except Exception as exc:  # noqa: BLE001 - the failure itself is the result
            res[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:400],
                         "trace": traceback.format_exc()[-1500:]}
    return res


def _state_reuse(llm, gen) -> dict:
    """#56524: a new request is handed GDN state blocks a previous tenant left NaN. It must
    answer as on clean blocks; `zeroed` counts the blocks gdn_state_zero cleared for it
    (None without the patch). Poisons every state block: no case that needs clean ones may follow."""
    from engine_patch.patches import gdn_state_zero

    prompt = "a third prompt, for the state blocks a finished request leaves behind"
    ref = gen([prompt], [None])[0]
    llm.reset_prefix_cache()  # else the re-run resumes from its own cached state
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    for _, tensors in gdn_state_zero._mamba_groups(runner):
        for t in tensors:
            t[1:].fill_(float("nan"))  # block 0 is the null block
    counted: list[int] = []
    orig = gdn_state_zero.zero_state_blocks

    def counting(runner, scheduler_output):
        counted.append(orig(runner, scheduler_output))
        return counted[-1]

    gdn_state_zero.zero_state_blocks = counting
    try:
        out = gen([prompt], [None])[0]
    finally:
        gdn_state_zero.zero_state_blocks = orig
    return {"ok": out["finite"] and out["tokens"] == ref["tokens"],
            "zeroed": sum(counted) if counted else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--adapters", required=True, help="json {name: path}")
    ap.add_argument("--names", default="2,4,1")
    ap.add_argument("--patched", action="store_true")
    a = ap.parse_args(argv)
    if a.patched:
        import engine_patch

        engine_patch.apply()
    from tests.support.tiny import tiny_model

    adapters = {k: Path(v) for k, v in json.loads(a.adapters).items()}
    llm = make_llm(tiny_model())
    res = run(llm, adapters, a.names.split(","))
    print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
