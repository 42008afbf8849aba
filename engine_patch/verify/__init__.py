"""Verify multi-LoRA serving numerically: dynamic LoRA vs merged weights vs fp32 reference.

    python -m engine_patch.verify --model M --adapter A [--adapter B ...] [--merged M2 ...]
        [--lengths 16,127,128,129,450,2048] [--json out.json] [--no-patch] [--dtype bfloat16]
        [--max-new-tokens 16] [--llm-kwargs '{"gdn_prefill_backend": "triton"}'] [--checks a,b,c,d]
        [--video [PATH] [--video-frames 4] [--video-max-pixels 16384]]

Adapters go through engine_patch.registration.AdapterRegistry, the one adapter path the GPU
worker uses: every variant (dyn, the PEFT merge, the fp32 reference) loads the same
normalised directory, so what passes here is what the worker serves. A refused adapter is a
failure with the registry's reason. --raw-adapters / --no-patch hand every variant the
directories as given (upstream behaviour).

--video: check (a) on a chat-templated video request built by the worker's own code
(engine_patch.verify.video explains it).

Four checks, each on the real engine (exit status 1 if any fails):

(a) **accuracy** per adapter and prompt length: the prompt (natural text cut to exactly L
    tokens) gets a greedy continuation from the *merged* engine; that one token sequence
    is then teacher-forced (``prompt_logprobs=1``) through every variant:
      dyn    vLLM, ``enable_lora``, the adapter as a dynamic LoRA (engine_patch.apply()
             and the registered adapter unless --no-patch)
      merged vLLM on base weights with the adapter merged in by PEFT ``merge_and_unload``
             (fp32 merge, stored in the checkpoint's dtype and key layout) or --merged
      ref    transformers + PEFT, unmerged, in float32 (TF32 off) -- the oracle
             (merge and reference load the registered adapter too)
      base / base_ref   no LoRA at all, vLLM vs transformers fp32 (pure dtype noise)
    and compared position by position: mean and max |Δ logprob of the chosen token| and
    agreement of the argmax (greedy) token.
(b) **mixed batches**: requests for different adapters, with and without no-adapter
    requests, each give what the same request gives alone (greedy generation and a
    teacher-forced score).
(c) **long-then-short**: short prompts run on the fresh engine first; after long prompts
    (every adapter and base) the same short prompts must give the same result: no state
    (GDN recurrent state, conv state, prefix-cache blocks) survives a request.
(d) **no-adapter request, LoRA engine vs no-LoRA engine** (vLLM #49063): greedy continuations
    of the no-adapter prompts (every length) on an engine built without LoRA, then on the
    dynamic-LoRA engine, alone (rows ``nolora~lora``) and each co-batched with a request for
    every adapter on the same prompt (rows ``nolora~lora_cobatched``). Tokens must agree and
    logprobs stay within the base-noise tolerance; ``identical`` says whether they are bit
    for bit. This is the form of #49063 that one engine cannot see (enabling LoRA changes
    the no-adapter path even alone), which the GPU worker's start-up checks
    (engine_patch.startup_checks) therefore leave to this run.

Tolerance (the decision, recorded in the JSON under "tolerance")
-----------------------------------------------------------------
bf16 serving is never equal to an fp32 model: every matmul rounds, and greedy decoding
amplifies that, so "dynamic differs from merged by 0.1 and greedy tokens diverge" says
nothing by itself. Both bf16 variants are therefore measured against the same fp32
oracle, and the *merged* model's error is the yardstick: merging the adapter into bf16
weights is the most faithful bf16 rendering of the adapter there is, so its error is the
bf16 noise of this model at this length. The pure base noise (no LoRA at all, bf16 vs
fp32) is measured too, and the yardstick is the larger of the two:

    noise(L)   = max(merged~ref, base~base_ref)      (mean and max separately, at length L)
    tol_mean   = max(FLOOR_MEAN, K * noise_mean(L))   K = 3,  FLOOR_MEAN = 0.02 nats
    tol_max    = max(FLOOR_MAX,  K * noise_max(L))               FLOOR_MAX  = 0.25 nats
    (a) passes iff every dyn logprob is finite, dyn~ref mean <= tol_mean and max <= tol_max.

Why K = 3: the dynamic path rounds differently from the merged one (x@A then @B added
to the bf16 base output, vs one bf16 product with rounded W+BA), so its error is of the
same order but not identical; on the tiny CPU model and in the CPU run recorded in
bench/results/verify_cpu.md dyn~ref is 0.82-1.10x merged~ref (both ~0.02 nats mean,
0.07-0.12 max, equal to the no-LoRA bf16 noise) while the adapters move logprobs by
1.2-1.8 nats mean (dyn~base). Real defects are one to
two orders of magnitude above the noise: an adapter slot aliased to a base request, a
dropped module (#49354), an unscaled adapter or a NaN give errors of the size of the
adapter's own effect (dyn~base), typically 0.2-5 nats mean. K = 3 leaves room for
rounding differences while staying far below that. The floors only matter when the
noise is tiny (fp32 serving, a model whose logits barely move): they keep a
last-bit difference from failing a run; 0.02 nats mean (about 2% probability) and 0.25
nats at the single worst position are still well under any adapter's effect. When the
adapter's own effect (dyn~base) is not above tol_mean the check cannot tell "applied"
from "ignored": that row is flagged "inconclusive" (reported, not failed).
Sanity: merged~ref itself must be within max(FLOOR, K * base noise) -- otherwise the
merge or the reference is broken and the yardstick is void (a failure, "merged_sanity").
(b), (c) and (d) compare vLLM engines with each other; they use the same tol_mean/tol_max
(from the base noise at the nearest measured length, or the floors). Generated tokens
may part at a near tie only (the other run took the single run's runner-up, margin and that
token's logprob within tol_max): reported, not failed.

The issue's H200 observation (dyn vs merged mean |Δ| ~ 0.1 at every length, greedy
diverging early) is decided by the columns dyn~ref and merged~ref: if both are ~0.07,
0.1 between them is bf16 rounding; if dyn~ref is 0.1 while merged~ref is 0.01, it is a
defect of the dynamic LoRA path.

On the GPU (vLLM 0.26 CUDA): VLLM_USE_FLASHINFER_SAMPLER=0 and
--llm-kwargs '{"gdn_prefill_backend": "triton"}' (the carried build has no FlashInfer).
"""
from __future__ import annotations

