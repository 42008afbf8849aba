"""The run: the adapters registered as the GPU worker registers them, then text mode's engines
one at a time (merged, no-LoRA, dynamic LoRA, the fp32 reference), each freed before the next,
and the report put together. ``begin``, ``finish`` and ``_safe`` serve video mode too."""
from __future__ import annotations

import gc
import logging
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .compare import evaluate
from .engines import _adapter_rank, close_llm, generate, llm_args, make_llm, score
from .options import MIXED_LEN, Options, make_prompt
from .reference import Reference, merge_adapter
from .report import shown

log = logging.getLogger("engine_patch.verify")


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
