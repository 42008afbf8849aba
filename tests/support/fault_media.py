"""Cheap, distinct test clips for the fault tests and the soak.

One ffmpeg run cuts a long 64x64 test pattern into 1-second MP4 segments, so hundreds of clips
with distinct content (distinct sha256, so no deduplication) cost a few seconds, not one ffmpeg
start per clip. Cached under the corpus dir by recipe.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

FFMPEG = shutil.which("ffmpeg") or "/usr/bin/ffmpeg"


def tiny_clips(cache_dir: Path, count: int, size: str = "64x64", rate: int = 10) -> list[Path]:
    """``count`` distinct 1-second H.264 MP4 clips (moov at the end, so a cut one is truncated)."""
    recipe = f"v1-{count}-{size}-{rate}"
    out = Path(cache_dir) / f"clips-{hashlib.sha1(recipe.encode()).hexdigest()[:8]}"
    done = out / ".done"
    if not done.exists():
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        subprocess.run([
            FFMPEG, "-nostdin", "-v", "error", "-f", "lavfi", "-i", f"testsrc2=s={size}:r={rate}:d={count}",
            "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-g", str(rate),
            "-force_key_frames", "expr:gte(t,n_forced*1)", "-f", "segment", "-segment_time", "1",
            "-reset_timestamps", "1", str(tmp / "clip%04d.mp4"),
        ], check=True, timeout=300)
        (tmp / ".done").write_text(recipe)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    clips = sorted(out.glob("clip*.mp4"))
    assert len(clips) >= count, f"expected {count} segments, got {len(clips)}"
    return clips[:count]


def long_gop_clip(cache_dir: Path) -> Path:
    """20 s of 1080p with one keyframe: sampling seeks decode from the start and take seconds,
    so a worker can be killed while it is busy."""
    path = Path(cache_dir) / "long_gop_1080p.mp4"
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.mp4")
        subprocess.run([
            FFMPEG, "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=size=1920x1080:rate=30:duration=20",
            "-c:v", "libx264", "-preset", "ultrafast", "-g", "600", "-pix_fmt", "yuv420p", str(tmp),
        ], check=True, timeout=300)
        tmp.rename(path)
    return path


def write_zip(path: Path, members: list[tuple[str, bytes | Path]]) -> Path:
    # Stored, not deflated: video does not compress and storing keeps the test fast.
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data in members:
            zf.writestr(name, data.read_bytes() if isinstance(data, Path) else data)
    return path


def write_tar(path: Path, members: list[tuple[str, Path]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, src in members:
            tar.add(src, arcname=name)
    return path
