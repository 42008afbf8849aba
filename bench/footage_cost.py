"""CPU seconds per sampled frame against file length, per container: this tree beside a
baseline revision, in one run (issue 31: sampling cost must not grow with the file's length).

    .venv/bin/python bench/footage_cost.py [--baseline fc3e6c8] [--minutes 1,10,60,120] [--frames 16]

Clips (generated once under var/bench/footage/): one low-resolution master per codec (128x72,
10 fps, testsrc2, a keyframe every 5 s) cut to each length by stream copy: H.264 in MP4, in
MPEG-TS and in AVI; MPEG-2 in an MPEG program stream (.vob). Low resolution keeps a 2-hour
clip cheap to make and to decode, so the table shows how cost scales with length; at 720p
every decode costs ~50x more, and the decode-everything baseline grows with it.

Each cell is a fresh subprocess running ``probe_with_table`` then ``sample_video`` (uniform,
``--frames`` frames) from one code version; CPU is that subprocess and all its children. The
baseline is ``git archive REV`` unpacked in a temporary directory and put on PYTHONPATH.
Writes bench/results/footage_cost.{json,md}.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLIP_DIR = ROOT / "var" / "bench" / "footage"
SIZE, FPS, GOP = "128x72", 10, 50
MASTERS = {  # container name: (suffix, encoder args, muxer)
    "mp4": (".mp4", ["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-bf", "0"], "mp4"),
    "mpegts": (".ts", ["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-bf", "0"], "mpegts"),
    "avi": (".avi", ["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-bf", "0"], "avi"),
    "mpeg-ps": (".vob", ["-c:v", "mpeg2video", "-q:v", "4"], "vob"),
}
MEASURE = """
import json, sys, tempfile
from pathlib import Path
from vidlora.media.frames import sample_video
from vidlora.media.probe import probe_with_table
from vidlora.media.sampling import SamplingPolicy
clip, n = Path(sys.argv[1]), int(sys.argv[2])
info, table = probe_with_table(clip)
with tempfile.TemporaryDirectory() as d:
    res = sample_video(clip, SamplingPolicy(mode="uniform", num_frames=n), Path(d) / "f", info=info, table=table)
print(json.dumps({"frames": len(res.files), "backend": res.backend, "timestamps": res.timestamps,
                  "note": getattr(res, "note", None)}))
"""


def master(container: str, minutes: int) -> Path:
    suffix, enc, mux = MASTERS[container]
    out = CLIP_DIR / f"{container}_{SIZE}_{FPS}fps_{minutes}min{suffix}"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}")
        subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i",
                        f"testsrc2=s={SIZE}:r={FPS}:d={minutes * 60}", *enc, "-g", str(GOP), "-f", mux, str(tmp)],
                       check=True)
        tmp.rename(out)
    return out


def clip(container: str, minutes: int, longest: int) -> Path:
    """A cut of the longest master by stream copy (cheap), so every length has the same content."""
    if minutes == longest:
        return master(container, longest)
    suffix, _, mux = MASTERS[container]
    out = CLIP_DIR / f"{container}_{SIZE}_{FPS}fps_{minutes}min{suffix}"
    if not out.exists():
        tmp = out.with_name(f".{out.name}")
        subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-i", str(master(container, longest)),
                        "-map", "0:v:0", "-c", "copy", "-t", str(minutes * 60), "-f", mux, str(tmp)], check=True)
        tmp.rename(out)
    return out


def measure(code_root: Path, path: Path, frames: int) -> tuple[float, dict]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", MEASURE, str(path), str(frames)], cwd=code_root,
                         env={**os.environ, "PYTHONPATH": str(code_root)}, capture_output=True, text=True,
                         timeout=3600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["?"])[-1]
        return cpu, {"error": tail[:200]}
    return cpu, json.loads(out.stdout.strip().splitlines()[-1])


def unpack(rev: str, into: Path) -> None:
    data = subprocess.run(["git", "archive", "--format=tar", rev], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default="fc3e6c8", help="revision to compare against (default: before issue 31)")
    ap.add_argument("--minutes", default="1,10,60,120")
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--containers", default=",".join(MASTERS))
    args = ap.parse_args()
    lengths = [int(m) for m in args.minutes.split(",")]
    containers = args.containers.split(",")
    rev = subprocess.run(["git", "rev-parse", "--short", args.baseline], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.strip()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory(prefix="vidlora-baseline-") as tmp:
        base = Path(tmp)
        unpack(rev, base)
        for container in containers:
            for minutes in lengths:
                path = clip(container, minutes, max(lengths))
                row = {"container": container, "minutes": minutes, "bytes": path.stat().st_size}
                for version, root in (("baseline", base), ("this", ROOT)):  # one after the other, same clip
                    cpu, res = measure(root, path, args.frames)
                    row[version] = {"cpu_s": round(cpu, 3), **res}
                    print(container, minutes, version, round(cpu, 2), res.get("backend"), res.get("error", ""),
                          flush=True)
                b, t = row["baseline"], row["this"]
                row["same_timestamps"] = b.get("timestamps") == t.get("timestamps") if "error" not in b else None
                rows.append(row)
    ffmpeg_v = subprocess.run(["ffmpeg", "-version"], capture_output=True, text=True).stdout.splitlines()[0]
    results = ROOT / "bench" / "results"
    (results / "footage_cost.json").write_text(json.dumps({"baseline": rev, "this": head, "rows": rows}, indent=1))
    cmd = " ".join(["bench/footage_cost.py", *map(shlex.quote, sys.argv[1:])])
    md = [
        "# Sampling cost against file length, per container (issue 31)", "",
        f"Command: `.venv/bin/python {cmd}`", "",
        f"Baseline `{rev}` (before issue 31: TS/PS/AVI decoded from start to end) beside this tree "
        f"(`{head}`, plus uncommitted changes when run from a dirty tree), each in a fresh subprocess "
        f"on the same clip. Clips: testsrc2 {SIZE} at {FPS} fps, a keyframe every {GOP // FPS} s, H.264 "
        "(MP4, MPEG-TS, AVI) and MPEG-2 (MPEG-PS .vob), cut from one master by stream copy. Uniform "
        f"{args.frames} frames. CPU = the subprocess and all its children (probe, packet scan, "
        f"decoder, JPEG writing). Machine: {os.cpu_count()} CPUs shared with other jobs, "
        f"{platform.python_version()}, {ffmpeg_v}.", "",
        "| container | minutes | MB | baseline CPU s | this CPU s | baseline CPU s / frame | this CPU s / frame | same timestamps |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        b, t = r["baseline"], r["this"]
        n = t.get("frames") or args.frames
        bcell = f"{b['cpu_s']:.2f}" if "error" not in b else f"failed: {b['error'][:60]}"
        bper = f"{b['cpu_s'] / n:.3f}" if "error" not in b else "-"
        tper = f"{t['cpu_s'] / n:.3f}" if "error" not in t else f"failed: {t['error'][:60]}"
        md.append(f"| {r['container']} | {r['minutes']} | {r['bytes'] / 1e6:.1f} | {bcell} | {t['cpu_s']:.2f} | "
                  f"{bper} | {tper} | {r['same_timestamps']} |")
    (results / "footage_cost.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
