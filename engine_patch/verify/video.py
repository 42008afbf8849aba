"""Video mode of engine_patch.verify: check (a) on the request users actually send.

    python -m engine_patch.verify --model M --adapter A [--adapter B ...] --video [PATH]
        [--video-frames 4] [--video-max-pixels 16384] [--max-new-tokens 8] [--json out.json]

Text mode feeds the language model plain token ids. A user's request is a chat-templated
prompt around a video: frames go through the vision tower and land among the text tokens
with per-frame timestamp text and M-RoPE positions, and the adapter must act on the text
positions of that sequence. Whatever breaks only there (placeholder expansion, positions
after the video, an adapter mapping thrown off by the multimodal tokens) is invisible to
text mode, so this mode builds the input with the project's own code:

- frames: ``vidlora.media.frames.sample_video`` under a uniform ``SamplingPolicy``
  (``--video-frames`` frames, ``--video-max-pixels``), as the CPU workers sample
  (tasks.prepare), from PATH or a clip made by ``vidlora.samples.generate_samples``;
- the request: ``vidlora.engine_io.AnalysisRequest`` + ``build_input`` with the engine's
  tokenizer, as the GPU worker builds it (real chat template, the video as a uint8 frame
  array with "already sampled" metadata on a 1000 Hz time base);
- adapters: ``AdapterRegistry``, like text mode; every variant loads ``Registration.path``.

The greedy continuation comes from the *merged* engine (worker-built input, ``ignore_eos``
so every run compares the same number of positions; the multimodal special tokens are
banned from it, since a generated video placeholder would be a second video when the
sequence is fed back). That sequence is then teacher-forced through dyn, merged and base
(vLLM) and ref and base_ref (transformers + PEFT, fp32).

The reference gets its inputs from the model's HF processor (``AutoProcessor``) with the
prompt string ``build_prompt`` renders, the same frame array and the same metadata dict
(``do_sample_frames=False``). Its input_ids must equal vLLM's ``prompt_token_ids`` token for
token before anything is compared: if the two processors expand the video differently
(timestamp text, tokens per frame) the logprobs would belong to different sequences and the
verdict would mean nothing, so that is a failure of its own and the run stops there.

vLLM is given the teacher-forced sequence as the tokenized prompt string (one video
placeholder) plus the continuation, with the same video: it expands a placeholder it finds
in token ids, so handing it the already expanded ids would expand them a second time. What
it ran is checked against prompt + continuation (``verify.score``).

Decided on the continuation positions with text mode's rules (``verify.evaluate``: k x bf16
noise with floors, merged~ref sanity, "inconclusive" when the adapter's effect is below
tolerance). The same pairs over every text position of prompt + continuation (targets that
are not video placeholders) are reported as information (``positions: "text"``): the prompt
tail after the video tests the vision path and M-RoPE, but the decision stays with what the
model generates.
"""
from __future__ import annotations

import gc
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable

from .compare import evaluate
from .engines import close_llm, llm_args, make_llm, score
from .options import Options, VerifyError
from .orchestrate import AdapterSet, _lora_requests, _safe, begin, finish
from .reference import Reference, merge_adapter
from .report import shown

log = logging.getLogger("engine_patch.verify")

SAMPLE = "tomb_corridor"  # vidlora.samples: a moving test pattern, 3 s, H.264
SYSTEM = "You are an archaeologist cataloguing finds from excavation footage."
PROMPT = "List every object visible in this footage and the time it first appears."
MM_SPECIAL = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


class InputMismatch(VerifyError):
    """The reference would see another token sequence than vLLM."""


def check_same_input(ref_ids: list[int], vllm_ids: list[int], decode: Callable[[list[int]], str] | None = None) -> None:
    if list(ref_ids) == list(vllm_ids):
        return
    k = next((i for i, (a, b) in enumerate(zip(ref_ids, vllm_ids)) if a != b), min(len(ref_ids), len(vllm_ids)))

    def around(ids: list[int]) -> str:
        part = list(ids[max(0, k - 6):k + 6])
        return f"{part}" + (f" {decode(part)!r}" if decode else "")

    raise InputMismatch(
        f"input mismatch: the reference's input_ids (transformers AutoProcessor, {len(ref_ids)} tokens) differ from "
        f"vLLM's prompt_token_ids ({len(vllm_ids)} tokens) at position {k}: vLLM {around(vllm_ids)} vs reference "
        f"{around(ref_ids)}. The two processors expand the video differently (timestamp text, tokens per frame, "
        "placeholders), so their logprobs would be of different sequences: nothing was compared.")


