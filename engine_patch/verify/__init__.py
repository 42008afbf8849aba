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

import gc
import json
import logging
import math
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..env import restore_transformers_configs

log = logging.getLogger("engine_patch.verify")

DEFAULT_LENGTHS = (16, 127, 128, 129, 450, 1024, 2048, 4096, 8192)
K = 3.0
FLOOR_MEAN = 0.02
FLOOR_MAX = 0.25
ALLOWED_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
MIXED_LEN = 129  # the longer prompt of the mixed-batch and long-then-short checks

# Plain prose: real models see natural text; a random model does not care.
CORPUS = (
    "The excavation of the burial chamber began in the spring, when the water table was low "
    "enough to reach the lower steps. The team recorded every object in place before lifting it: "
    "pottery sherds, bronze fittings, a lacquered box with traces of red and black paint, and "
    "the remains of a wooden coffin. The murals on the east wall show a procession of servants "
    "carrying food, wine and musical instruments toward a seated figure. An inscription above "
    "the doorway names the tomb's owner and the year of burial, though part of it has flaked "
    "away. Conservators stabilised the plaster with a thin adhesive before photographing each "
    "panel under raking light. Later, the structure of the vault was surveyed with a laser "
    "scanner, and the brick courses were counted to compare the construction with other tombs "
    "of the same period. Questions remain about the robbers' tunnel found in the north corner, "
    "which seems to have been dug within a generation of the burial. "
)


class VerifyError(RuntimeError):
    pass


@dataclass
class Options:
    model: Path
    adapters: list[Path]
    merged: list[Path] = field(default_factory=list)
    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    max_new_tokens: int = 16
    dtype: str = "bfloat16"
    ref_dtype: str = "float32"
    ref_device: str | None = None
    patch: bool = True
    prepare: bool = True
    checks: tuple[str, ...] = ("a", "b", "c", "d")
    llm_kwargs: dict[str, Any] = field(default_factory=dict)
    workdir: Path | None = None
    k: float = K
    floor_mean: float = FLOOR_MEAN
    floor_max: float = FLOOR_MAX
    video: bool = False
    video_path: Path | None = None   # None: a generated sample clip
    video_frames: int = 4
    video_max_pixels: int = 128 * 128


# -- prompts ------------------------------------------------------------------------------
def make_prompt(tokenizer, length: int, offset: int = 0) -> list[int]:
    """Natural-text token ids, exactly `length` long; `offset` shifts the start (distinct prompts)."""
    ids = tokenizer(CORPUS, add_special_tokens=False)["input_ids"]
    start = (offset * 37) % len(ids)
    reps = (start + length) // len(ids) + 2
    return (ids * reps)[start:start + length]


# -- comparison ---------------------------------------------------------------------------
def compare(a: dict, b: dict) -> dict:
    """a, b: {"lp": [chosen-token logprob per position], "top": [argmax id per position]}."""
    n = min(len(a["lp"]), len(b["lp"]))
    d = [abs(x - y) for x, y in zip(a["lp"][:n], b["lp"][:n])]
    finite = all(math.isfinite(x) for x in a["lp"][:n] + b["lp"][:n])
    agree = sum(x == y for x, y in zip(a["top"][:n], b["top"][:n])) / n if n else 1.0
    if not finite:
        return {"n": n, "mean": float("inf"), "max": float("inf"), "agree": agree, "finite": False}
    return {"n": n, "mean": sum(d) / n if n else 0.0, "max": max(d) if d else 0.0, "agree": agree, "finite": True}


def tolerance(noise_mean: float | None, noise_max: float | None, o: Options) -> tuple[float, float]:
    tm = o.floor_mean if noise_mean is None or not math.isfinite(noise_mean) else max(o.floor_mean, o.k * noise_mean)
    tx = o.floor_max if noise_max is None or not math.isfinite(noise_max) else max(o.floor_max, o.k * noise_max)
    return tm, tx


