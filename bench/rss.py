"""Worker memory over a long run: does a GPU worker or a CPU worker grow with work done?

Issue 8 (CPU part). Real ``vidlora worker cpu`` and ``vidlora worker gpu`` processes on the
tiny model take ``--videos`` distinct tiny clips (one scenario each, the three scenarios in
turn, so the GPU worker also switches adapters), i.e. as many sampled videos and as many
analyses. Every ``--every`` finished items the resident set size (VmRSS from /proc) of each
worker process is recorded: the GPU worker (one process: Celery solo pool + engine), and the
CPU worker's main process and each prefork child (the children do the decoding; Celery does
not recycle them here, so a leak would show).

Growth is measured from the first sample (after ``--every`` items: imports, caches and
the engine's first batches are warm by then) to the largest later sample; flat = within 10%.

Dispatch: ``prepare_video`` sends ``dispatch_ready`` to the cpu queue, behind every ingest and
prepare message of a bulk submission, so with 1,000 videos queued the GPU worker would idle
until the CPU backlog drains. This benchmark therefore also runs ``dispatch_ready`` in its own
process every few seconds (``--no-kick-dispatch`` turns that off), so both workers work at
once.

A private scenarios file keeps each item cheap (2 frames of at most 64x64, 4 output
tokens): the question is memory per item, not speed. Services: local PostgreSQL (fresh
database) and Redis (``--redis-db``, flushed), as in bench/pipeline.py.

    .venv/bin/python bench/rss.py --videos 1000 --every 50 --max-minutes 75 --sequential \
        --out bench/results/rss_cpu
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.pipeline import Services, machine  # noqa: E402

ADAPTERS = ["artifact_identification", "tomb_structure", "murals_inscriptions"]
SCENARIOS_YAML = """\
# bench/rss.py: the cheapest real analysis per item (2 small frames, 4 tokens).
scenarios:
{entries}
"""
ENTRY = """\
  - name: rss_{adapter}
    title: RSS probe ({adapter})
    description: Memory benchmark scenario.
    adapter: {adapter}
    system: You are a terse assistant.
    prompt: Describe the video.
    sampling: {{mode: uniform, num_frames: 2, max_pixels: 4096}}
    generation: {{max_tokens: 4, temperature: 0.0, seed: 0}}
"""


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return sorted(int(p) for p in out.split())


def tiny_clips(out_dir: Path, count: int) -> list[Path]:
    """One 1 s 64x64 h264 clip, remuxed ``count`` times with a tag: distinct content hashes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    base = out_dir / "base.mp4"
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=size=64x64:rate=10",
                    "-t", "1", "-an", "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p",
                    str(base)], check=True, timeout=60)
    paths = []
    for i in range(count):
        dest = out_dir / f"clip-{i:05d}.mp4"
        subprocess.run(["ffmpeg", "-v", "error", "-y", "-i", str(base), "-c", "copy",
                        "-metadata", f"comment=rss-{i}", str(dest)], check=True, timeout=60)
        paths.append(dest)
    base.unlink()
    return paths


def progress() -> tuple[int, int]:
    """(videos sampled, analyses finished) so far."""
    from sqlalchemy import func, select

    from vidlora.db import session_scope
    from vidlora.models import Analysis, FrameSet

    with session_scope() as session:
        sampled = session.scalar(select(func.count(FrameSet.id)).where(FrameSet.status == "done")) or 0
        finished = session.scalar(
            select(func.count(Analysis.id)).where(Analysis.status.in_(("done", "failed", "rejected")))) or 0
        return sampled, finished