# One module a concern; every name the package had before the split is still read from here.
from .compare import compare, compare_generation, evaluate, tolerance
from .engines import (_adapter_rank, _model_is_multimodal, _tokens_prompt, close_llm, generate, llm_args, make_llm,
                      score)
from .options import (ALLOWED_RANKS, CORPUS, DEFAULT_LENGTHS, FLOOR_MAX, FLOOR_MEAN, K, MIXED_LEN, Options,
                      VerifyError, make_prompt)
from .orchestrate import AdapterSet, _lora_requests, _safe, begin, finish, register_adapters, run
from .reference import Reference, _hf_class, merge_adapter
from .report import _f, _jsonable, shown, table

__all__ = [
    "ALLOWED_RANKS", "CORPUS", "DEFAULT_LENGTHS", "FLOOR_MAX", "FLOOR_MEAN", "K", "MIXED_LEN", "AdapterSet", "Options",
    "Reference", "VerifyError", "_adapter_rank", "_f", "_hf_class", "_jsonable", "_lora_requests",
    "_model_is_multimodal", "_safe", "_tokens_prompt", "begin", "close_llm", "compare", "compare_generation",
    "evaluate", "finish", "generate", "llm_args", "make_llm", "make_prompt", "merge_adapter", "register_adapters",
    "run", "score", "shown", "table", "tolerance",
]