def sample_request(o: Options, work: Path) -> tuple[Any, dict]:
    """The worker's request for a video sampled by the CPU workers' code."""
    if o.video_path and Path(o.video_path).is_dir():  # no decoder needed for pre-sampled frames
        return presampled_request(o, Path(o.video_path))
    from vidlora.media.frames import sample_video
    from vidlora.media.sampling import SamplingPolicy
    from vidlora.samples import generate_samples
    from vidlora.engine_io import AnalysisRequest

    src = Path(o.video_path) if o.video_path else generate_samples(work / "samples", names=[SAMPLE])[0]
    policy = SamplingPolicy(mode="uniform", num_frames=o.video_frames, max_pixels=o.video_max_pixels,
                            min_pixels=min(SamplingPolicy.min_pixels, o.video_max_pixels))
    out_dir = work / "frames" / policy.key_hash()
    sampled = sample_video(src, policy, out_dir)
    req = AnalysisRequest(request_key="verify-video", prompt=PROMPT, system=SYSTEM,
                          frames=[str(p) for p in sampled.paths(out_dir.parent)], timestamps=list(sampled.timestamps),
                          adapter_name=None, adapter_path=None, max_tokens=o.max_new_tokens, temperature=0.0,
                          top_p=1.0, seed=0)
    info = {"source": shown(src) if o.video_path else f"generated sample {SAMPLE!r} (vidlora.samples)",
            "policy": policy.as_dict(), "frames": len(sampled.files), "timestamps": list(sampled.timestamps),
            "width": sampled.width, "height": sampled.height, "backend": sampled.backend}
    return req, info


def presampled_request(o: Options, folder: Path) -> tuple[Any, dict]:
    """Frames the sampling code wrote elsewhere (``python -m engine_patch.verify.video
    --sample VIDEO --out DIR``): for machines with no decoder, such as the lent GPU."""
    from vidlora.engine_io import AnalysisRequest

    meta = json.loads((folder / "frames.json").read_text())
    req = AnalysisRequest(request_key="verify-video", prompt=PROMPT, system=SYSTEM,
                          frames=[str(folder / f) for f in meta["files"]], timestamps=list(meta["timestamps"]),
                          adapter_name=None, adapter_path=None, max_tokens=o.max_new_tokens, temperature=0.0,
                          top_p=1.0, seed=0)
    return req, {**meta, "source": f"pre-sampled frames of {meta.get('source')}", "frames": len(meta["files"])}


def write_presampled(video: Path | None, out: Path, frames: int, max_pixels: int) -> Path:
    """Sample ``video`` (default: the generated sample clip) with the CPU workers' code into
    ``out`` with a frames.json, for `presampled_request` on another machine."""
    from vidlora.media.frames import sample_video
    from vidlora.media.sampling import SamplingPolicy
    from vidlora.samples import generate_samples

    out.mkdir(parents=True, exist_ok=True)
    src = Path(video) if video else generate_samples(out / "samples", names=[SAMPLE])[0]
    policy = SamplingPolicy(mode="uniform", num_frames=frames, max_pixels=max_pixels,
                            min_pixels=min(SamplingPolicy.min_pixels, max_pixels))
    sampled = sample_video(src, policy, out / "frames")
    files = [str(Path(p).relative_to(out)) for p in sampled.paths(out)]
    (out / "frames.json").write_text(json.dumps({
        "files": files, "timestamps": list(sampled.timestamps), "source": src.name, "policy": policy.as_dict(),
        "width": sampled.width, "height": sampled.height, "backend": sampled.backend}, indent=1))
    return out


def reference_inputs(model: Path, req: Any) -> tuple[str, Any]:
    """The HF processor's encoding of the request: build_prompt's string, build_video's frames and
    metadata (the dict vLLM gets; vLLM too drops do_sample_frames from it and passes it apart)."""
    from transformers import AutoProcessor
    from transformers.video_utils import VideoMetadata

    from vidlora.engine_io import build_prompt, build_video

    processor = AutoProcessor.from_pretrained(str(model))
    prompt = build_prompt(processor.tokenizer, req)
    frames, meta = build_video(req)
    vm = VideoMetadata(**{k: v for k, v in meta.items() if k != "do_sample_frames"})
    enc = processor(text=[prompt], videos=[frames], video_metadata=[vm],
                    do_sample_frames=meta["do_sample_frames"], return_tensors="pt")
    return prompt, enc


