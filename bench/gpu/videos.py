"""Videos for the videos-per-hour figure (issue 14): camera-like clips, sampled for every
shipped scenario by the prepare path, with the CPU-seconds each video costs.

    python -m bench.gpu.videos --out DIR [--clips 24] [--seconds 20] [--workers 0]

1. Clips. PyAV encodes 1920x1080 30 fps H.264 clips (High profile, 12 Mb/s, 1 s GOP) of a
   moving test pattern under per-frame noise. The noise is the point: a flat test pattern decodes far
   cheaper than footage, and sensor noise is what keeps a phone's bitrate at 10-17 Mb/s.
   Every clip has its own noise seed, so no two clips share a frame (vLLM's multimodal and
   prefix caches would otherwise serve repeats for free).
2. Sampling. Per clip, what ``tasks.prepare`` does: ``probe_with_table`` once, then
   ``sample_video`` once per distinct sampling policy of ``scenarios.yaml``. CPU = user + sys
   of this process and every child it waited for (ffprobe, ffmpeg's first-frame check, the
   decode workers), per clip.
3. ``--workers N``: the same sampling over all clips by N processes at once (the CPU
   worker's concurrency), timed by the wall clock: clips per hour per N cores, measured.

Writes ``DIR/manifest.json``: per clip and scenario the JPEG paths and timestamps (what the
GPU worker's requests carry), the per-clip CPU-seconds, and the machine it ran on.
``bench_engine.py --videos DIR/manifest.json`` turns them into requests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

def make_clip(out: Path, seconds: float, seed: int) -> None:
    """PyAV (the product's first decoder) encodes with its bundled libx264, so a machine
    with nothing but the wheels (the lent GPU host) makes its own clips."""
    import av

    src = av.open(f"testsrc2=size=1920x1080:rate=30,noise=alls=10:allf=t+u:all_seed={seed}", format="lavfi")
    with av.open(str(out), "w") as dst:
        st = dst.add_stream("libx264", rate=30)
        st.width, st.height, st.pix_fmt = 1920, 1080, "yuv420p"
        st.bit_rate = 12_000_000
        st.options = {"preset": "veryfast", "profile": "high", "g": "30", "bf": "0",
                      "maxrate": "15M", "bufsize": "24M", "threads": "2"}
        for k, frame in enumerate(src.decode(video=0)):
            if k >= round(seconds * 30):
                break
            frame = frame.reformat(format="yuv420p")
            frame.pts = None
            for packet in st.encode(frame):
                dst.mux(packet)
        for packet in st.encode():
            dst.mux(packet)
    src.close()


def policies() -> dict[str, tuple[object, list[str]]]:
    """Distinct sampling policy key -> (policy, scenario names), as tasks.prepare groups them."""
    from vidlora.config import get_settings
    from vidlora.media.sampling import SamplingPolicy
    from vidlora.scenarios import load_scenarios

    s = get_settings()
    out: dict[str, tuple[object, list[str]]] = {}
    for spec in load_scenarios(s.scenarios_file, s.adapter_root):
        p = SamplingPolicy.from_dict(spec.sampling)
        out.setdefault(p.key(), (p, []))[1].append(spec.name)
    return out


def sample_clip(clip: str, frames_root: str, todo: dict[str, tuple[object, list[str]]]) -> dict:
    """One clip through the prepare path for every policy in ``todo`` (``policies()``); its
    CPU-seconds (this process and its children)."""
    from bench.sampling import cpu_now
    from vidlora.config import get_settings
    from vidlora.media.frames import FrameReuse, sample_video
    from vidlora.media.probe import probe_with_table

    s = get_settings()
    path = Path(clip)
    c0, w0 = cpu_now(), time.perf_counter()
    info, table = probe_with_table(path, s)
    frames: dict[str, dict] = {}
    reuse = FrameReuse()  # as tasks.prepare: a policy asking for frames already decoded copies them
    for policy, names in todo.values():
        out_dir = Path(frames_root) / path.stem / policy.key_hash()
        got = sample_video(path, policy, out_dir, info=info, settings=s, table=table, reuse=reuse)
        for name in names:
            frames[name] = {"files": [str(p) for p in got.paths(out_dir.parent)],
                            "timestamps": got.timestamps, "width": got.width, "height": got.height,
                            "backend": got.backend}
    return {"clip": path.name, "seconds": info.duration_s, "cpu_s": round(cpu_now() - c0, 3),
            "wall_s": round(time.perf_counter() - w0, 3), "frames": frames}


def _write(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")  # a reader (bench_engine waits for it) never sees half a file
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--clips", type=int, default=24)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=0, help="sample all clips again by N processes at once")
    ap.add_argument("--parallel-only", action="store_true",
                    help="only the --workers run, on the clips and manifest an earlier run made")
    ap.add_argument("--make-jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    a = ap.parse_args(argv)

    import av

    from vidlora.media.decoders import default_threads
    from vidlora.media.ffprobe import FFPROBE

    out = Path(a.out)
    manifest = out / "manifest.json"
    pol = policies()  # tasks.prepare reads them from the database: not a clip's cost
    if a.parallel_only:
        result = json.loads(manifest.read_text())
        clips = [out / "clips" / r["clip"] for r in result["clips"]]
    else:
        (out / "clips").mkdir(parents=True, exist_ok=True)
        clips = [out / "clips" / f"clip{k:03d}.mp4" for k in range(a.clips)]
        t0 = time.perf_counter()
        with ProcessPoolExecutor(a.make_jobs) as pool:
            list(pool.map(make_clip, clips, [a.seconds] * len(clips), range(1, len(clips) + 1)))
        print(f"[videos] {len(clips)} clips of {a.seconds:g} s made in {time.perf_counter() - t0:.1f} s", flush=True)
        rows = [sample_clip(str(c), str(out / "frames"), pol) for c in clips]
        cpu = [r["cpu_s"] for r in rows]
        result = {
            "command": "python -m bench.gpu.videos " + " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                        "decode_threads": default_threads(), "pyav": av.__version__,
                        "ffprobe": Path(FFPROBE).name},
            "clip": {"seconds": a.seconds, "size": "1920x1080", "fps": 30, "codec": "h264 high, 12 Mb/s, GOP 30",
                     "mb": round(statistics.mean(c.stat().st_size for c in clips) / 1e6, 1)},
            "policies": {k: names for k, (_, names) in pol.items()},
            "cpu_s_per_clip": {"mean": round(statistics.mean(cpu), 3), "median": round(statistics.median(cpu), 3),
                               "max": round(max(cpu), 3)},
            "wall_s_per_clip_sequential": round(statistics.mean(r["wall_s"] for r in rows), 3),
            "clips": rows,
        }
        print(f"[videos] sequential: {result['cpu_s_per_clip']} CPU-s per clip ({len(pol)} sampling "
              f"policies for {sum(len(n) for n in result['policies'].values())} scenarios)", flush=True)
        _write(manifest, result)
    if a.workers:
        t0 = time.perf_counter()
        with ProcessPoolExecutor(a.workers) as pool:
            par = list(pool.map(sample_clip, [str(c) for c in clips], [str(out / "frames-par")] * len(clips),
                                [pol] * len(clips)))
        wall = time.perf_counter() - t0
        result["parallel"] = {"workers": a.workers, "clips": len(clips), "wall_s": round(wall, 2),
                              "clips_per_hour": round(len(clips) / wall * 3600),
                              "cpu_s_per_clip_mean": round(statistics.mean(r["cpu_s"] for r in par), 3),
                              # in order: each process's first clip also starts its decode server
                              "cpu_s_per_clip": [r["cpu_s"] for r in par]}
        print(f"[videos] {a.workers} workers: {result['parallel']}", flush=True)
        _write(manifest, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
