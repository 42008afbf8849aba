"""Turn an analysis request (scenario prompt + sampled JPEG frames) into a vLLM input.

Kept free of engine state so it can be unit-tested without vLLM running, and so the
prompt a request produced can be rebuilt later for review or for engine_patch's verifier.

Frames arrive pre-sampled by vidlora's CPU workers at known timestamps (variable-frame-rate
video, scene-based sampling...), so the video goes to vLLM as a uint8 (T, H, W, 3) array
with metadata that says "already sampled" and encodes those timestamps exactly.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# Qwen3-VL / Qwen3.5 compute each frame group's "<t seconds>" prompt text as
# frames_indices[i] / fps. Our timestamps are real seconds, not a regular grid, so we
# declare a millisecond time base: fps = 1000 and index = round(t * 1000). The rendered
# timestamps are then the true ones (to 1 ms), whatever the spacing. Frames are never
# resampled (do_sample_frames=False), so fps is used for nothing else.
TIMEBASE_HZ = 1000.0

# Qwen3.5's template opens a <think> block unless told otherwise; analyses want the answer
# itself (and templates that do not know the flag ignore it).
DEFAULT_CHAT_TEMPLATE_KWARGS: dict[str, Any] = {"enable_thinking": False}


@dataclass(frozen=True)
class AnalysisRequest:
    request_key: str
    prompt: str  # the scenario's user prompt text
    system: str | None
    frames: list[str]  # JPEG paths, in time order
    timestamps: list[float]  # seconds, one per frame
    adapter_name: str | None
    adapter_path: str | None
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    repetition_penalty: float = 1.0
    # The scenario's JSON Schema, enforced during generation (vLLM structured outputs); None:
    # free text. Each request carries its own, so one engine batch mixes schemas freely.
    output_schema: dict[str, Any] | None = None


@dataclass(frozen=True)
class AnalysisOutput:
    request_key: str
    text: str
    token_ids: list[int]
    prompt_tokens: int
    output_tokens: int
    latency_s: float
    finish_reason: str
    cumulative_logprob: float | None
    logprobs: list[float] = field(default_factory=list)  # chosen-token logprobs
    error: str | None = None
    # vidlora.result_health.ResultHealth.as_dict(): the guard's verdict, as stored and shown.
    health: dict[str, Any] = field(default_factory=dict)
    structured: bool = False  # generated under a JSON Schema (its repetition is the schema's)
    # vidlora.results.confidence.AnswerConfidence.as_dict() of a structured answer; None: unknown.
    confidence: dict[str, Any] | None = None

    @classmethod
    def failed(cls, request_key: str, error: str, latency_s: float = 0.0,
               finish_reason: str = "error") -> "AnalysisOutput":
        return cls(request_key=request_key, text="", token_ids=[], prompt_tokens=0,
                   output_tokens=0, latency_s=latency_s, finish_reason=finish_reason,
                   cumulative_logprob=None, logprobs=[], error=error)


class RequestError(ValueError):
    """A request that cannot be turned into engine input (its own fault, not the engine's)."""


# -- prompt ---------------------------------------------------------------------------------


def build_messages(req: AnalysisRequest) -> list[dict[str, Any]]:
    """Chat messages: optional system turn, then one user turn with the video before the text."""
    messages: list[dict[str, Any]] = []
    if req.system:
        messages.append({"role": "system", "content": req.system})
    content: list[dict[str, Any]] = []
    if req.frames:
        content.append({"type": "video"})
    content.append({"type": "text", "text": req.prompt})
    messages.append({"role": "user", "content": content})
    return messages


def build_prompt(tokenizer: Any, req: AnalysisRequest,
                 chat_template_kwargs: dict[str, Any] | None = None) -> str:
    """Render the model's own chat template to a prompt string (video as one placeholder;
    vLLM's processor expands it to per-frame timestamps and pad tokens)."""
    kwargs = dict(DEFAULT_CHAT_TEMPLATE_KWARGS if chat_template_kwargs is None
                  else chat_template_kwargs)
    prompt = tokenizer.apply_chat_template(
        build_messages(req), tokenize=False, add_generation_prompt=True, **kwargs
    )
    if not isinstance(prompt, str):  # some tokenizer wrappers return a list of one
        prompt = prompt[0]
    return prompt


# -- video ----------------------------------------------------------------------------------


def load_frames(paths: list[str]) -> np.ndarray:
    """Load JPEG frames as one uint8 (T, H, W, 3) array.

    Frames of one sampling policy normally share a size; if one does not (a resolution
    change mid-stream), it is resized to the first frame's size rather than failing.
    """
    from PIL import Image

    arrays: list[np.ndarray] = []
    size: tuple[int, int] | None = None
    for p in paths:
        try:
            with Image.open(p) as im:
                im = im.convert("RGB")
                if size is None:
                    size = im.size
                elif im.size != size:
                    im = im.resize(size, Image.Resampling.BILINEAR)
                arrays.append(np.asarray(im, dtype=np.uint8))
        except (OSError, ValueError) as exc:
            raise RequestError(f"cannot read frame {p}: {exc}") from exc
    return np.stack(arrays)


def video_metadata(timestamps: list[float]) -> dict[str, Any]:
    """Metadata for pre-sampled frames at ``timestamps`` (seconds), in vLLM's dict form."""
    ts = [float(t) for t in timestamps]
    gaps = [b - a for a, b in zip(ts, ts[1:]) if b > a]
    # The clip covers the last frame's display period too; one typical gap approximates it.
    duration = ts[-1] + (statistics.median(gaps) if gaps else 0.0)
    indices = [int(round(t * TIMEBASE_HZ)) for t in ts]
    return {
        "fps": TIMEBASE_HZ,
        "duration": duration,
        "total_num_frames": max(int(round(duration * TIMEBASE_HZ)), indices[-1] + 1),
        "frames_indices": indices,
        "video_backend": "opencv",
        "do_sample_frames": False,
    }


def build_video(req: AnalysisRequest) -> tuple[np.ndarray, dict[str, Any]]:
    frames, ts = list(req.frames), [float(t) for t in req.timestamps]
    if len(frames) != len(ts):
        raise RequestError(f"{len(frames)} frames but {len(ts)} timestamps")
    if any(not np.isfinite(t) or t < 0 for t in ts):
        raise RequestError("timestamps must be finite and >= 0")
    if any(b < a for a, b in zip(ts, ts[1:])):
        raise RequestError("timestamps must be in time order")
    for p in frames:
        if not Path(p).is_file():
            raise RequestError(f"frame not found: {p}")
    array = load_frames(frames)
    if len(array) == 1:
        # The vision tower patches 2 frames at a time and the processor refuses fewer;
        # a still image becomes a 2-frame clip of itself.
        array = np.concatenate([array, array])
        ts = ts * 2
    return array, video_metadata(ts)


# -- everything vLLM needs ------------------------------------------------------------------


def sampling_params(req: AnalysisRequest):
    from vllm import SamplingParams

    try:  # vLLM's validation error is not a ValueError in 0.32
        from vllm.exceptions import VLLMClientError as _Invalid
    except ImportError:
        _Invalid = ValueError
    if req.max_tokens <= 0:
        raise RequestError("max_tokens must be positive")
    structured = None
    if req.output_schema is not None:
        from vllm.sampling_params import StructuredOutputsParams

        structured = StructuredOutputsParams(json=req.output_schema)
    try:
        return SamplingParams(
            max_tokens=req.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            repetition_penalty=req.repetition_penalty,
            logprobs=1,  # the chosen token's logprob always comes back; the guard reads it
            structured_outputs=structured,
            # ...as a number: its token's text is never read (engine_patch.patches.logprob_text)
            extra_args={"vidlora_logprob_text": False},
        )
    except (ValueError, TypeError, _Invalid) as exc:  # e.g. top_p = 0: this request's fault
        raise RequestError(f"bad generation settings: {exc}") from exc


def build_input(tokenizer: Any, req: AnalysisRequest,
                chat_template_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The vLLM prompt dict: rendered chat prompt plus the video, if the request has frames."""
    engine_input: dict[str, Any] = {"prompt": build_prompt(tokenizer, req, chat_template_kwargs)}
    if req.frames:
        engine_input["multi_modal_data"] = {"video": build_video(req)}
    elif req.timestamps:
        raise RequestError("timestamps given without frames")
    return engine_input


def chosen_logprobs(token_ids: list[int], logprobs: Any) -> list[float]:
    """The logprob of each generated token, from vLLM's per-position logprob dicts."""
    if not logprobs:
        return []
    out: list[float] = []
    for tid, pos in zip(token_ids, logprobs):
        entry = pos.get(tid) if hasattr(pos, "get") else None
        out.append(float(entry.logprob) if entry is not None else float("nan"))
    return out
