"""Sampling policies: which instants of a video to show the model, and at what size.

Timestamp rule (one rule for every mode, so it is easy to reason about and to test):
the window ``[start, end)`` is split into ``n`` equal segments and we target each segment's
centre. ``n`` is ``num_frames`` (uniform) or ``round(window * fps)`` clamped to
``[min_frames, max_frames]`` (fps mode), and never more than the frames the window holds, so a
short clip does not yield the same frame twice. The decoder then takes, for every target, the
frame whose real pts is at or before it (``frames.py``), so the reported timestamps are the
frames' own, which matters for variable frame rate.

For fps mode without clamping the segment centres are ``start + (k + 0.5) / fps``: the frame in
the middle of each 1/fps window. (We do not use ffmpeg's ``fps`` filter for this: its default
rounding lands half a window late unless given ``round=up``, and it cannot report real pts.)

Sizes: both sides multiples of 32 (Qwen3.5 vision: patch 16 x spatial merge 2), aspect kept,
``min_pixels <= w*h <= max_pixels``.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, fields

from vidlora.media import reasons
from vidlora.media.probe import BadVideo, ProbeInfo

FACTOR = 32
# bump when plan_timestamps/target_size/deinterlacing change what a key produces
# (v3: interlaced video is deinterlaced; the key says whether the policy allows it)
KEY_VERSION = "v3"
DEINTERLACE_MODES = ("auto", "off")
MAX_FRAMES_LIMIT = 4096


@dataclass(frozen=True)
class SamplingPolicy:
    mode: str  # "uniform" | "fps"
    num_frames: int = 16  # uniform
    fps: float = 2.0  # fps mode
    min_frames: int = 4  # fps mode
    max_frames: int = 32  # fps mode
    start_s: float | None = None
    end_s: float | None = None
    max_pixels: int = 448 * 448
    min_pixels: int = 64 * 64
    # "auto": interlaced video (stream flags, or ffmpeg's idet where they are missing) is
    # deinterlaced with bwdif before the resize; "off": frames as stored, fields woven.
    deinterlace: str = "auto"

    def __post_init__(self) -> None:
        if self.mode not in ("uniform", "fps"):
            raise ValueError(f"mode must be 'uniform' or 'fps', not {self.mode!r}")
        if self.deinterlace not in DEINTERLACE_MODES:
            raise ValueError(f"deinterlace must be one of {list(DEINTERLACE_MODES)}, not {self.deinterlace!r}")
        for name in ("num_frames", "min_frames", "max_frames", "max_pixels", "min_pixels"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{name} must be an integer, not {v!r}")
        if not 1 <= self.num_frames <= MAX_FRAMES_LIMIT:
            raise ValueError(f"num_frames must be in 1..{MAX_FRAMES_LIMIT}")
        if not 1 <= self.min_frames <= self.max_frames <= MAX_FRAMES_LIMIT:
            raise ValueError(f"need 1 <= min_frames <= max_frames <= {MAX_FRAMES_LIMIT}")
        if not (isinstance(self.fps, (int, float)) and not isinstance(self.fps, bool)
                and math.isfinite(self.fps) and 0 < self.fps <= 240):
            raise ValueError("fps must be a number in (0, 240]")
        for name in ("start_s", "end_s"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not math.isfinite(v) or v < 0):
                raise ValueError(f"{name} must be a non-negative number or null")
        if self.start_s is not None and self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError("end_s must be greater than start_s")
        if self.max_pixels < FACTOR * FACTOR:
            raise ValueError(f"max_pixels must be at least {FACTOR * FACTOR}")
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError("need 0 < min_pixels <= max_pixels")

    def describe(self) -> str:
        """The policy in words, only the settings its mode uses: "8 frames spread evenly over
        the video, at most 50,176 pixels each"."""
        if self.mode == "uniform":
            text = f"{self.num_frames} frame{'s' if self.num_frames != 1 else ''} spread evenly over the video"
        else:
            text = f"{self.fps:g} frames a second, {self.min_frames} to {self.max_frames} frames"
        if self.start_s is not None or self.end_s is not None:
            text += f", from {self.start_s or 0:g} s to {f'{self.end_s:g} s' if self.end_s is not None else 'the end'}"
        text = f"{text}, at most {self.max_pixels:,} pixels each"
        return text + (", interlaced video not deinterlaced" if self.deinterlace == "off" else "")

    @classmethod
    def from_dict(cls, d: dict) -> "SamplingPolicy":
        """Build from a scenario's ``sampling`` mapping; unknown keys and bad values -> ValueError."""
        if not isinstance(d, dict):
            raise ValueError("sampling policy must be a mapping")
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown sampling keys {sorted(unknown)}; allowed: {sorted(known)}")
        if "mode" not in d:
            raise ValueError("sampling policy needs 'mode' ('uniform' or 'fps')")
        kw = dict(d)
        for name in ("start_s", "end_s", "fps"):  # YAML gives ints for whole numbers
            if isinstance(kw.get(name), int) and not isinstance(kw.get(name), bool):
                kw[name] = float(kw[name])
        return cls(**kw)

    def as_dict(self) -> dict:
        return asdict(self)

    def key(self) -> str:
        """Canonical, stable string naming what this policy produces (a DB unique key).

        Only fields that affect the output appear (fps fields are absent in uniform mode), and
        numbers are normalised (2 == 2.0), so equal behaviour gives an equal key.
        """
        parts = [KEY_VERSION, f"mode={self.mode}"]
        if self.mode == "uniform":
            parts.append(f"n={self.num_frames}")
        else:
            parts += [f"fps={_num(self.fps)}", f"min={self.min_frames}", f"max={self.max_frames}"]
        parts += [f"start={_num(self.start_s or 0.0)}",
                  f"end={'' if self.end_s is None else _num(self.end_s)}",
                  f"px={self.min_pixels}-{self.max_pixels}", f"deint={self.deinterlace}"]
        return ";".join(parts)

    def key_hash(self) -> str:
        """Short filesystem-safe digest of ``key()`` (for frame directory names)."""
        return hashlib.sha256(self.key().encode()).hexdigest()[:16]