def compare_generation(single: dict, other: dict, tol_mean: float, tol_max: float) -> dict:
    """Greedy outputs of the same request; tokens may part only at a near tie."""
    st, ot = single["tokens"], other["tokens"]
    j = next((i for i, (x, y) in enumerate(zip(st, ot)) if x != y), None)
    if j is None and len(st) != len(ot):
        j = min(len(st), len(ot))
    upto = len(st) if j is None else j
    d = [abs(x - y) for x, y in zip(single["lp"][:upto], other["lp"][:upto])]
    finite = all(math.isfinite(x) for x in single["lp"] + other["lp"])
    mean = sum(d) / len(d) if d else 0.0
    mx = max(d) if d else 0.0
    # A genuine near tie: the other run took the single run's runner-up, the single run's
    # top-1/top-2 margin is within tol_max, and the other run scores that token as the single did.
    near_tie = (j is not None and j < len(single["margin"]) and j < len(ot) and single["margin"][j] <= tol_max
                and single.get("second", [None] * (j + 1))[j] == ot[j]
                and abs(other["lp"][j] - single.get("second_lp", [float("nan")] * (j + 1))[j]) <= tol_max)
    ok = finite and mean <= tol_mean and mx <= tol_max and (j is None or near_tie)
    return {"ok": ok, "diverge_at": j, "near_tie": near_tie, "mean": mean if finite else float("inf"),
            "max": mx if finite else float("inf"), "finite": finite, "n": len(st)}


# -- vLLM side ----------------------------------------------------------------------------
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


# -- merged weights and the fp32 reference -------------------------------------------------
def _hf_class(model: Path):
    import transformers

    restore_transformers_configs()
    if _model_is_multimodal(model):
        return transformers.AutoModelForImageTextToText
    return transformers.AutoModelForCausalLM


def merge_adapter(model: Path, adapter: Path, out: Path) -> Path:
    """PEFT merge_and_unload in fp32, written with the base checkpoint's keys, dtypes, shards
    and every non-weight file, so vLLM loads it exactly like the base."""
    import torch
    from peft import PeftModel
    from safetensors import safe_open
    from safetensors.torch import save_file

    model, adapter, out = Path(model), Path(adapter), Path(out)
    base = _hf_class(model).from_pretrained(str(model), dtype=torch.float32)
    peft = PeftModel.from_pretrained(base, str(adapter))
    targets = [n.removeprefix("base_model.model.") + ".weight"
               for n, m in peft.named_modules() if hasattr(m, "lora_A") and len(getattr(m, "lora_A", {})) > 0]
    merged = peft.merge_and_unload().state_dict()
    out.mkdir(parents=True, exist_ok=True)
    for f in model.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy2(f, out / f.name)
    written: set[str] = set()
    for shard in sorted(model.glob("*.safetensors")):
        tensors = {}
        with safe_open(str(shard), framework="pt") as sf:
            meta = sf.metadata()
            for k in sf.keys():
                orig = sf.get_tensor(k)
                if k in merged:
                    tensors[k] = merged[k].to(orig.dtype).contiguous()
                    written.add(k)
                else:
                    tensors[k] = orig
        save_file(tensors, str(out / shard.name), metadata=meta)
    missing = [t for t in targets if t not in written]
    if missing:
        raise VerifyError(f"merged weights {missing[:3]} have no key in {model}'s checkpoint "
                          "(model class renames keys); merge yourself and pass --merged")
    del base, peft, merged
    gc.collect()
    return out