def growth(curve: list[dict[str, Any]], key: str) -> dict[str, Any]:
    values = [p[key] for p in curve if p.get(key)]
    if not values:
        return {}
    first = values[0]
    mid = values[len(values) // 2]
    return {"first_kib": first, "middle_kib": mid, "last_kib": values[-1], "max_kib": max(values),
            "max_growth_pct": round(100 * (max(values) - first) / first, 2),
            "last_growth_pct": round(100 * (values[-1] - first) / first, 2), "samples": len(values)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", type=int, default=1000, help="videos = analyses")
    parser.add_argument("--every", type=int, default=50, help="sample RSS every N finished items")
    parser.add_argument("--cpu-concurrency", type=int, default=2)
    parser.add_argument("--max-minutes", type=float, default=15.0,
                        help="stop feeding results after this long (report what was reached)")
    parser.add_argument("--redis-db", type=int, default=13)
    parser.add_argument("--no-kick-dispatch", action="store_true",
                        help="leave dispatch to the dispatch_ready messages alone (see module docstring)")
    parser.add_argument("--sequential", action="store_true",
                        help="freeze the GPU worker (SIGSTOP) until every video is sampled, then let it "
                             "analyse: on 2 shared cores the two workers otherwise starve each other")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "rss_cpu")
    args = parser.parse_args(argv)

    import tempfile

    yaml_dir = Path(tempfile.mkdtemp(prefix="vidlora-rss-scenarios-"))
    scen_file = yaml_dir / "scenarios.yaml"
    scen_file.write_text(SCENARIOS_YAML.format(entries="".join(ENTRY.format(adapter=a) for a in ADAPTERS)))
    results: dict[str, Any] = {
        "command": ".venv/bin/python bench/rss.py " + " ".join(argv),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
        "videos_requested": args.videos, "every": args.every, "redis_db": args.redis_db,
        "cpu_concurrency": args.cpu_concurrency, "kick_dispatch": not args.no_kick_dispatch,
        "sequential": args.sequential,
    }
    with Services("rss", args.redis_db, extra_env={"VIDLORA_SCENARIOS_FILE": str(scen_file)}) as svc:
        from tasks.submit import submit_paths

        t0 = time.perf_counter()
        clips = tiny_clips(svc.run_dir / "clips", args.videos)
        results["clip_generation_s"] = round(time.perf_counter() - t0, 1)
        cpu = svc.start_worker("cpu", "--concurrency", str(args.cpu_concurrency))
        gpu = svc.start_worker("gpu", env={"VIDLORA_WORKER_NAME": "rss-gpu-0"})
        cpu.wait_ready(900)
        gpu.wait_ready(900)
        cpu_children0 = children(cpu.proc.pid)
        results["rss_at_ready_kib"] = {"gpu": rss_kib(gpu.proc.pid), "cpu_main": rss_kib(cpu.proc.pid),
                                       "cpu_children": [rss_kib(p) for p in cpu_children0]}

        gpu_frozen = args.sequential
        if gpu_frozen:
            os.killpg(gpu.proc.pid, signal.SIGSTOP)
        # One scenario per video, the three in turn (three batches, interleaved submission).
        t_start = time.perf_counter()
        thirds = [clips[i::3] for i in range(3)]
        batch_ids = [submit_paths(part, [f"rss_{a}"], f"rss {a}")[0] for part, a in zip(thirds, ADAPTERS)]
        results["batches"] = batch_ids

        cpu_curve: list[dict[str, Any]] = []
        gpu_curve: list[dict[str, Any]] = []
        next_cpu, next_gpu = args.every, args.every
        deadline = t_start + 60 * args.max_minutes
        sampled = finished = 0
        seen_children = set(cpu_children0)
        from tasks.dispatch import dispatch_ready

        last_kick = 0.0
        while time.perf_counter() < deadline:
            sampled, finished = progress()
            now = round(time.perf_counter() - t_start, 1)
            if sampled >= next_cpu:
                kids = children(cpu.proc.pid)
                seen_children.update(kids)
                kid_rss = [rss_kib(p) or 0 for p in kids]
                cpu_curve.append({"videos": sampled, "t_s": now, "main_kib": rss_kib(cpu.proc.pid),
                                  "children_kib": kid_rss, "children_max_kib": max(kid_rss, default=0),
                                  "total_kib": (rss_kib(cpu.proc.pid) or 0) + sum(kid_rss), "children": kids})
                next_cpu = (sampled // args.every + 1) * args.every
            if finished >= next_gpu:
                gpu_curve.append({"analyses": finished, "t_s": now, "rss_kib": rss_kib(gpu.proc.pid)})
                next_gpu = (finished // args.every + 1) * args.every
            if finished >= args.videos and sampled >= args.videos:
                break
            if gpu_frozen and sampled >= args.videos:
                results["cpu_phase_s"] = now
                os.killpg(gpu.proc.pid, signal.SIGCONT)
                gpu_frozen = False
            if not gpu_frozen and not args.no_kick_dispatch and time.perf_counter() - last_kick > 3:
                dispatch_ready.apply()  # runs here; sends analyze_batch messages to the gpu queue
                last_kick = time.perf_counter()
            if cpu.proc.poll() is not None or gpu.proc.poll() is not None:
                raise RuntimeError("a worker exited during the run")
            time.sleep(0.5)
        if gpu_frozen:  # stopped at the time cap: a frozen worker cannot act on SIGTERM
            os.killpg(gpu.proc.pid, signal.SIGCONT)
        wall = time.perf_counter() - t_start
        results.update({
            "wall_s": round(wall, 1), "videos_sampled": sampled, "analyses_finished": finished,
            "completed": finished >= args.videos and sampled >= args.videos,
            "cpu_children_seen": sorted(seen_children), "cpu_children_replaced": sorted(seen_children) != cpu_children0,
            "cpu_curve": cpu_curve, "gpu_curve": gpu_curve,
            "cpu_growth": {"main": growth(cpu_curve, "main_kib"), "children_max": growth(cpu_curve, "children_max_kib"),
                           "total": growth(cpu_curve, "total_kib")},
            "gpu_growth": growth(gpu_curve, "rss_kib"),
        })
        from sqlalchemy import func, select

        from vidlora.db import session_scope
        from vidlora.models import Analysis

        with session_scope() as session:
            results["analysis_statuses"] = dict(session.execute(
                select(Analysis.status, func.count()).group_by(Analysis.status)).all())
    flat = [results["gpu_growth"].get("max_growth_pct"), results["cpu_growth"]["total"].get("max_growth_pct"),
            results["cpu_growth"]["children_max"].get("max_growth_pct")]
    results["flat_within_10pct"] = all(g is not None and g <= 10 for g in flat)
    results["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2))
    write_markdown(results, args.out.with_suffix(".md"))
    print(args.out.with_suffix(".md").read_text())
    return 0


def _mib(kib: int | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.1f}"


def write_markdown(r: dict[str, Any], path: Path) -> None:
    g, c = r["gpu_growth"], r["cpu_growth"]
    lines = [
        "# Worker RSS over a long run (CPU machine, tiny model)",
        "",
        f"Command: `{r['command']}`",
        "",
        f"Machine: {r['machine']['cpus']} CPUs shared with other jobs, vLLM {r['machine']['vllm']} (CPU build). "
        f"Services: local PostgreSQL (fresh database), Redis db {r['redis_db']}. Real `vidlora worker cpu "
        f"--concurrency {r['cpu_concurrency']}` and `vidlora worker gpu` (engine in-process). Items: distinct "
        "1 s 64x64 h264 clips, one scenario each (the three adapters in turn), scenarios with 2 frames of "
        "at most 64x64 and 4 output tokens. RSS = VmRSS from /proc, sampled every "
        f"{r['every']} finished items; growth = (largest later sample - first sample) / first sample. "
        + ("The benchmark ran `dispatch_ready` itself every 3 s (dispatch messages otherwise wait behind "
           "the whole ingest backlog on the cpu queue)." if r.get("kick_dispatch") else "")
        + (f" Sequential: the GPU worker was frozen (SIGSTOP) until all videos were sampled "
           f"({r.get('cpu_phase_s', '?')} s), then analysed them; each process is measured without the "
           "other competing for the 2 cores." if r.get("sequential") else ""),
        "",
        f"Reached: **{r['videos_sampled']} sampled videos, {r['analyses_finished']} finished analyses** of "
        f"{r['videos_requested']} requested in {r['wall_s']} s"
        + ("" if r["completed"] else " (stopped at the time cap; to run all: the command above with "
                                     "`--max-minutes 60`)") + f". Statuses: {r['analysis_statuses']}.",
        "",
        "| process | first MiB | middle MiB | last MiB | max MiB | max growth % | last growth % | samples |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, row in (("GPU worker (solo pool + engine)", g), ("CPU worker main", c["main"]),
                       ("CPU worker largest child", c["children_max"]), ("CPU worker total", c["total"])):
        if row:
            lines.append(f"| {label} | {_mib(row['first_kib'])} | {_mib(row['middle_kib'])} | {_mib(row['last_kib'])} | "
                         f"{_mib(row['max_kib'])} | {row['max_growth_pct']} | {row['last_growth_pct']} | {row['samples']} |")
    lines += [
        "",
        f"Flat within 10%: **{'yes' if r['flat_within_10pct'] else 'NO'}**. CPU pool children replaced during the "
        f"run: {r['cpu_children_replaced']}. RSS when the workers became ready: GPU "
        f"{_mib(r['rss_at_ready_kib']['gpu'])} MiB, CPU main {_mib(r['rss_at_ready_kib']['cpu_main'])} MiB, "
        f"children {[_mib(k) for k in r['rss_at_ready_kib']['cpu_children']]} MiB.",
        "",
        "Curve (every sample is in rss_cpu.json):",
        "",
        "| analyses | GPU MiB | | videos | CPU total MiB | CPU largest child MiB |",
        "|---|---|---|---|---|---|",
    ]
    gc, cc = r["gpu_curve"], r["cpu_curve"]
    for k in range(max(len(gc), len(cc))):
        gp = gc[k] if k < len(gc) else {}
        cp = cc[k] if k < len(cc) else {}
        lines.append(f"| {gp.get('analyses', '')} | {_mib(gp.get('rss_kib')) if gp else ''} | | {cp.get('videos', '')} | "
                     f"{_mib(cp.get('total_kib')) if cp else ''} | {_mib(cp.get('children_max_kib')) if cp else ''} |")
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