def _num(x: float) -> str:
    s = f"{float(x):.6f}".rstrip("0").rstrip(".")
    return s or "0"


def plan_timestamps(info: ProbeInfo, policy: SamplingPolicy) -> list[float]:
    """Target instants (seconds since the first frame), ascending. See the module docstring."""
    start = policy.start_s or 0.0
    end = info.duration_s if policy.end_s is None else min(policy.end_s, info.duration_s)
    if start >= info.duration_s:
        raise BadVideo(reasons.window_after_end(start, info.duration_s))
    window = end - start
    if policy.mode == "uniform":
        n = policy.num_frames
    else:
        n = min(max(round(window * policy.fps), policy.min_frames), policy.max_frames)
    # Never ask for more frames than the window holds (+1 for a frame straddling its start).
    in_window = max(1, math.floor(info.frame_count * window / info.duration_s + 1e-9))
    n = max(1, min(n, in_window))
    step = window / n
    return [round(start + (i + 0.5) * step, 6) for i in range(n)]


def target_size(width: int, height: int, max_pixels: int, min_pixels: int) -> tuple[int, int]:
    """(w, h) for the model: multiples of 32, ``w*h <= max_pixels``, the aspect kept as well as
    the grid allows, and ``w*h >= min_pixels`` where that keeps the aspect.

    Every candidate height on the 32-grid is paired with the two widths nearest to
    ``height * aspect`` (so each candidate is within one 32-pixel step of the true aspect), and
    the one closest to the wanted area (the frame's own, clamped into the pixel bounds) with
    the smallest aspect error wins; aspect error counts three times, because a stretched picture
    misleads the model while a slightly smaller one only shows less detail. Sides are never
    rounded independently (that is what bent 720x528 into 256x160).
    """
    if width <= 0 or height <= 0:
        raise ValueError("width and height must be positive")
    if max_pixels < FACTOR * FACTOR:
        raise ValueError(f"max_pixels must be at least {FACTOR * FACTOR}")
    f = FACTOR
    aspect = width / height
    wanted = min(max_pixels, max(min_pixels, width * height))
    near: list[tuple[int, int]] = []  # width within one grid step of height * aspect
    pinned: list[tuple[int, int]] = []  # extreme shapes: even the nearest width is over budget
    for h in range(f, max_pixels // f + 1, f):
        ideal = h * aspect
        widths = {max(f, math.floor(ideal / f) * f), max(f, math.ceil(ideal / f) * f)}
        fits = [w for w in widths if w * h <= max_pixels and abs(w - ideal) < f]
        near += [(w, h) for w in fits]
        if not fits and max_pixels // h // f * f >= f:
            pinned.append((max_pixels // h // f * f, h))
    # The aspect is kept first, the budget always; min_pixels is met where the aspect allows.
    candidates = near or pinned
    big_enough = [c for c in candidates if c[0] * c[1] >= min_pixels]

    def cost(c: tuple[int, int]) -> tuple[float, int]:
        w, h = c
        return 3 * abs(math.log((w / h) / aspect)) + abs(math.log(w * h / wanted)), -w * h

    return min(big_enough or candidates, key=cost)
