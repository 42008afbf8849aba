"""Frames as an independent decoder shows them: ffmpeg from the start of the file, no seeking,
scaled (and deinterlaced) like the sampler does, to check stored frames against, frame by frame."""
from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy as np
from PIL import Image

from tests.support.corpus import FOOTAGE_FPS, read_frame_code
from vidlora.config import Settings


def reference_frames(path: Path, size: tuple[int, int], deinterlace: bool) -> np.ndarray:
    """Every frame in presentation order, decoded from the start by ffmpeg (timestamps made
    continuous across a join, as ffmpeg does without -copyts), scaled like the sampler scales."""
    w, h = size
    vf = ("bwdif=mode=send_frame:parity=auto:deint=all," if deinterlace else "") + \
        f"scale={w}:{h}:flags=bicubic,format=rgb24"
    raw = subprocess.run(["ffmpeg", "-v", "error", "-nostdin", "-i", str(path), "-map", "0:v:0", "-vf", vf,
                          "-vsync", "passthrough", "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
                         capture_output=True, check=True).stdout
    return np.frombuffer(raw, np.uint8).reshape(-1, h, w, 3)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return 99.0 if mse == 0 else 10 * math.log10(255 ** 2 / mse)


def matches_reference(res, base: Path, ref: np.ndarray, first_code: int = 0, fps: int = FOOTAGE_FPS,
                      step: int = 1) -> None:
    """Every stored JPEG is the reference decode's frame at its stated time: by frame code and
    by picture (the reference JPEG-encoded like the sampler's). ``step``: source frames per
    frame (2 where two fields were woven into one, the code being the first field's)."""
    floor = 45 if res.backend == "ffmpeg" else 28
    for t, p in zip(res.timestamps, res.paths(base)):
        assert read_frame_code(p) == (first_code + step * round(t * fps)) % 256, (t, res.backend)
        Image.fromarray(ref[round(t * fps)]).save(base / "ref.jpg", "JPEG", quality=Settings().jpeg_quality)
        got, want = np.asarray(Image.open(p).convert("RGB")), np.asarray(Image.open(base / "ref.jpg").convert("RGB"))
        assert psnr(got, want) > floor, (t, res.backend)