class Reference:
    """transformers + PEFT (unmerged) in float32 on `device`: the oracle."""

    def __init__(self, model: Path, adapters: list[Path], device: str, dtype: str):
        import torch
        from peft import PeftModel

        torch.backends.cuda.matmul.allow_tf32 = False  # an fp32 oracle must really be fp32
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        self.device = device
        base = _hf_class(model).from_pretrained(str(model), dtype=getattr(torch, dtype)).to(device).eval()
        self.names = [f"a{i}" for i in range(len(adapters))]
        self.model = PeftModel.from_pretrained(base, str(adapters[0]), adapter_name=self.names[0])
        for name, path in zip(self.names[1:], adapters[1:]):
            self.model.load_adapter(str(path), adapter_name=name)
        self.model.eval()

    def score(self, seq: list[int], adapter_index: int | None, chunk: int = 2048,
              mm: dict[str, Any] | None = None) -> dict:
        """`mm`: extra model inputs sized for `seq` (pixel values, grids, mm_token_type_ids)."""
        import contextlib

        import torch

        inner = self.model.get_base_model()
        ctx = contextlib.nullcontext()
        if adapter_index is None:
            ctx = self.model.disable_adapter()
        else:
            self.model.set_adapter(self.names[adapter_index])
        ids = torch.tensor([seq], device=self.device)
        extra = {k: v.to(self.device) if hasattr(v, "to") else v for k, v in (mm or {}).items()}
        if "pixel_values_videos" in extra:  # the vision tower runs in the oracle's dtype too
            extra["pixel_values_videos"] = extra["pixel_values_videos"].to(next(inner.parameters()).dtype)
        with torch.no_grad(), ctx:
            hidden = inner.model(input_ids=ids, **extra).last_hidden_state[0]
            head = inner.get_output_embeddings()
            lp, top = [], []
            for s in range(0, len(seq) - 1, chunk):  # logits of a long prompt x a big vocab in pieces
                logits = head(hidden[s:min(s + chunk, len(seq) - 1)]).float().log_softmax(-1)
                nxt = ids[0, s + 1:s + 1 + logits.shape[0]]
                lp += logits.gather(1, nxt[:, None])[:, 0].tolist()
                top += logits.argmax(-1).tolist()
        return {"lp": lp, "top": top}


# -- the run --------------------------------------------------------------------------------
@dataclass
class AdapterSet:
    """The adapters a run verifies: those the registry accepted, as every variant loads them."""
    options: Options             # the run's options, narrowed to the accepted adapters
    paths: list[Path]            # what vLLM, the PEFT merge and the fp32 reference all load
    ranks: list[int]
    records: list[dict]          # every given adapter's verdict, for the report
    refused: list[tuple[str, str]] = field(default_factory=list)  # (name, reason)

    def refusal_rows(self) -> tuple[list[dict], list[str]]:
        rows = [{"adapter": n, "length": "-", "pair": "registration", "mean": None, "max": None, "agree": None,
                 "ok": False, "role": "check", "reason": r} for n, r in self.refused]
        return rows, [f"{n}: refused by the adapter registry: {r}" for n, r in self.refused]


def shown(path: Any, work: Path | None = None) -> str | None:
    """A path for the report: relative to the working directory (or marked as inside the work
    directory) when under it, so committed results carry no machine's layout."""
    if path is None:
        return None
    p = Path(path).resolve()
    for base, prefix in ((Path.cwd(), ""), (work, "<workdir>/")):
        if base is not None and p.is_relative_to(Path(base).resolve()):
            return prefix + p.relative_to(Path(base).resolve()).as_posix()
    return str(path)


def register_adapters(o: Options, work: Path) -> AdapterSet:
    """Every adapter through AdapterRegistry, as the GPU worker registers it (--raw-adapters,
    --no-patch: the directories as given, as upstream vLLM would get them)."""
    keep: list[int] = []
    paths: list[Path] = []
    ranks: list[int] = []
    records: list[dict] = []
    refused: list[tuple[str, str]] = []
    registry = None
    if o.prepare:
        from ..registration import AdapterRegistry

        registry = AdapterRegistry(o.model, 512, work / "prepared")
    for i, src in enumerate(o.adapters):
        name = Path(src).name
        if registry is None:
            keep.append(i)
            paths.append(Path(src))
            ranks.append(_adapter_rank(Path(src)))
            records.append({"name": name, "source": shown(src), "ok": True, "path": shown(src), "stage": "raw"})
            continue
        reg = registry.register(name, src)
        rec = reg.as_dict()
        rec.update(source=shown(reg.source), path=shown(reg.path, work))
        records.append(rec)
        if not reg.ok:
            refused.append((name, reg.reason or "refused"))
            continue
        keep.append(i)
        paths.append(Path(reg.path))
        ranks.append(int(reg.rank or _adapter_rank(Path(reg.path))))
    # --merged is positional over a prefix of the adapters, so filtering keeps it a prefix.
    narrowed = replace(o, adapters=[o.adapters[i] for i in keep],
                       merged=[o.merged[i] for i in keep if i < len(o.merged)])
    return AdapterSet(narrowed, paths, ranks, records, refused)