def mm_inputs(enc: Any, n: int) -> dict[str, Any]:
    """The processor's model inputs for prompt + continuation (n tokens): per-token tensors are
    extended over the continuation (attention 1, token type 0 = text)."""
    import torch

    p = enc["input_ids"].shape[-1]
    out: dict[str, Any] = {}
    for k, v in enc.items():
        if k == "input_ids":
            continue
        if isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape == (1, p):
            fill = torch.ones if k == "attention_mask" else torch.zeros
            v = torch.cat([v, fill((1, n - p), dtype=v.dtype)], dim=1)
        out[k] = v
    return out


def _special_ids(model: Path) -> dict[str, int]:
    cfg = json.loads((Path(model) / "config.json").read_text())
    return {k: int(cfg[k]) for k in MM_SPECIAL if isinstance(cfg.get(k), int)}


def greedy(llm, engine_input: dict, n: int, banned: list[int]) -> tuple[list[int], list[int]]:
    """(prompt_token_ids vLLM made of the input, greedy continuation of n tokens)."""
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, detokenize=False,
                        logit_bias={t: -100.0 for t in banned} or None)
    [o] = llm.generate([engine_input], sp, use_tqdm=False)
    return list(o.prompt_token_ids), list(o.outputs[0].token_ids)


def _cut(d: dict, idx: list[int]) -> dict:
    return {"lp": [d["lp"][j] for j in idx], "top": [d["top"][j] for j in idx]}


def run_video(o: Options) -> dict:
    patches, work, ads = begin(o)
    out: dict[str, Any] = {"patches": patches, "errors": [], "skipped": [], "mode": "video"}
    o = ads.options
    if not o.adapters:
        return finish(o, work, out, ads)
    try:
        _run(o, ads, work, out)
    except VerifyError as exc:  # an input mismatch, or vLLM running another sequence than given
        log.error("verify --video: %s", exc)
        out["failures"] = out.get("failures", []) + [str(exc)]
    return finish(o, work, out, ads)


