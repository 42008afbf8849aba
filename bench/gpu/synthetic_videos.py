"""A videos manifest without clips: per clip, 8 camera-like frames at the size the shipped
scenarios' sampling gives a 1080p clip (288x160), for every shipped scenario, in the format
``bench.gpu.videos`` writes. For the streaming phases with video inputs on a device that has
neither PyAV nor ffmpeg (``bench.gpu.videos`` needs both to make and sample real clips):
what the GPU worker's engine sees of a video is these frames, their timestamps and the prompt.

    python -m bench.gpu.synthetic_videos --out DIR --clips 400

Every clip has its own frames (vLLM's multimodal cache serves repeats for free); the scenarios
of one clip share them, as the shipped policies' identical picks do after sampling.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SIZE = (288, 160)  # what max_pixels 50,176 makes of 1920x1080 (bench/results/cpu_feed.md's clips)
TIMESTAMPS = [1.233333, 3.733333, 6.233333, 8.733333, 11.233333, 13.733333, 16.233333, 18.733333]


def frames_for(out: Path, clip: int) -> list[str]:
    """8 frames of a moving scene with sensor noise (JPEG quality 90, as the sampler writes)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(clip)
    w, h = SIZE
    y, x = np.mgrid[0:h, 0:w]
    d = out / "frames" / f"clip{clip:04d}"
    d.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(len(TIMESTAMPS)):
        img = np.stack([(x + 9 * i + 13 * clip) % 256, (y + 3 * i + clip) % 256, (x // 2 + y) % 256], -1)
        img = np.clip(img + rng.normal(0, 6, img.shape), 0, 255).astype(np.uint8)
        p = d / f"{i:05d}.jpg"
        Image.fromarray(img).save(p, quality=90)
        files.append(str(p))
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--clips", type=int, default=400)
    a = ap.parse_args(argv)

    from vidlora.config import get_settings
    from vidlora.scenarios import load_scenarios

    out = Path(a.out)
    s = get_settings()
    names = [spec.name for spec in load_scenarios(s.scenarios_file, s.adapter_root)]
    clips = []
    for k in range(a.clips):
        files = frames_for(out, k)
        frame = {"files": files, "timestamps": TIMESTAMPS, "width": SIZE[0], "height": SIZE[1], "backend": "synthetic"}
        clips.append({"clip": f"clip{k:04d}", "seconds": 20.0, "frames": {name: dict(frame) for name in names}})
    manifest = out / "manifest.json"
    tmp = manifest.with_suffix(".tmp")  # bench_engine may be waiting for it
    tmp.write_text(json.dumps({"command": f"python -m bench.gpu.synthetic_videos --out {a.out} --clips {a.clips}",
                               "synthetic": True, "clips": clips}, indent=1) + "\n")
    tmp.replace(manifest)
    print(f"[synthetic_videos] {len(clips)} clips x {len(names)} scenarios -> {manifest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