def _lora_requests(o: Options, ads: AdapterSet) -> tuple[list[Any], int]:
    from vllm.lora.request import LoRARequest

    reqs = [LoRARequest(f"{Path(src).name}#{i}", i + 1, str(path))
            for i, (src, path) in enumerate(zip(o.adapters, ads.paths))]
    return reqs, max(ads.ranks)


def begin(o: Options) -> tuple[list[str], Path, AdapterSet]:
    """Patches, the work directory and the registered adapters: the start of either mode."""
    if o.patch:
        import engine_patch

        patches = engine_patch.apply()
    else:
        patches = []
    work = Path(o.workdir or tempfile.mkdtemp(prefix="vidlora-verify-"))
    work.mkdir(parents=True, exist_ok=True)
    return patches, work, register_adapters(o, work)


def finish(o: Options, work: Path, out: dict, ads: AdapterSet) -> dict:
    rows, failures = ads.refusal_rows()
    out["rows"] = rows + out.get("rows", [])
    out["failures"] = failures + out.get("failures", [])
    for key in ("mixed", "long_short", "inconclusive"):
        out.setdefault(key, [])
    out["adapters"] = ads.records
    if "dense_lora" in out.get("patches", []):
        from engine_patch.patches.dense_lora import counts

        out["lora_paths"] = counts()  # both paths must have run for the checks to cover both
    if o.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    else:
        out["workdir"] = shown(work)
    return out


def _safe(results: dict, key: str, fn) -> Any:
    """Run one engine call; an exception is a failure, and the engine is not used after it
    (a step that raised leaves vLLM's in-process engine unusable: later calls can hang)."""
    if results.get("engine_dead"):
        results["skipped"].append(key)
        return None
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a crash of the engine is a verification failure
        results["errors"].append({"where": key, "error": f"{type(exc).__name__}: {exc}"[:600],
                                  "trace": traceback.format_exc()[-2000:]})
        results["engine_dead"] = key
        log.error("verify: %s failed: %s", key, exc)
        return None


