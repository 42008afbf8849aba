"""The vLLM side of a verification run: engine arguments, building and freeing an engine, and
the two measurements every check is made of (a teacher-forced score and a greedy generation)."""
from __future__ import annotations

import gc
import json
import logging
import time
from pathlib import Path
from typing import Any

from .options import ALLOWED_RANKS, MIXED_LEN, Options, VerifyError

log = logging.getLogger("engine_patch.verify")


def _model_is_multimodal(model: Path) -> bool:
    try:
        cfg = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return "vision_config" in cfg


def _adapter_rank(path: Path) -> int:
    cfg = json.loads((Path(path) / "adapter_config.json").read_text())
    ranks = [int(cfg.get("r", 8))] + [int(v) for v in (cfg.get("rank_pattern") or {}).values()]
    return max(ranks)


def llm_args(model: Path, o: Options, *, lora: bool, max_rank: int, max_loras: int,
             max_model_len: int | None = None, video: bool = False) -> dict[str, Any]:
    import torch

    kw: dict[str, Any] = dict(model=str(model), dtype=o.dtype, seed=0, enforce_eager=True,
                              max_model_len=max_model_len or max(*o.lengths, MIXED_LEN) + o.max_new_tokens + 8,
                              max_num_seqs=8)
    if _model_is_multimodal(model):
        # Text mode skips the vision encoder's profiling; video mode has the worker's limits.
        kw["limit_mm_per_prompt"] = {"image": 0, "video": 1 if video else 0}
    if not torch.cuda.is_available():
        kw["kv_cache_memory_bytes"] = 1 << 28  # the CPU backend otherwise takes a share of RAM
    if lora:
        kw.update(enable_lora=True, max_loras=max(1, max_loras),
                  max_lora_rank=next((r for r in ALLOWED_RANKS if r >= max_rank), max_rank))
    kw.update(o.llm_kwargs)
    if not lora:
        for key in ("enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras"):
            kw.pop(key, None)
    return kw


def make_llm(**kw):
    from vllm import LLM

    t = time.time()
    llm = LLM(**kw)
    log.info("engine up in %.1fs (%s)", time.time() - t, kw.get("model"))
    return llm


def close_llm(llm) -> None:
    """Free the engine (its child process, or its memory when in-process) before the next."""
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001 - best effort: some versions have no shutdown here
        pass
    del llm
    gc.collect()
    try:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    except Exception:  # noqa: BLE001
        pass
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001
        pass


def _tokens_prompt(ids: list[int]):
    from vllm.inputs import TokensPrompt

    return TokensPrompt(prompt_token_ids=list(ids))


def score(llm, seqs: list[list[int]], loras: list[Any], prompts: list[Any] | None = None) -> list[dict]:
    """Teacher-forced: chosen-token logprob and argmax id at positions 1..n-1 of each seq.

    `prompts`: the engine inputs when they are not the ids themselves (a video prompt whose
    placeholder vLLM expands); what vLLM actually ran must still be `seqs`, token for token."""
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1, detokenize=False)
    outs = llm.generate(prompts if prompts is not None else [_tokens_prompt(s) for s in seqs], sp,
                        lora_request=loras, use_tqdm=False)
    res = []
    for s, o in zip(seqs, outs):
        if list(o.prompt_token_ids) != list(s):
            raise VerifyError(f"vLLM scored {len(o.prompt_token_ids)} prompt tokens, not the {len(s)} of the "
                              "sequence it was given: the comparison would be of different sequences")
        lp, top = [], []
        for i, d in enumerate(o.prompt_logprobs[1:], start=1):
            lp.append(d[s[i]].logprob if s[i] in d else float("nan"))
            top.append(next((t for t, v in d.items() if v.rank == 1), -1))
        res.append({"lp": lp, "top": top})
    return res


def generate(llm, prompts: list[list[int]], loras: list[Any], n: int) -> list[dict]:
    """Greedy: tokens, chosen logprobs and the top-1/top-2 margin at each step."""
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=n, logprobs=2, detokenize=False)
    outs = llm.generate([_tokens_prompt(p) for p in prompts], sp, lora_request=loras, use_tqdm=False)
    res = []
    for o in outs:
        c = o.outputs[0]
        lp, margin, second, second_lp = [], [], [], []
        for t, d in zip(c.token_ids, c.logprobs or []):
            lp.append(d[t].logprob if t in d else float("nan"))
            ranked = sorted(d.items(), key=lambda kv: -kv[1].logprob)
            margin.append(ranked[0][1].logprob - ranked[1][1].logprob if len(ranked) > 1 else float("inf"))
            second.append(ranked[1][0] if len(ranked) > 1 else -1)
            second_lp.append(ranked[1][1].logprob if len(ranked) > 1 else float("nan"))
        res.append({"tokens": list(c.token_ids), "lp": lp, "margin": margin, "second": second, "second_lp": second_lp})
    return res
