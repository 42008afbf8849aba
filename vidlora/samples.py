"""Sample clips for the demo and the end-to-end tests, generated locally with ffmpeg.

Generated (not shipped) so the repository carries no media and every clip is licence-clean:
each is an ffmpeg test source, a few seconds long, small, in a different codec/container.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from vidlora.media.ffprobe import FFMPEG

# name -> (lavfi source, size, seconds, codec args, extension)
SAMPLES: dict[str, tuple[str, str, float, list[str], str]] = {
    "tomb_corridor": ("testsrc2", "320x240", 3, ["-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p"], ".mp4"),
    "mural_panel": ("mandelbrot", "320x240", 3, ["-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p"], ".mp4"),
    "pottery_shard": ("smptebars", "256x256", 2, ["-c:v", "libvpx-vp9", "-b:v", "200k", "-deadline", "realtime"], ".webm"),
    "inscription_wall": ("life=s=160x120:mold=10:r=25:ratio=0.1", "160x120", 3, ["-c:v", "mjpeg", "-q:v", "5"], ".avi"),
    "burial_chamber": ("cellauto=s=240x320:rule=110", "240x320", 2, ["-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p"], ".mov"),
    "bronze_vessel": ("rgbtestsrc", "320x180", 2, ["-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p"], ".mkv"),
}


def _source(spec: str, size: str) -> str:
    return spec if "=" in spec else f"{spec}=size={size}:rate=25"  # some carry their own size


def generate_samples(out_dir: Path, names: list[str] | None = None, tag: str | None = None) -> list[Path]:
    """Create the sample clips in ``out_dir`` (skipping ones already there).

    ``tag`` is written into the container's metadata: the same pictures with new content
    hashes, so a run gets fresh videos even where the plain samples were analysed before
    (vidlora deduplicates by content)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for name in names or list(SAMPLES):
        spec, size, seconds, codec, ext = SAMPLES[name]
        path = out_dir / (f"{name}-{tag}{ext}" if tag else f"{name}{ext}")
        if not path.exists():
            tmp = path.with_name(f".{path.name}.part{ext}")
            subprocess.run(
                [FFMPEG, "-v", "error", "-y", "-f", "lavfi", "-i", _source(spec, size),
                 "-t", str(seconds), "-an", *codec,
                 *(["-metadata", f"comment=vidlora-sample-{tag}"] if tag else []), str(tmp)],
                check=True, timeout=120,
            )
            tmp.rename(path)
        paths.append(path)
    return paths
