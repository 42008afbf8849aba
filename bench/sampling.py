"""Compare decoder backends for frame sampling on a 60 s 1080p H.264 clip.

    .venv/bin/python bench/sampling.py [--repeat N] [--seconds 60]

For each policy (uniform 10, uniform 32, fps=2 -> 120 frames) and each backend (decord, PyAV,
ffmpeg CLI) it runs the real ``sample_video`` path (ffprobe frame table, decode subprocess,
JPEG writing) and records wall seconds and CPU seconds (this process + all children), then
prints one table with ratios against decord, and writes bench/results/sampling.json and .md
with the command that produced them. The clip is generated once under var/bench/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vidlora.media.frames import sample_video  # noqa: E402
from vidlora.media.probe import probe  # noqa: E402
from vidlora.media.sampling import SamplingPolicy  # noqa: E402

BACKENDS = ["decord", "pyav", "ffmpeg"]
POLICIES = {
    "uniform10": SamplingPolicy(mode="uniform", num_frames=10),
    "uniform32": SamplingPolicy(mode="uniform", num_frames=32),
    "fps2": SamplingPolicy(mode="fps", fps=2.0, min_frames=1, max_frames=1000),
}


def make_clip(seconds: int) -> Path:
    out = ROOT / "var" / "bench" / f"h264_1080p_{seconds}s.mp4"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp.mp4")
        subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i",
                        f"testsrc2=s=1920x1080:r=30:d={seconds}", "-c:v", "libx264", "-preset", "veryfast",
                        "-pix_fmt", "yuv420p", str(tmp)], check=True)
        tmp.rename(out)
    return out


def cpu_now() -> float:
    from vidlora.media.decode_server import cpu_seconds

    return cpu_seconds()


def run_once(clip: Path, policy: SamplingPolicy, backend: str, info) -> tuple[float, float, list[float]]:
    with tempfile.TemporaryDirectory() as d:
        c0, t0 = cpu_now(), time.perf_counter()
        res = sample_video(clip, policy, Path(d) / "f", info=info, backends=[backend])
        return time.perf_counter() - t0, cpu_now() - c0, res.timestamps


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--seconds", type=int, default=60)
    args = ap.parse_args()
    clip = make_clip(args.seconds)
    info = probe(clip)
    rows = []
    for pname, policy in POLICIES.items():
        stamps = {}
        for backend in BACKENDS:
            runs = [run_once(clip, policy, backend, info) for _ in range(args.repeat)]
            wall = min(r[0] for r in runs)
            cpu = min(r[1] for r in runs)
            stamps[backend] = runs[0][2]
            rows.append({"policy": pname, "backend": backend, "frames": len(runs[0][2]),
                         "wall_s": round(wall, 2), "cpu_s": round(cpu, 2)})
            print(f"  {pname:9s} {backend:6s} wall {wall:6.2f} s  cpu {cpu:6.2f} s", flush=True)
        same = all(stamps[b] == stamps["decord"] for b in BACKENDS)
        for r in rows:
            if r["policy"] == pname:
                r["same_timestamps_as_decord"] = same
    base = {r["policy"]: r for r in rows if r["backend"] == "decord"}
    for r in rows:
        b = base[r["policy"]]
        r["wall_x_decord"] = round(r["wall_s"] / b["wall_s"], 2)
        r["cpu_x_decord"] = round(r["cpu_s"] / b["cpu_s"], 2)

    command = "cd " + str(ROOT) + " && .venv/bin/python bench/sampling.py " + shlex.join(sys.argv[1:])
    header = ["policy", "frames", "backend", "wall s", "CPU s", "wall x decord", "CPU x decord", "same ts"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        lines.append(f"| {r['policy']} | {r['frames']} | {r['backend']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | "
                     f"{r['wall_x_decord']:.2f} | {r['cpu_x_decord']:.2f} | {r['same_timestamps_as_decord']} |")
    table = "\n".join(lines)
    print(table)
    env = {"python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine(),
           "clip": f"{info.width}x{info.height} {info.codec} {info.duration_s:.0f} s {info.fps:g} fps, "
                   f"{info.frame_count} frames", "repeat": args.repeat,
           "ffmpeg": subprocess.run(["ffmpeg", "-version"], capture_output=True, text=True).stdout.split("\n")[0]}
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "sampling.json").write_text(json.dumps({"command": command, "env": env, "rows": rows}, indent=2) + "\n")
    (out / "sampling.md").write_text(
        "# Frame sampling: decord vs PyAV vs ffmpeg CLI\n\n"
        f"Command: `{command}`\n\n"
        f"Clip: {env['clip']} (testsrc2, x264 veryfast, default GOP 250). Machine: {env['cpus']} CPUs "
        f"(shared with other jobs, so wall times are noisy), {env['ffmpeg']}.\n\n"
        "Each cell is the full `sample_video` path: ffprobe frame table, one decode subprocess, JPEG "
        "writing at 576x320. CPU = this process + all children. Best of `--repeat` runs.\n\n"
        f"{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