def run(o: Options) -> dict:
    """Everything in one process: engines one at a time, freed in between."""
    import torch
    from transformers import AutoTokenizer

    patches, work, ads = begin(o)
    out: dict[str, Any] = {"patches": patches, "errors": [], "skipped": []}
    o = ads.options
    if not o.adapters:
        return finish(o, work, out, ads)
    tok = AutoTokenizer.from_pretrained(str(o.model))
    n_ad = len(o.adapters)
    lengths = sorted(set(o.lengths))
    prompts = {L: make_prompt(tok, L) for L in lengths}
    timing: dict[str, float] = {}

    # (a.1) merged engines: the greedy continuation and the merged scores.
    seqs: dict[int, dict[int, list[int]]] = {}
    merged_scores: dict[int, dict[int, dict]] = {}
    if "a" in o.checks:
        for i, adapter in enumerate(o.adapters):
            t = time.time()
            mpath = Path(o.merged[i]) if i < len(o.merged) else merge_adapter(o.model, ads.paths[i], work / f"merged-{i}")
            llm = make_llm(**llm_args(mpath, o, lora=False, max_rank=0, max_loras=0))
            gens = generate(llm, [prompts[L] for L in lengths], [None] * len(lengths), o.max_new_tokens)
            seqs[i] = {L: prompts[L] + g["tokens"] for L, g in zip(lengths, gens)}
            merged_scores[i] = dict(zip(lengths, score(llm, [seqs[i][L] for L in lengths], [None] * len(lengths))))
            close_llm(llm)
            timing[f"merged_{i}"] = time.time() - t

    # (d.1) the no-adapter prompts on an engine without LoRA: the reference for (d).
    nd_prompts = [prompts[L] for L in lengths]
    plain_gen = None
    if "d" in o.checks:
        t = time.time()
        llm = make_llm(**llm_args(o.model, o, lora=False, max_rank=0, max_loras=0))
        plain_gen = _safe(out, "d.no_lora_engine", lambda: generate(llm, nd_prompts, [None] * len(nd_prompts),
                                                                    o.max_new_tokens))
        close_llm(llm)
        out.pop("engine_dead", None)  # the next engine is a new one
        timing["no_lora"] = time.time() - t

    # (a.2, b, c, d.2) the dynamic-LoRA engine.
    t = time.time()
    loras, max_rank = _lora_requests(o, ads)
    llm = make_llm(**llm_args(o.model, o, lora=True, max_rank=max_rank, max_loras=n_ad))
    variants: list[Any] = [None] + loras
    short = [make_prompt(tok, 16, offset=3), make_prompt(tok, MIXED_LEN, offset=5), prompts[lengths[0]]]
    fresh = {}
    if "c" in o.checks:  # before anything else runs on this engine
        for vi, lr in enumerate(variants):
            fresh[vi] = _safe(out, f"c.fresh[{vi}]", lambda lr=lr: generate(llm, short, [lr] * len(short), o.max_new_tokens))
    no_lora_raw: dict[str, Any] = {}
    if plain_gen is not None:
        # The same batch as on the no-LoRA engine, then each prompt beside an adapter request.
        no_lora_raw["lora"] = _safe(out, "d.lora_engine", lambda: generate(llm, nd_prompts, [None] * len(nd_prompts),
                                                                           o.max_new_tokens))
        # Every adapter beside it: a no-adapter row that reads some slot's weights (the CPU ops'
        # weights[-1]) shows only when that slot is loaded.
        mixed_d = [x for p in nd_prompts for x in ((p, None), *((p, lr) for lr in loras))]
        g = _safe(out, "d.lora_engine_cobatched", lambda: generate(llm, [p for p, _ in mixed_d],
                                                                   [lr for _, lr in mixed_d], o.max_new_tokens))
        no_lora_raw["lora_cobatched"] = None if g is None else g[0::1 + n_ad]
        no_lora_raw["plain"] = plain_gen
    dyn_scores: dict[int, dict[int, dict]] = {}
    base_scores: dict[int, dict[int, dict]] = {}  # base on each adapter's sequences (the adapter's effect)
    if "a" in o.checks:
        for i, lr in enumerate(loras):
            r = _safe(out, f"a.dyn[{i}]", lambda i=i, lr=lr: score(llm, [seqs[i][L] for L in lengths], [lr] * len(lengths)))
            if r is not None:
                dyn_scores[i] = dict(zip(lengths, r))
        for i in range(n_ad):
            r = _safe(out, f"a.base[{i}]", lambda i=i: score(llm, [seqs[i][L] for L in lengths], [None] * len(lengths)))
            if r is not None:
                base_scores[i] = dict(zip(lengths, r))
    mixed_raw: dict[str, Any] = {}
    pm = [make_prompt(tok, MIXED_LEN, offset=1), make_prompt(tok, 16, offset=2)]
    batches = {
        "adapters_only": [(0, loras[0]), (1, loras[1 % n_ad]), (0, loras[2 % n_ad]), (1, loras[0])],
        "with_no_adapter": [(0, loras[0]), (1, None), (0, loras[1 % n_ad]), (0, None), (1, loras[2 % n_ad])],
    }
    if "b" in o.checks:
        singles: dict[tuple[int, int], dict] = {}
        for name, reqs in batches.items():
            for p, lr in reqs:
                key = (p, 0 if lr is None else lr.lora_int_id)
                if key not in singles:
                    g = _safe(out, f"b.single{key}", lambda p=p, lr=lr: generate(llm, [pm[p]], [lr], o.max_new_tokens))
                    if g is not None:
                        singles[key] = g[0]
        for name, reqs in batches.items():
            g = _safe(out, f"b.{name}.generate", lambda reqs=reqs: generate(llm, [pm[p] for p, _ in reqs], [lr for _, lr in reqs], o.max_new_tokens))
            mixed_raw[name] = {"reqs": reqs, "gen": g}
        mixed_raw["singles"] = singles
    long_short: list[dict] = []
    if "c" in o.checks:
        long_p = prompts[lengths[-1]]
        for vi, lr in enumerate(variants):
            for li, long_lr in enumerate(variants):
                if li not in (vi, (vi + 1) % len(variants)):
                    continue  # the same variant and its neighbour: covers lora->base, base->lora, lora->lora
                _safe(out, f"c.long[{li}]", lambda long_lr=long_lr: generate(llm, [long_p], [long_lr], 2))
                after = _safe(out, f"c.short[{vi}]", lambda lr=lr: generate(llm, short, [lr] * len(short), o.max_new_tokens))
                long_short.append({"variant": vi, "after_long_of": li, "after": after, "fresh": fresh.get(vi)})
    if "b" in o.checks:  # last: with several LoRAs, prompt_logprobs crashed the step in some versions
        for name, reqs in batches.items():
            singles = mixed_raw["singles"]
            tf_seqs = [pm[p] + singles.get((p, 0 if lr is None else lr.lora_int_id), {"tokens": []})["tokens"] for p, lr in reqs]
            alone = _safe(out, f"b.{name}.score_alone", lambda: [score(llm, [s], [lr])[0] for s, (_, lr) in zip(tf_seqs, reqs)])
            batch = _safe(out, f"b.{name}.score_batch", lambda: score(llm, tf_seqs, [lr for _, lr in reqs]))
            mixed_raw[name].update(tf_alone=alone, tf_batch=batch)
    close_llm(llm)
    out.pop("engine_dead", None)
    timing["dynamic"] = time.time() - t

    # (a.3) the fp32 reference.
    ref_scores: dict[int, dict[int, dict]] = {}
    base_ref: dict[int, dict] = {}
    if "a" in o.checks:
        t = time.time()
        device = o.ref_device or ("cuda" if torch.cuda.is_available() else "cpu")
        ref = Reference(o.model, ads.paths, device, o.ref_dtype)
        for i in range(n_ad):
            ref_scores[i] = {L: ref.score(seqs[i][L], i) for L in lengths}
        base_ref = {L: ref.score(seqs[0][L], None) for L in lengths}
        del ref
        gc.collect()
        timing["reference"] = time.time() - t

    out.update(evaluate(o, lengths, loras, merged_scores, dyn_scores, base_scores, ref_scores, base_ref,
                        mixed_raw, long_short, short, no_lora_raw))
    for r in out["rows"]:
        r["mode"] = "text"
    out["timing_s"] = {k: round(v, 1) for k, v in timing.items()}
    return finish(o, work, out, ads)


