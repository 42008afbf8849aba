"""Probe cost of the longest allowed transport stream: wall, CPU and peak memory of
``probe_with_table`` (header, packet table, decode check) in a fresh process, this tree beside a
baseline revision (issue 49: a 6-hour 50 fps TS took 1.75 GB and 62 s to probe).

    .venv/bin/python bench/probe_memory.py [--baseline 0727ef9] [--hours 1,6]

Clips (generated once under var/bench/probe/): testsrc2 64x36 at 50 fps, a keyframe a second,
H.264 with MP2 audio in MPEG-TS. The packet count (video and audio), not the picture size, is
what the probe's memory grows with, so a tiny picture keeps a 6-hour clip cheap to make.
Peak memory is the probing process's own maxrss; the ffprobe child is reported apart.
Writes bench/results/probe_memory.md.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from footage_cost import unpack  # noqa: E402  (git archive REV, unpacked)

ROOT = Path(__file__).resolve().parent.parent
CLIP_DIR = ROOT / "var" / "bench" / "probe"
MEASURE = """
import json, resource, sys, time
from pathlib import Path
from vidlora.media.probe import probe_with_table
t = time.monotonic()
info, table = probe_with_table(Path(sys.argv[1]))
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"frames": info.frame_count, "wall_s": round(time.monotonic() - t, 2),
                  "cpu_s": round(me.ru_utime + me.ru_stime, 2), "child_cpu_s": round(kids.ru_utime + kids.ru_stime, 2),
                  "rss_mb": round(me.ru_maxrss / 1024), "child_rss_mb": round(kids.ru_maxrss / 1024)}))
"""


def clip(hours: int) -> Path:
    CLIP_DIR.mkdir(parents=True, exist_ok=True)
    out = CLIP_DIR / f"ts_64x36_50fps_{hours}h.ts"
    if not out.exists():
        s = hours * 3600
        tmp = out.with_suffix(".part.ts")
        subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i", f"testsrc2=s=64x36:r=50:d={s}",
                        "-f", "lavfi", "-i", f"sine=d={s}", "-c:v", "libx264", "-preset", "ultrafast", "-g", "50",
                        "-c:a", "mp2", "-b:a", "64k", "-f", "mpegts", str(tmp)], check=True)
        tmp.rename(out)
    return out


def measure(root: Path, path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", MEASURE, str(path)], cwd=root, capture_output=True, text=True,
                         env={"PYTHONPATH": str(root), "PATH": "/usr/local/bin:/usr/bin:/bin"})
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default="0727ef9", help="revision to compare against (default: before issue 49)")
    ap.add_argument("--hours", default="1,6")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="vidlora-baseline-") as tmp:
        unpack(args.baseline, Path(tmp))
        for hours in [int(h) for h in args.hours.split(",")]:
            path = clip(hours)
            for version, root in (("baseline", Path(tmp)), ("this", ROOT)):
                row = {"hours": hours, "MB": round(path.stat().st_size / 2**20), "version": version, **measure(root, path)}
                print(row, flush=True)
                rows.append(row)
    keys = ["hours", "MB", "version", "frames", "wall_s", "cpu_s", "child_cpu_s", "rss_mb", "child_rss_mb"]
    md = ["# Probe cost of a long transport stream (issue 49)", "",
          f"Command: `.venv/bin/python bench/probe_memory.py {' '.join(sys.argv[1:])}`".rstrip() + "", "",
          f"Baseline `{args.baseline}` (the packet table parsed as one JSON document) beside this tree (streamed into "
          "integer columns). Clip: testsrc2 64x36, 50 fps, H.264 + MP2 in MPEG-TS. rss_mb: the probing process's peak; "
          "child: the largest child (ffprobe/ffmpeg). Machine: 2 CPUs shared with other jobs.", "",
          "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    md += ["| " + " | ".join(str(r.get(k, r.get("error", ""))) for k in keys) + " |" for r in rows]
    (ROOT / "bench" / "results" / "probe_memory.md").write_text("\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
