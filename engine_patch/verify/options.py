"""What a verification run is given: its options, the tolerance constants (the package
docstring says why K = 3 and the floors), and the natural-text prompts every check uses."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


def make_prompt(tokenizer, length: int, offset: int = 0) -> list[int]:
    """Natural-text token ids, exactly `length` long; `offset` shifts the start (distinct prompts)."""
    ids = tokenizer(CORPUS, add_special_tokens=False)["input_ids"]
    start = (offset * 37) % len(ids)
    reps = (start + length) // len(ids) + 2
    return (ids * reps)[start:start + length]
