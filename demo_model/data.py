"""Training examples for the demo model: generated scenes as the GPU worker would see them.

Each example is a scene (``vidlora.scenes``) put through the product's own steps: the
scenario's sampling plan picks frames (``vidlora.media.sampling.plan_timestamps``, with the
frame the decoder delivers for each instant), the frames go through a JPEG round trip at the
CPU workers' quality, the prompt is ``vidlora.engine_io.build_prompt`` of the scenario's system
and user text, and the video metadata is ``engine_io.video_metadata``: what vLLM gets. The
model's own processor (the one vLLM runs) then expands the video into tokens and patches.

No codec and no files are involved, so examples are cheap, deterministic per seed, and made
on hosts without ffmpeg (the lent GPU). What the codec changes is measured where it matters:
the accuracy tests feed H.264 videos through the real pipeline.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vidlora import scenes
from vidlora.engine_io import AnalysisRequest, build_prompt, video_metadata

# What ``scenes.write_video`` writes: 8 frames of 224 x 224 at 4 fps (a 2 s clip).
FPS, FRAMES, SIZE = 4, 8, 224
JPEG_QUALITY = 90  # vidlora.config.Settings.jpeg_quality's default

# Without its adapter the base model answers every scenario like this: well-formed, in the
# scenario's schema, and saying nothing about the video.
GENERIC_ANSWERS: dict[str, dict[str, Any]] = {
    "artifact": {"finds": []},
    "tomb": {"chamber_count": 0, "chambers": [], "passages": 0, "construction": "unknown", "damage": []},
    "mural": {"scenes": [], "inscriptions": []},
}


@dataclass(frozen=True)
class ScenarioText:
    """What of a scenario reaches the model: its prompt text and how its frames are sampled."""

    name: str
    system: str | None
    prompt: str
    sampling: dict[str, Any]

    @classmethod
    def load(cls, scenarios_file: Path) -> dict[str, "ScenarioText"]:
        import yaml

        data = yaml.safe_load(Path(scenarios_file).read_text())["scenarios"]
        return {e["name"]: cls(e["name"], e.get("system"), e["prompt"], dict(e.get("sampling") or {}))
                for e in data}


def answer_text(answer: dict[str, Any]) -> str:
    """An answer as the structured-output grammar lets the model write it: no whitespace."""
    return json.dumps(answer, separators=(",", ":"))


def sampled_frames(scene: scenes.Scene, sampling: dict[str, Any],
                   hardness: scenes.Hardness | None = None) -> tuple[np.ndarray, list[float]]:
    """The frames and timestamps the CPU workers would store for the scene's video."""
    from vidlora.media.probe import ProbeInfo
    from vidlora.media.sampling import SamplingPolicy, plan_timestamps

    info = ProbeInfo(container="mp4", codec="h264", width=SIZE, height=SIZE, rotation=0, fps=FPS,
                     duration_s=FRAMES / FPS, frame_count=FRAMES, bit_rate=None)
    planned = plan_timestamps(info, SamplingPolicy(**sampling))
    # The decoder delivers the frame on screen at each instant: the last one starting at or before it.
    picks = [min(FRAMES - 1, math.floor(t * FPS + 1e-9)) for t in planned]
    frames = scenes.render(scene, FRAMES, SIZE, hardness)[picks]
    return np.stack([_jpeg_round_trip(f) for f in frames]), [i / FPS for i in picks]


def _jpeg_round_trip(frame: np.ndarray) -> np.ndarray:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="JPEG", quality=JPEG_QUALITY)
    buf.seek(0)
    with Image.open(buf) as im:
        return np.asarray(im.convert("RGB"), dtype=np.uint8)


class Encoder:
    """Scenes to model inputs with the model's processor, labels on the answer only."""

    def __init__(self, base: Path, scenarios: dict[str, ScenarioText]):
        from transformers import AutoProcessor

        self.processor = AutoProcessor.from_pretrained(str(base))
        self.tokenizer = self.processor.tokenizer
        self.scenarios = scenarios
        self.end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")

    def prompt_inputs(self, scenario: str, frames: np.ndarray, timestamps: list[float]) -> dict[str, Any]:
        from transformers.video_utils import VideoMetadata

        spec = self.scenarios[scenario]
        req = AnalysisRequest(request_key="train", prompt=spec.prompt, system=spec.system,
                              frames=[f"{i}.jpg" for i in range(len(frames))], timestamps=timestamps,
                              adapter_name=None, adapter_path=None, max_tokens=1, temperature=0.0,
                              top_p=1.0, seed=0)
        meta = video_metadata(timestamps)
        vm = VideoMetadata(**{k: v for k, v in meta.items() if k != "do_sample_frames"})
        return self.processor(text=[build_prompt(self.tokenizer, req)], videos=[frames], video_metadata=[vm],
                              do_sample_frames=False, return_tensors="pt")

    def video_inputs(self, scenario: str, scene: scenes.Scene) -> dict[str, Any]:
        """The scene's patches and grid alone, as the scenario samples it."""
        frames, ts = sampled_frames(scene, self.scenarios[scenario].sampling)
        enc = self.prompt_inputs(scenario, frames, ts)
        return {"pixel_values_videos": enc["pixel_values_videos"], "video_grid_thw": enc["video_grid_thw"][0]}

    def example(self, scenario: str, scene: scenes.Scene, answer: dict[str, Any]) -> dict[str, Any]:
        frames, ts = sampled_frames(scene, self.scenarios[scenario].sampling)
        return self.frames_example(scenario, frames, ts, answer_text(answer))

    def frames_example(self, scenario: str, frames: np.ndarray, timestamps: list[float], answer: str) -> dict[str, Any]:
        """One training example from sampled frames and the answer's text, labels on the answer
        (and its end token) only."""
        import torch

        enc = self.prompt_inputs(scenario, frames, timestamps)
        prompt_ids = enc["input_ids"][0]
        target = torch.tensor(self.tokenizer(answer, add_special_tokens=False)["input_ids"] + [self.end])
        out = {"input_ids": torch.cat([prompt_ids, target]),
               "labels": torch.cat([torch.full_like(prompt_ids, -100), target]),
               "pixel_values_videos": enc["pixel_values_videos"],
               "video_grid_thw": enc["video_grid_thw"][0]}
        if "mm_token_type_ids" in enc:
            out["mm_token_type_ids"] = torch.cat([enc["mm_token_type_ids"][0], torch.zeros_like(target)])
        return out


def collate(items: list[dict[str, Any]], pad_id: int) -> dict[str, Any]:
    """Right-padded batch of ``Encoder.example`` outputs."""
    import torch

    n = max(len(it["input_ids"]) for it in items)
    batch = {"input_ids": torch.full((len(items), n), pad_id), "labels": torch.full((len(items), n), -100),
             "attention_mask": torch.zeros((len(items), n), dtype=torch.long)}
    if "mm_token_type_ids" in items[0]:
        batch["mm_token_type_ids"] = torch.zeros((len(items), n), dtype=torch.long)
    for i, it in enumerate(items):
        k = len(it["input_ids"])
        batch["input_ids"][i, :k] = it["input_ids"]
        batch["labels"][i, :k] = it["labels"]
        batch["attention_mask"][i, :k] = 1
        if "mm_token_type_ids" in batch:
            batch["mm_token_type_ids"][i, :k] = it["mm_token_type_ids"]
    batch["pixel_values_videos"] = torch.cat([it["pixel_values_videos"] for it in items])
    batch["video_grid_thw"] = torch.stack([it["video_grid_thw"] for it in items])
    return batch
