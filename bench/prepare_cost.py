"""CPU seconds to prepare one video (probe + frame table + sampling), this tree vs a baseline
revision, side by side in one run (issue 13: video fidelity must not cost more than before).

    .venv/bin/python bench/prepare_cost.py [--baseline REV] [--repeat 3]

Clips (generated once under var/bench/): a 10-minute 720p H.264 film, a 60 s 1080p clip, and
60 s of 720p in MKV and in MPEG-TS (testsrc2, x264 veryfast, default GOP 250). Policies: uniform 8 and uniform 32 frames. Each
measurement is a fresh subprocess running ``probe_with_table`` then ``sample_video`` from one
code version (the baseline is a detached ``git worktree`` of REV, on PYTHONPATH); CPU is the
subprocess and all its children. Versions alternate run by run so machine noise hits both;
the best of ``--repeat`` is kept. Writes bench/results/prepare_cost.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLIPS = {"720p_600s": ("1280x720", 600), "1080p_60s": ("1920x1080", 60),
         # issue 62 reads every probe's demuxer warnings and the end of MKV/MP4/TS structure
         "720p_60s_mkv": ("1280x720", 60, ".mkv"), "720p_60s_ts": ("1280x720", 60, ".ts")}
POLICIES = {"uniform8": 8, "uniform32": 32}
MEASURE = """
import json, sys, tempfile
from pathlib import Path
from vidlora.media.frames import sample_video
from vidlora.media.probe import probe_with_table
from vidlora.media.sampling import SamplingPolicy
clip, n = Path(sys.argv[1]), int(sys.argv[2])
info, table = probe_with_table(clip)
with tempfile.TemporaryDirectory() as d:
    try:
        res = sample_video(clip, SamplingPolicy(mode="uniform", num_frames=n), Path(d) / "f", info=info, table=table)
    except TypeError:  # a baseline without the table argument scans the packets again
        res = sample_video(clip, SamplingPolicy(mode="uniform", num_frames=n), Path(d) / "f", info=info)
print(json.dumps({"frames": len(res.files), "backend": res.backend, "size": [res.width, res.height]}))
"""


def make_clip(size: str, seconds: int, suffix: str = ".mp4") -> Path:
    out = ROOT / "var" / "bench" / f"h264_{size}_{seconds}s{suffix}"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp" + suffix)
        subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i",
                        f"testsrc2=s={size}:r=30:d={seconds}", "-c:v", "libx264", "-preset", "veryfast",
                        "-pix_fmt", "yuv420p", str(tmp)], check=True)
        tmp.rename(out)
    return out


def measure(code_root: Path, clip: Path, frames: int) -> tuple[float, dict]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", MEASURE, str(clip), str(frames)], cwd=code_root,
                         env={**os.environ, "PYTHONPATH": str(code_root)}, capture_output=True, text=True,
                         check=True, timeout=900)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default="2ce4b7f~1", help="revision to compare against (default: before issue 13)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--clips", nargs="+", choices=sorted(CLIPS), default=list(CLIPS),
                    help="which clips (default: all; the 10-minute one takes long to make on a busy machine)")
    args = ap.parse_args()
    rev = subprocess.run(["git", "rev-parse", "--short", args.baseline], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.strip()
    base = Path(tempfile.mkdtemp(prefix="vidlora-baseline-")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(base), rev], cwd=ROOT, check=True,
                   capture_output=True)
    try:
        clips = {name: make_clip(*CLIPS[name]) for name in args.clips}
        rows = []
        for cname, clip in clips.items():
            for pname, n in POLICIES.items():
                best = {"baseline": float("inf"), "this": float("inf")}
                seen = {}
                for _ in range(args.repeat):
                    for version, root in (("baseline", base), ("this", ROOT)):
                        cpu, what = measure(root, clip, n)
                        best[version] = min(best[version], cpu)
                        seen[version] = what
                row = {"clip": cname, "policy": pname, "baseline_cpu_s": round(best["baseline"], 2),
                       "this_cpu_s": round(best["this"], 2), "ratio": round(best["this"] / best["baseline"], 3),
                       "baseline": seen["baseline"], "this": seen["this"]}
                rows.append(row)
                print(f"{cname:10s} {pname:9s} baseline {row['baseline_cpu_s']:6.2f} s  this {row['this_cpu_s']:6.2f} s"
                      f"  x{row['ratio']:.3f}", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)
    command = ".venv/bin/python bench/prepare_cost.py " + shlex.join(sys.argv[1:])
    header = "| clip | policy | baseline CPU s | this CPU s | this / baseline | backend (this) | frame size (baseline -> this) |"
    lines = [header, "|---|---|---:|---:|---:|---|---|"]
    for r in rows:
        lines.append(f"| {r['clip']} | {r['policy']} | {r['baseline_cpu_s']:.2f} | {r['this_cpu_s']:.2f} | "
                     f"{r['ratio']:.3f} | {r['this']['backend']} | {'x'.join(map(str, r['baseline']['size']))} -> "
                     f"{'x'.join(map(str, r['this']['size']))} |")
    env = {"python": platform.python_version(), "cpus": os.cpu_count(), "baseline": rev, "repeat": args.repeat,
           "ffmpeg": subprocess.run(["ffmpeg", "-version"], capture_output=True, text=True).stdout.split("\n")[0]}
    out = ROOT / "bench" / "results"
    (out / "prepare_cost.json").write_text(json.dumps({"command": command, "env": env, "rows": rows}, indent=2) + "\n")
    (out / "prepare_cost.md").write_text(
        "# Prepare cost: probe + frame table + sampling, this tree vs a baseline\n\n"
        f"Command: `{command}` (baseline {rev}; best of {args.repeat}, versions alternating)\n\n"
        f"Machine: {env['cpus']} CPUs, shared; {env['ffmpeg']}. CPU = the measuring subprocess and "
        "all its children (ffprobe, ffmpeg, the decode worker).\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
