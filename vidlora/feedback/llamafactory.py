"""The training set in the form LLaMA-Factory turns into exactly the prompt vLLM serves.

vLLM renders a video as the outer ``<|vision_start|>`` ... ``<|vision_end|>`` around, per pair
of frames (the vision tower's temporal patch), the pair's time as text (``<0.7 seconds>``, the
mean of its two frames' real times) and its own ``<|vision_start|>`` + pads + ``<|vision_end|>``.
LLaMA-Factory 0.9.5's Qwen3.5 template (``qwen3_5``) builds something else from the same export:
its video plugin computes the times from its own ``video_fps`` setting instead of the frames'
times (``<0.2 seconds>`` where vLLM says ``<0.5 seconds>``) and leaves out the outer markers.

So this form writes what vLLM adds into the text LLaMA-Factory reads: the outer markers and
every pair's time, with each pair a 2-frame video of its own placeholder. It is read with
``template: keye_vl``, the 0.9.5 template whose turns are Qwen3.5's (``<|im_start|>`` roles,
the empty think block of ``enable_thinking: false`` in the prompt, no default system prompt)
and whose video plugin (Qwen2-VL's) adds only ``<|vision_start|>`` + pads + ``<|vision_end|>``.
The model sees the same tensors too: the vision tower encodes each temporal patch on its own,
and Qwen3-VL's rope index splits a video of T patches into T one-patch videos anyway.

One thing the split cannot keep: the video processor sizes a video's frames for the whole
video (its pixel budget counts frames). Where a 2-frame video would be sized otherwise than
the whole one (tiny frames, or very long ones), the example is left out of this form, counted
with its reason. ``tests/vidlora/feedback/test_llamafactory.py`` runs LLaMA-Factory's
own dataset loading on an export and compares token for token with vLLM's prompt.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from vidlora.engine_io import TIMEBASE_HZ  # the engine's frame times are whole ms

VERSION = "0.9.5"  # the LLaMA-Factory release this form and recipe are checked against
TEMPLATE = "keye_vl"
FILE = "llamafactory.jsonl"
RECIPE = "llamafactory.yaml"
VIDEO_TAG = "<video>"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
PROMPT_MARGIN_TOKENS = 64  # the turns' own tokens (role tags, think block) beyond their text
LOW_PIXELS = 256  # LLaMA-Factory's video_min_pixels default; the recipe sets it below any frame
LEARNING_RATE = 2.0e-4


@dataclass(frozen=True)
class VideoGeometry:
    """The model's video processor settings that decide a video's token grid."""

    patch: int
    merge: int
    temporal: int
    min_pixels: int
    max_pixels: int

    @classmethod
    def of_model(cls, model: str | Path) -> "VideoGeometry | None":
        """Read from the model folder's video processor config; None where there is none."""
        path = Path(model) / "video_preprocessor_config.json"
        try:
            cfg = json.loads(path.read_text())
            size = cfg["size"]
            return cls(int(cfg["patch_size"]), int(cfg["merge_size"]), int(cfg["temporal_patch_size"]),
                       int(size["shortest_edge"]), int(size["longest_edge"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def resized(self, frames: int, height: int, width: int) -> tuple[int, int]:
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

        return smart_resize(num_frames=max(frames, self.temporal), height=height, width=width,
                            temporal_factor=self.temporal, factor=self.patch * self.merge,
                            min_pixels=self.min_pixels, max_pixels=self.max_pixels)

    def refusal(self, frames: int, sizes: set[tuple[int, int]]) -> str | None:
        """Why this video cannot be split into 2-frame videos that read as the engine reads
        it; None where it can."""
        if len(sizes) != 1:
            return "frames of more than one size (the engine resizes them all to the first one's)"
        (width, height), = sizes
        if min(width, height) < 28 or max(width, height) > 200 * min(width, height):
            return "frames LLaMA-Factory resizes itself (a side under 28 px, or over 200:1)"
        if self.resized(frames, height, width) != self.resized(self.temporal, height, width):
            return (f"the engine sizes these frames for all {frames} of them; one patch of "
                    f"{self.temporal} alone would be sized otherwise")
        return None

    def tokens(self, frames: int, height: int, width: int) -> int:
        h, w = self.resized(frames, height, width)
        return math.ceil(frames / self.temporal) * (h // self.patch) * (w // self.patch) // self.merge ** 2


def frame_groups(frames: list[str], timestamps: list[float], temporal: int = 2) -> list[tuple[str, list[str]]]:
    """Each temporal patch as (its time text, its frames), as the engine renders them: frame
    times in whole ms, the last frame repeated to fill the last patch (a single frame becomes
    a patch of itself, as ``engine_io.build_video`` makes it), a patch's time its frames' mean."""
    if len(frames) != len(timestamps) or not frames:
        raise ValueError(f"{len(frames)} frames but {len(timestamps)} timestamps")
    frames, times = list(frames), [round(float(t) * TIMEBASE_HZ) / TIMEBASE_HZ for t in timestamps]
    while len(frames) % temporal:
        frames.append(frames[-1])
        times.append(times[-1])
    groups = []
    for i in range(0, len(frames), temporal):
        mean = (times[i] + times[i + temporal - 1]) / 2
        groups.append((f"<{mean:.1f} seconds>", frames[i:i + temporal]))
    return groups


def video_text(groups: list[tuple[str, list[str]]]) -> str:
    """The video as vLLM renders it, each patch's pads left to one 2-frame video's placeholder."""
    return VISION_START + "".join(time + VIDEO_TAG for time, _ in groups) + VISION_END


def row(messages: list[dict[str, str]], frames: list[str], timestamps: list[float], temporal: int) -> dict[str, Any]:
    """One example: the export's conversation with its one video placeholder written out as
    vLLM renders the video, and one 2-frame video per placeholder that leaves."""
    groups = frame_groups(frames, timestamps, temporal)
    out = [dict(m) for m in messages]
    user = next(m for m in out if VIDEO_TAG in m["content"])
    user["content"] = user["content"].replace(VIDEO_TAG, video_text(groups), 1)
    return {"messages": out, "videos": [g for _, g in groups]}


def text_tokens_at_most(*texts: str) -> int:
    # A byte-level BPE never makes more tokens than its text has UTF-8 bytes.
    return sum(len(t.encode("utf-8")) for t in texts)


# Settings a served LoRA must have for LLaMA-Factory to continue it as the engine serves it.
_NOT_CONTINUED = {"use_dora": "DoRA", "use_rslora": "rsLoRA", "layers_to_transform": "layers_to_transform",
                  "modules_to_save": "modules_to_save", "trainable_token_indices": "trainable tokens"}


def continuable(adapter: str | Path | None, model: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the recipe's keys to continue the serving adapter, None) or (None, why it starts a fresh
    LoRA): a plain PEFT LoRA whose base is the served model (or unnamed), with its rank, alpha
    and target modules, so the next version has the served one's shape and starts from what it
    already learned (a fresh LoRA's B is zero: a few steps leave it changing next to nothing,
    which the engine's guard refuses)."""
    if not adapter:
        return None, "the scenario serves no adapter"
    folder = Path(adapter)
    try:
        cfg = json.loads((folder / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return None, f"the serving adapter's adapter_config.json cannot be read here ({folder})"
    if cfg.get("peft_type") != "LORA":
        return None, f"the serving adapter is {cfg.get('peft_type')!r}, not a LoRA"
    for key, name in _NOT_CONTINUED.items():
        if cfg.get(key):
            return None, f"the serving adapter uses {name}, which the recipe does not continue"
    base = cfg.get("base_model_name_or_path")
    if base and Path(base).name != Path(model).name:
        return None, f"the serving adapter was trained on {base}, not the served model {model}"
    targets = cfg.get("target_modules")
    if isinstance(targets, str) or not targets or not isinstance(cfg.get("r"), int):
        return None, "the serving adapter's rank or target modules are not a plain list"
    return {"adapter_name_or_path": str(folder.resolve()), "lora_rank": cfg["r"],
            "lora_alpha": cfg.get("lora_alpha", 2 * cfg["r"]), "lora_target": ",".join(sorted(targets))}, None


@dataclass
class Recipe:
    """What the recipe needs to know of the examples written."""

    dataset: str
    model: str
    frame_pixels: int = 0  # the largest frame, so LLaMA-Factory never shrinks one
    tokens: int = 0  # the longest example, so LLaMA-Factory never cuts one
    serving: str | None = None  # the scenario's serving adapter folder: what the recipe continues

    def continues(self) -> tuple[dict[str, Any] | None, str | None]:
        return continuable(self.serving, self.model)

    def note(self, pixels: int, tokens: int) -> None:
        self.frame_pixels = max(self.frame_pixels, pixels)
        self.tokens = max(self.tokens, tokens)

    def config(self, export: Path) -> dict[str, Any]:
        cutoff = max(1024, math.ceil((self.tokens + PROMPT_MARGIN_TOKENS) / 256) * 256)
        local = Path(self.model)
        # Continue the serving adapter (LLaMA-Factory resumes a LoRA named here, trainable,
        # unless create_new_adapter): its rank, alpha and targets are written beside it so the
        # recipe says what it trains; a fresh LoRA otherwise (the manifest says why).
        lora, _ = self.continues()
        return {
            # A local folder by its full path: the trainer runs from anywhere.
            "model_name_or_path": str(local.resolve()) if local.is_dir() else self.model,
            "trust_remote_code": False,
            "stage": "sft", "do_train": True, "finetuning_type": "lora",
            **(lora or {"lora_target": "all"}),
            "dataset_dir": str(export.resolve()), "dataset": self.dataset,
            "template": TEMPLATE, "enable_thinking": False,
            "cutoff_len": cutoff,
            "video_max_pixels": max(self.frame_pixels, LOW_PIXELS),
            "video_min_pixels": LOW_PIXELS,
            "overwrite_cache": True, "preprocessing_num_workers": 4,
            "output_dir": f"adapters/{self.dataset.removeprefix('vidlora_')}-next",
            "per_device_train_batch_size": 1, "gradient_accumulation_steps": 8,
            "learning_rate": LEARNING_RATE, "num_train_epochs": 3.0, "lr_scheduler_type": "cosine",
            "warmup_ratio": 0.1, "bf16": True, "logging_steps": 10, "save_strategy": "epoch",
            "report_to": "none",
        }

    def write(self, export: Path) -> None:
        head = (f"# LLaMA-Factory {VERSION} recipe for this export (vidlora: docs/feedback-loop.md).\n"
                "# Train: llamafactory-cli train llamafactory.yaml [model_name_or_path=...] [output_dir=...]\n"
                f"# template {TEMPLATE} + enable_thinking false read {FILE} into exactly the tokens vLLM\n"
                "# serves; cutoff_len and video_max_pixels are set so that nothing is cut or shrunk.\n"
                + ("# It continues the serving adapter (adapter_name_or_path; its rank, alpha, targets).\n"
                   if self.continues()[0] else f"# A fresh LoRA: {self.continues()[1]}.\n")
                + "# On a CPU: add bf16=false (bf16 needs a GPU). Moved the export? dataset_dir=NEW_FOLDER.\n")
        (export / RECIPE).write_text(head + yaml.safe_dump(self.config(export), sort_keys=False))


class Writer:
    """Writes the form beside the export's ``train.jsonl``, an example at a time; a context
    manager, so its file is closed whatever happens to the export."""

    def __init__(self, out: Path, dataset: str, model: str, geometry: VideoGeometry, serving: str | None = None):
        self.out, self.geometry = out, geometry
        self.recipe = Recipe(dataset, model, serving=serving)
        self.examples = 0
        self.skipped: dict[str, int] = {}
        self._fh = (out / FILE).open("w", encoding="utf-8")

    @classmethod
    def for_model(cls, out: Path, dataset: str, model: str | None,
                  serving: str | None = None) -> "tuple[Writer | None, str | None]":
        """(the writer, None), or (None, why not): the split is checked against the model's
        own video processor settings, so the model folder must be readable here."""
        geometry = VideoGeometry.of_model(model) if model else None
        if geometry is None:
            return None, (f"the model's video processor settings ({model or 'no model'}/video_preprocessor_config.json) "
                          "cannot be read here: export where the model is, or name its folder with --model")
        return cls(out, dataset, model, geometry, serving), None

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, *exc: object) -> None:
        self._fh.close()

    def add(self, messages: list[dict[str, str]], frames: list[Path], names: list[str],
            timestamps: list[float]) -> None:
        from PIL import Image

        sizes = set()
        for path in frames:
            with Image.open(path) as im:
                sizes.add(im.size)
        reason = self.geometry.refusal(len(frames), sizes)
        if reason is not None:
            self.skipped[reason] = self.skipped.get(reason, 0) + 1
            return
        (width, height), = sizes
        example = row(messages, names, timestamps, self.geometry.temporal)
        self._fh.write(json.dumps(example, ensure_ascii=False) + "\n")
        self.examples += 1
        texts = [m["content"] for m in example["messages"]]
        self.recipe.note(width * height, self.geometry.tokens(len(frames), height, width)
                         + text_tokens_at_most(*texts))

    def finish(self) -> dict[str, Any]:
        """Close the file, write the recipe; the manifest's part."""
        self._fh.close()
        self.recipe.write(self.out)
        lora, fresh = self.recipe.continues()
        return {"file": FILE, "recipe": RECIPE, "version": VERSION, "template": TEMPLATE,
                "examples": self.examples, "skipped": self.skipped,
                "continues": lora["adapter_name_or_path"] if lora else None, "fresh_lora_why": fresh}