def evaluate(o, lengths, loras, merged_scores, dyn_scores, base_scores, ref_scores, base_ref,
             mixed_raw, long_short, short, no_lora_raw=None) -> dict:
    rows: list[dict] = []
    failures: list[str] = []
    noise: dict[int, tuple[float, float]] = {}
    for L in lengths:
        if 0 in base_scores and L in base_ref:
            c = compare(base_scores[0][L], base_ref[L])
            noise[L] = (c["mean"], c["max"])
            rows.append({"adapter": "-", "length": L, "pair": "base~base_ref", **c, "ok": c["finite"], "role": "noise"})
            if not c["finite"]:
                failures.append(f"base L={L}: non-finite logprobs without any adapter")

    def tol_at(L: int, extra: tuple[float, float] | None = None) -> tuple[float, float]:
        if not noise:
            return tolerance(None, None, o)
        near = min(noise, key=lambda x: abs(x - L))
        nm, nx = noise[near]
        if extra is not None:
            nm, nx = max(nm, extra[0]), max(nx, extra[1])
        return tolerance(nm, nx, o)

    for i, lr in enumerate(loras):
        name = Path(o.adapters[i]).name
        for L in lengths:
            if i not in ref_scores:
                continue
            ref = ref_scores[i][L]
            m = compare(merged_scores[i][L], ref)
            tm_base, tx_base = tol_at(L)
            m_ok = m["finite"] and m["mean"] <= tm_base and m["max"] <= tx_base
            rows.append({"adapter": name, "length": L, "pair": "merged~ref", **m, "tol_mean": tm_base,
                         "tol_max": tx_base, "ok": m_ok, "role": "merged_sanity"})
            if not m_ok:
                failures.append(f"{name} L={L}: merged~ref {m['mean']:.4f}/{m['max']:.4f} exceeds the base noise "
                                f"tolerance {tm_base:.4f}/{tx_base:.4f}: merge or reference broken")
            tm, tx = tol_at(L, (m["mean"], m["max"]))
            if i not in dyn_scores:
                failures.append(f"{name} L={L}: dynamic LoRA scoring failed (see errors)")
                rows.append({"adapter": name, "length": L, "pair": "dyn~ref", "ok": False, "role": "check",
                             "mean": None, "max": None, "agree": None, "error": True})
                continue
            d = compare(dyn_scores[i][L], ref)
            ok = d["finite"] and d["mean"] <= tm and d["max"] <= tx
            effect = compare(dyn_scores[i][L], base_scores[i][L]) if i in base_scores else None
            inconclusive = effect is not None and effect["mean"] <= tm
            rows.append({"adapter": name, "length": L, "pair": "dyn~ref", **d, "tol_mean": tm, "tol_max": tx,
                         "ok": ok, "role": "check", "inconclusive": inconclusive})
            rows.append({"adapter": name, "length": L, "pair": "dyn~merged", **compare(dyn_scores[i][L], merged_scores[i][L]),
                         "ok": True, "role": "info"})
            if effect is not None:
                rows.append({"adapter": name, "length": L, "pair": "dyn~base", **effect, "ok": True, "role": "effect"})
            if not ok:
                failures.append(f"{name} L={L}: dyn~ref mean {d['mean']:.4f} max {d['max']:.4f} > tol {tm:.4f}/{tx:.4f} "
                                f"(merged~ref {m['mean']:.4f}/{m['max']:.4f})")

    mixed: list[dict] = []
    singles = mixed_raw.get("singles", {})
    for name in ("adapters_only", "with_no_adapter"):
        if name not in mixed_raw:
            continue
        entry = mixed_raw[name]
        for j, (p, lr) in enumerate(entry["reqs"]):
            key = (p, 0 if lr is None else lr.lora_int_id)
            tm, tx = tol_at(16 if p == 1 else 129)
            rec: dict[str, Any] = {"batch": name, "index": j, "adapter": getattr(lr, "lora_name", None)}
            if entry.get("gen") is None or key not in singles:
                rec.update(ok=False, error="generation failed")
            else:
                rec["generate"] = compare_generation(singles[key], entry["gen"][j], tm, tx)
                rec["ok"] = rec["generate"]["ok"]
            if "tf_batch" in entry:
                if entry.get("tf_batch") is None or entry.get("tf_alone") is None:
                    rec["teacher_forced"] = {"ok": False, "error": "scoring failed"}
                else:
                    c = compare(entry["tf_alone"][j], entry["tf_batch"][j])
                    c["ok"] = c["finite"] and c["mean"] <= tm and c["max"] <= tx
                    rec["teacher_forced"] = c
                rec["ok"] = rec["ok"] and rec["teacher_forced"]["ok"]
            mixed.append(rec)
            if not rec["ok"]:
                g, tf = rec.get("generate") or {}, rec.get("teacher_forced") or {}
                why = []
                if not g.get("ok", False):
                    why.append(f"generate: diverges at token {g.get('diverge_at')}, max |dlogprob| {_f(g.get('max'))}"
                               if g else "generate failed")
                if tf and not tf.get("ok"):
                    why.append(tf.get("error") or f"teacher-forced max |dlogprob| {_f(tf.get('max'))}")
                failures.append(f"mixed batch {name}[{j}] ({rec['adapter'] or 'no adapter'}) differs from its single run: "
                                + "; ".join(why))

    ls_out: list[dict] = []
    for e in long_short:
        if e["after"] is None or e["fresh"] is None:
            ls_out.append({"variant": e["variant"], "after_long_of": e["after_long_of"], "ok": False, "error": "run failed"})
            failures.append(f"long-then-short variant {e['variant']}: run failed")
            continue
        per = []
        for k, (f, a) in enumerate(zip(e["fresh"], e["after"])):
            tm, tx = tol_at(len(short[k]))
            per.append(compare_generation(f, a, tm, tx))
        ok = all(x["ok"] for x in per)
        ls_out.append({"variant": e["variant"], "after_long_of": e["after_long_of"], "ok": ok, "prompts": per})
        if not ok:
            failures.append(f"long-then-short: variant {e['variant']} after a long prompt of variant "
                            f"{e['after_long_of']} differs from the fresh engine")
    no_lora_raw = no_lora_raw or {}
    for mode, pair in (("lora", "nolora~lora"), ("lora_cobatched", "nolora~lora_cobatched")):
        if "plain" not in no_lora_raw:
            break
        plain, got = no_lora_raw["plain"], no_lora_raw.get(mode)
        for k, L in enumerate(lengths):
            row: dict[str, Any] = {"adapter": "(none)", "length": L, "pair": pair, "role": "check", "agree": None}
            if plain is None or got is None:
                row.update(ok=False, mean=None, max=None, error=True)
                failures.append(f"no-adapter request L={L} ({pair}): a run failed (see errors)")
                rows.append(row)
                continue
            tm, tx = tol_at(L)
            g = compare_generation(plain[k], got[k], tm, tx)
            row.update(ok=g["ok"], mean=g["mean"], max=g["max"], n=g["n"], diverge_at=g["diverge_at"],
                       near_tie=g["near_tie"], tol_mean=tm, tol_max=tx,
                       identical=plain[k]["tokens"] == got[k]["tokens"] and plain[k]["lp"] == got[k]["lp"])
            rows.append(row)
            if not g["ok"]:
                failures.append(f"no-adapter request L={L}: the LoRA engine ({'co-batched with adapters' if mode != 'lora' else 'alone'}) "
                                f"differs from the engine without LoRA: diverges at token {g['diverge_at']}, "
                                f"max |dlogprob| {_f(g['max'])} (vLLM #49063)")
    return {"rows": rows, "mixed": mixed, "long_short": ls_out, "failures": failures,
            "inconclusive": [f"{r['adapter']} L={r['length']}" for r in rows if r.get("inconclusive")]}


