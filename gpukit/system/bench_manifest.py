"""The bench loop's videos manifest for the system run's own clips (issue 56): each clip
through the prepare path (bench.gpu.videos.sample_clip: probe_with_table, then sample_video per
sampling policy of VIDLORA_SCENARIOS_FILE), N processes at once, written as bench.gpu.videos
writes it, so ``bench_engine.py --videos`` streams the same clips the system analysed.

    python3 -m gpukit.system.bench_manifest --clips DIR --out DIR [--n 240] [--jobs 8]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    from bench.gpu.videos import policies, sample_clip

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clips", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--n", type=int, default=240)
    ap.add_argument("--jobs", type=int, default=8)
    a = ap.parse_args(argv)
    clips = sorted(a.clips.glob("*.mp4"))[: a.n]
    pol = policies()
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(a.jobs) as pool:
        rows = list(pool.map(sample_clip, [str(c) for c in clips], [str(a.out / "frames")] * len(clips),
                             [pol] * len(clips)))
    manifest = {"command": "python3 -m gpukit.system.bench_manifest " + " ".join(argv or sys.argv[1:]),
                "policies": {k: names for k, (_, names) in pol.items()},
                "sampled_in_s": round(time.perf_counter() - t0, 1), "clips": rows}
    tmp = a.out / "manifest.tmp"
    tmp.write_text(json.dumps(manifest) + "\n")
    tmp.replace(a.out / "manifest.json")
    print(f"[bench_manifest] {len(rows)} clips sampled in {manifest['sampled_in_s']} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