def _run(o: Options, ads: AdapterSet, work: Path, out: dict) -> None:
    import torch

    from vidlora.engine_io import build_input

    timing: dict[str, float] = {}
    out["timing_s"] = timing
    t = time.time()
    req, info = sample_request(o, work)
    ref_prompt, enc = reference_inputs(o.model, req)
    ref_ids = enc["input_ids"][0].tolist()
    special = _special_ids(o.model)
    video_token = special.get("video_token_id")
    info.update(prompt_tokens=len(ref_ids), video_tokens=ref_ids.count(video_token) if video_token is not None else None)
    out["video"] = info
    timing["sampling"] = time.time() - t
    # Room for the prompt twice over, so a vLLM expansion longer than the reference's still
    # reaches the input check instead of being refused as too long.
    max_len = max(1024, 2 * len(ref_ids) + o.max_new_tokens + 8)
    n_ad = len(o.adapters)

    # (a.1) merged engines: the worker's input, its greedy continuation, the merged scores.
    seqs: dict[int, list[int]] = {}
    feeds: dict[int, Any] = {}
    merged_scores: dict[int, dict] = {}
    engine_input: dict | None = None
    placeholder_ids: list[int] = []
    for i, adapter in enumerate(o.adapters):
        t = time.time()
        mpath = Path(o.merged[i]) if i < len(o.merged) else merge_adapter(o.model, ads.paths[i], work / f"merged-{i}")
        llm = make_llm(**llm_args(mpath, o, lora=False, max_rank=0, max_loras=0, max_model_len=max_len, video=True))
        try:
            tok = llm.get_tokenizer()
            if engine_input is None:
                engine_input = build_input(tok, req)
                if engine_input["prompt"] != ref_prompt:
                    raise InputMismatch("input mismatch: build_prompt renders another prompt string with vLLM's "
                                        "tokenizer than with the HF processor's: "
                                        f"{engine_input['prompt']!r} vs {ref_prompt!r}")
                placeholder_ids = list(tok(engine_input["prompt"], add_special_tokens=False)["input_ids"])
                info["prompt"] = engine_input["prompt"]
            prompt_ids, cont = greedy(llm, engine_input, o.max_new_tokens, list(special.values()))
            check_same_input(ref_ids, prompt_ids, tok.decode)
            seqs[i] = prompt_ids + cont
            feeds[i] = _feed(placeholder_ids + cont, engine_input)
            merged_scores[i] = score(llm, [seqs[i]], [None], prompts=[feeds[i]])[0]
        finally:
            close_llm(llm)
        timing[f"merged_{i}"] = time.time() - t
    out["video"]["continuation"] = {Path(a).name: seqs[i][len(ref_ids):] for i, a in enumerate(o.adapters)}

    # (a.2) the dynamic-LoRA engine, with the worker's multimodal limits.
    t = time.time()
    loras, max_rank = _lora_requests(o, ads)
    llm = make_llm(**llm_args(o.model, o, lora=True, max_rank=max_rank, max_loras=n_ad, max_model_len=max_len,
                              video=True))
    dyn_scores: dict[int, dict] = {}
    base_scores: dict[int, dict] = {}
    try:
        for i, lr in enumerate(loras):
            r = _safe(out, f"a.dyn[{i}]", lambda i=i, lr=lr: score(llm, [seqs[i]], [lr], prompts=[feeds[i]]))
            if r is not None:
                dyn_scores[i] = r[0]
        for i in range(n_ad):
            r = _safe(out, f"a.base[{i}]", lambda i=i: score(llm, [seqs[i]], [None], prompts=[feeds[i]]))
            if r is not None:
                base_scores[i] = r[0]
    finally:
        close_llm(llm)
    out.pop("engine_dead", None)
    timing["dynamic"] = time.time() - t

    # (a.3) the fp32 reference on the processor's inputs (checked equal to vLLM's above).
    t = time.time()
    device = o.ref_device or ("cuda" if torch.cuda.is_available() else "cpu")
    ref = Reference(o.model, ads.paths, device, o.ref_dtype)
    ref_scores = {i: ref.score(seqs[i], i, mm=mm_inputs(enc, len(seqs[i]))) for i in range(n_ad)}
    base_ref = ref.score(seqs[0], None, mm=mm_inputs(enc, len(seqs[0])))
    del ref
    gc.collect()
    timing["reference"] = time.time() - t

    L = len(ref_ids)

    def positions(kind: str) -> Callable[[int], list[int]]:
        def idx(i: int) -> list[int]:  # score index j is the prediction of token j + 1
            s = seqs[i]
            if kind == "continuation":
                return list(range(L - 1, len(s) - 1))
            return [j for j in range(len(s) - 1) if s[j + 1] != video_token]
        return idx

    results = {}
    for kind in ("continuation", "text"):
        idx = positions(kind)
        results[kind] = evaluate(
            o, [L], loras,
            {i: {L: _cut(merged_scores[i], idx(i))} for i in merged_scores},
            {i: {L: _cut(dyn_scores[i], idx(i))} for i in dyn_scores},
            {i: {L: _cut(base_scores[i], idx(i))} for i in base_scores},
            {i: {L: _cut(ref_scores[i], idx(i))} for i in ref_scores},
            {L: _cut(base_ref, idx(0))}, {}, [], [])
    rows = []
    for r in results["continuation"]["rows"]:
        rows.append({**r, "mode": "video", "positions": "continuation", "frames": info["frames"]})
    for r in results["text"]["rows"]:
        # Information only: the decision is on what the model generates.
        r = {**r, "mode": "video", "positions": "text", "frames": info["frames"]}
        if r["role"] in ("check", "merged_sanity"):
            r["role"] = "info"
        r.pop("inconclusive", None)
        rows.append(r)
    out["rows"] = rows
    out["failures"] = results["continuation"]["failures"]
    out["inconclusive"] = results["continuation"]["inconclusive"]
    out["timing_s"] = {k: round(v, 1) for k, v in timing.items()}


def _feed(ids: list[int], engine_input: dict):
    from vllm.inputs import TokensPrompt

    return TokensPrompt(prompt_token_ids=list(ids), multi_modal_data=engine_input["multi_modal_data"])


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m engine_patch.verify.video",
                                 description="write pre-sampled frames for verify --video DIR")
    ap.add_argument("--sample", type=Path, default=None, help="video file (default: the generated sample)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--max-pixels", type=int, default=128 * 128)
    a = ap.parse_args()
    print(write_presampled(a.sample, a.out, a.frames, a.max_pixels))