# -- output ---------------------------------------------------------------------------------
def _f(x: Any, nd: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return "inf" if math.isinf(x) else f"{x:.{nd}f}"
    return str(x)


def table(res: dict) -> str:
    lines = ["| adapter | length | pair | mean abs dlogprob | max abs dlogprob | greedy agree | tol mean/max | result |",
             "|---|---|---|---|---|---|---|---|"]
    for r in res.get("rows", []):
        tol = f"{_f(r.get('tol_mean'))}/{_f(r.get('tol_max'))}" if r.get("tol_mean") is not None else ""
        verdict = {"check": "PASS" if r["ok"] else "FAIL", "merged_sanity": "ok" if r["ok"] else "FAIL"}.get(r["role"], r["role"])
        if r.get("inconclusive"):
            verdict += " (inconclusive)"
        if r.get("identical"):
            verdict += " (bit-identical)"
        agree = "-" if r.get("agree") is None else f"{100 * r['agree']:.1f}%"
        pair = r["pair"] if r.get("positions", "continuation") == "continuation" else f"{r['pair']} @{r['positions']}"
        lines.append(f"| {r['adapter']} | {r['length']} | {pair} | {_f(r.get('mean'))} | {_f(r.get('max'))} | "
                     f"{agree} | {tol} | {verdict} |")
    lines += ["", "| mixed batch | index | adapter | generate (diverge@, max) | teacher-forced max | result |", "|---|---|---|---|---|---|"]
    for m in res.get("mixed", []):
        g = m.get("generate") or {}
        tf = m.get("teacher_forced") or {}
        lines.append(f"| {m['batch']} | {m['index']} | {m['adapter'] or '(none)'} | {g.get('diverge_at', '-')}, {_f(g.get('max'))} | "
                     f"{_f(tf.get('max'))} | {'PASS' if m['ok'] else 'FAIL'} |")
    lines += ["", "| long-then-short: variant | after long of | max abs dlogprob | tokens equal | result |", "|---|---|---|---|---|"]
    for e in res.get("long_short", []):
        per = e.get("prompts") or []
        mx = max((p["max"] for p in per), default=None)
        eq = all(p["diverge_at"] is None for p in per) if per else None
        lines.append(f"| {e['variant']} | {e['after_long_of']} | {_f(mx)} | {eq} | {'PASS' if e['ok'] else 'FAIL'} |")
    return "\n".join(lines)


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x
