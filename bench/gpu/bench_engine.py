"""Throughput, memory and adapter-swap measurements on one vLLM engine (issue 8).

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python -m bench.gpu.bench_engine \
        --assets /dev/shm/vl --label graphs_patch --patch on --json out.json \
        --phases warmup,bare_nolora,bare_one,bare_mixed3,host_mixed3,host_grouped3,...

One engine (built through vidlora's ``EngineHost``, so the worker's own engine arguments
are what is measured) serves every phase: no LoRA, one adapter, three adapters mixed, three
grouped by ``vidlora.engine_batches.group_by_adapter``, ``EngineHost.generate`` against a bare
``llm.generate`` of the same requests, prefill-only batches for MFU, a torch.profiler
kernel table, and 20 adapters resident with the swap-in cost. The engine runs in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the profiler sees its kernels and the
LoRA manager can be read; both sides of every comparison run the same way.

Requests are text-only stand-ins for the video requests (~2,000 prompt tokens, 128 output
tokens, ``ignore_eos`` so every request decodes exactly 128): the vision tower is not
LoRA-adapted and its cost is not what these ratios are about. With ``--videos`` (a
``bench.gpu.videos`` manifest) the ``videos*`` phases send real video requests instead: every
clip x every shipped scenario, the frames vidlora's sampler made, through the dispatcher's
grouping and ``EngineHost.generate``: videos per hour. Each phase writes its row into the JSON
at once, so a run cut short still leaves what it measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import threading
import time
import traceback
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PEAK_BF16 = 790e12  # measured on this workplace's H200 (8192^3 bf16 matmul, random data)
WORDS = ("You are a careful archaeologist. Describe the video. Identify the artifact, its "
         "material, period and condition. Describe the tomb structure: chambers, corridors, "
         "vaults, walls, doors. Read the murals and inscriptions; transcribe visible text; note "
         "pigments and damage. The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 "
         "10 seconds frame video image scene camera light stone bronze jade pottery ceramic "
         "gold silver wood painting summary objects confidence notes").split()


# -- model arithmetic --------------------------------------------------------------------------

def flops_per_prompt(cfg: dict, n: int) -> float:
    """Forward FLOPs of one n-token prefill: 2 x (matmul weights) x n + attention scores,
    + the GDN chunked recurrence (approx.) + one lm_head row (vLLM computes logits for the
    last prompt token only). LoRA FLOPs are not counted (model FLOPs utilisation)."""
    t = cfg["text_config"]
    h, i, L = t["hidden_size"], t["intermediate_size"], t["num_hidden_layers"]
    nq, nkv, hd = t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
    nk, nv, kd, vd = (t["linear_num_key_heads"], t["linear_num_value_heads"],
                      t["linear_key_head_dim"], t["linear_value_head_dim"])
    n_full = sum(1 for x in t["layer_types"] if x == "full_attention")
    n_lin = L - n_full
    mlp = 3 * h * i
    attn = h * (nq * hd * 2) + 2 * h * nkv * hd + nq * hd * h
    gdn = h * (2 * nk * kd + 2 * nv * vd) + 2 * h * nv + nv * vd * h
    dense = 2 * n * (L * mlp + n_full * attn + n_lin * gdn)
    # causal attention: QK^T and PV, n^2/2 pairs each, per head
    scores = n_full * 2 * 2 * nq * hd * n * n / 2
    # GDN (chunk 64): per token ~ 4 * nv * kd * vd (state update + read) + intra-chunk 64-wide
    rec = n_lin * n * nv * (4 * kd * vd + 2 * 64 * (kd + vd))
    head = 2 * h * t["vocab_size"]
    return dense + scores + rec + head


# -- requests ----------------------------------------------------------------------------------

def make_prompt_text(tok, n_tokens: int, seed: int) -> str:
    rnd = random.Random(seed)
    words = [rnd.choice(WORDS) for _ in range(n_tokens * 2)]
    ids = tok.encode(" ".join(words), add_special_tokens=False)[:n_tokens]
    return tok.decode(ids)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.assets = Path(args.assets)
        self.results: dict[str, Any] = {"label": args.label, "patch": args.patch,
                                        "eager": args.eager, "schemas": args.schemas, "phases": {}, "errors": {},
                                        "started": time.time()}
        self.cfg = json.loads((self.assets / "model" / "config.json").read_text())
        self.deadline = float(args.deadline) if args.deadline else None
        self.video_dims: dict[str, tuple[int, int, int]] = {}  # request key -> frames, w, h
        self.clips_used = 0  # each video phase takes clips no earlier phase saw (no cache hits)

    # -- bookkeeping ----------------------------------------------------------------------
    def save(self) -> None:
        Path(self.args.json).write_text(json.dumps(self.results, indent=2, default=str) + "\n")

    def time_left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.time()

    def log(self, msg: str) -> None:
        print(f"[bench {self.args.label} {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    # -- engine ---------------------------------------------------------------------------
    def start(self) -> None:
        import workers.engine_host as eh
        from vidlora.config import Settings

        a = self.args
        if a.patch == "on":
            import engine_patch

            self.results["engine_patch_applied"] = engine_patch.apply()
            from engine_patch.env import versions

            self.results["versions"] = versions()
        # The carried build lacks FlashInfer: the GDN prefill must use the Triton kernels.
        extra = json.loads(a.llm_kwargs) if a.llm_kwargs else {}

        class BenchHost(eh.EngineHost):
            def _judge_adapter(self, lora):
                # Dummy weights: a noise model's logprobs barely move under a small adapter and
                # its greedy text repeats, so the effect check and the canary cannot judge here.
                # Everything else (host checks, vLLM's own load, the slot mirror) is the worker's.
                return {"bench": "device checks skipped: dummy weights"}, None

            def engine_kwargs(self) -> dict[str, Any]:
                kw = super().engine_kwargs()
                # Text-only stand-ins, unless a videos manifest brings real frames.
                kw["limit_mm_per_prompt"] = {"video": 1 if a.videos else 0, "image": 0}
                kw["load_format"] = "dummy"
                kw.update(extra)
                return kw

        if a.patch != "on":
            eh.apply_engine_patch = lambda: "off (bench)"
        # Every request decodes exactly out_len tokens (dummy weights may emit EOS early);
        # the same SamplingParams go to the bare llm.generate path.
        self._orig_sp = eh.sampling_params

        def sampling_params(req):
            sp = self._orig_sp(req)
            # A schema's grammar ends the answer itself (as in the worker); the answers of a
            # dummy-weight model under it run long (random strings) in every phase alike.
            sp.ignore_eos = req.output_schema is None
            return sp

        eh.sampling_params = sampling_params
        self.sampling_params = sampling_params
        settings = Settings(
            model=str(self.assets / "model"), max_loras=a.max_loras, max_cpu_loras=a.max_cpu_loras,
            max_lora_rank=a.max_lora_rank, max_model_len=a.max_model_len, max_num_seqs=a.max_num_seqs,
            gpu_memory_utilization=a.gpu_mem, enforce_eager=a.eager, served_model_name="",
            kv_cache_memory_bytes=a.kv_bytes or None, adapter_root=str(self.assets / "adapters"),
            quantization=a.quantization, kv_cache_dtype=a.kv_cache_dtype, gdn_state_dtype=a.gdn_state_dtype)
        self.host = BenchHost(settings)
        self.results["engine_kwargs"] = self.host.engine_kwargs()
        t0 = time.perf_counter()
        self.host.start()
        self.results["engine_start_s"] = round(time.perf_counter() - t0, 1)
        self.llm = self.host.llm
        self.tok = self.host.tokenizer
        self.results["engine_patch_status"] = self.host.patch_status
        self.results["memory"] = self.memory_facts()
        layout = self.host.engine_memory()
        self.results["cache_layout"] = None if layout is None else {
            "num_blocks": layout.num_blocks, "block_bytes": layout.block_bytes,
            "groups": [f"{g.kind}:{g.layers}x{g.block_tokens}" for g in layout.groups]}
        if hasattr(self.host, "last_canary"):
            self.results["start_canary"] = self.host.last_canary()
        self.save()
        self.log(f"engine up in {self.results['engine_start_s']}s")

    def _runner(self):
        core = self.llm.llm_engine.engine_core
        core = getattr(core, "engine_core", core)
        w = core.model_executor.driver_worker
        w = getattr(w, "worker", w)
        return w.model_runner

    def memory_facts(self) -> dict[str, Any]:
        import torch

        facts: dict[str, Any] = {}
        try:
            free, total = torch.cuda.mem_get_info()
            facts.update(gpu_free_gib=free / 2**30, gpu_total_gib=total / 2**30,
                         torch_allocated_gib=torch.cuda.memory_allocated() / 2**30,
                         torch_reserved_gib=torch.cuda.memory_reserved() / 2**30)
        except Exception as exc:  # noqa: BLE001 - CPU check runs
            facts["gpu"] = repr(exc)
        try:
            vc = self.llm.llm_engine.vllm_config
            facts["num_gpu_blocks"] = vc.cache_config.num_gpu_blocks
            facts["block_size"] = vc.cache_config.block_size
            facts["enable_prefix_caching"] = vc.cache_config.enable_prefix_caching
            facts["max_num_batched_tokens"] = vc.scheduler_config.max_num_batched_tokens
            facts["cudagraph_mode"] = str(getattr(vc.compilation_config, "cudagraph_mode", None))
            facts["cudagraph_capture_sizes"] = getattr(vc.compilation_config, "cudagraph_capture_sizes", None)
        except Exception as exc:  # noqa: BLE001
            facts["config"] = repr(exc)
        try:
            runner = self._runner()
            model = runner.model
            facts["weight_gib"] = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
            lora_bytes = 0
            seen = set()
            for mod in model.modules():
                for attr in ("lora_a_stacked", "lora_b_stacked"):
                    for t in _flatten(getattr(mod, attr, None)):
                        if t.data_ptr() not in seen:
                            seen.add(t.data_ptr())
                            lora_bytes += t.numel() * t.element_size()
            facts["lora_slot_gib_total"] = lora_bytes / 2**30
            facts["lora_slot_gib_per_adapter"] = lora_bytes / 2**30 / self.args.max_loras
            kv = 0
            seen = set()
            for t in _flatten(getattr(runner, "kv_caches", [])):
                if t.data_ptr() not in seen:
                    seen.add(t.data_ptr())
                    kv += t.numel() * t.element_size()
            facts["kv_and_state_cache_gib"] = kv / 2**30
        except Exception as exc:  # noqa: BLE001
            facts["runner"] = repr(exc)
        return facts

    # -- requests -------------------------------------------------------------------------
    def requests(self, n: int, adapters: list[str | None], tag: str, prompt_len: int | None = None,
                 out_len: int | None = None) -> list:
        from vidlora.engine_io import AnalysisRequest

        a = self.args
        plen = prompt_len or a.prompt_len
        reqs = []
        for k in range(n):
            ad = adapters[k % len(adapters)]
            reqs.append(AnalysisRequest(
                request_key=f"{tag}-{k}", prompt=make_prompt_text(self.tok, plen, hash((tag, k)) & 0xFFFFFF),
                system=None, frames=[], timestamps=[], adapter_name=ad,
                adapter_path=str(self.assets / "adapters" / ad) if ad else None,
                # Sampled, not greedy: a dummy-weight model's greedy output repeats one token,
                # which the worker's guard rightly calls degenerate (and would re-run).
                max_tokens=out_len or a.out_len, temperature=1.0, top_p=1.0, seed=None))
        return reqs

    def bare_inputs(self, reqs: list):
        from vidlora.engine_io import build_input

        inputs = [build_input(self.tok, r) for r in reqs]
        params = [self.sampling_params(r) for r in reqs]
        loras = [self.host.lora_request(r.adapter_name, str(Path(r.adapter_path).resolve()))
                 if r.adapter_name else None for r in reqs]
        return inputs, params, loras

    # -- measurement primitives ------------------------------------------------------------
    def _row(self, outs_tokens: list[tuple[int, int, bool]], seconds: float, n_batches: int,
             flops: float | None = None) -> dict[str, Any]:
        p = sum(x[0] for x in outs_tokens)
        o = sum(x[1] for x in outs_tokens)
        row = {"requests": len(outs_tokens), "batches": n_batches, "seconds": round(seconds, 3),
               "prompt_tokens": p, "output_tokens": o,
               "output_tok_s": round(o / seconds, 1), "total_tok_s": round((p + o) / seconds, 1),
               "req_s": round(len(outs_tokens) / seconds, 3),
               "nonfinite_requests": sum(1 for x in outs_tokens if not x[2])}
        if flops:
            row["tflops"] = round(flops / seconds / 1e12, 1)
            row["mfu"] = round(flops / seconds / PEAK_BF16, 4)
        return row

    def run_bare(self, batches: list[list]) -> dict[str, Any]:
        import torch

        prepared = [self.bare_inputs(b) for b in batches]
        _sync(torch)
        t0 = time.perf_counter()
        stats = []
        for inputs, params, loras in prepared:
            outs = self.llm.generate(inputs, params, lora_request=loras, use_tqdm=False)
            for o in outs:
                c = o.outputs[0]
                finite = c.cumulative_logprob is None or math.isfinite(c.cumulative_logprob)
                stats.append((len(o.prompt_token_ids or []), len(c.token_ids), finite))
        _sync(torch)
        return self._row(stats, time.perf_counter() - t0, len(batches))

    def run_host(self, batches: list[list]) -> dict[str, Any]:
        import torch

        _sync(torch)
        t0 = time.perf_counter()
        stats = []
        for b in batches:
            for o in self.host.generate(b):
                if o.error:
                    raise RuntimeError(f"host request failed: {o.error}")
                stats.append((o.prompt_tokens, o.output_tokens,
                              bool(o.health["checks"].get("logprobs_finite", True))))
        _sync(torch)
        row = self._row(stats, time.perf_counter() - t0, len(batches))
        guard = getattr(self.host, "guard", None)
        if guard is not None:  # any guard re-run would be in the time: say so
            row["guard_events"] = [e.get("event") for e in list(guard.events)]
        return row

    # -- phases ---------------------------------------------------------------------------
    def adapters3(self) -> list[str]:
        return ["a00", "a01", "a02"]

    def dispatcher_batches(self, reqs: list) -> list[list]:
        """Split like tasks.dispatch does: group_by_adapter with the worker's settings."""
        from vidlora.engine_batches import ReadyAnalysis, group_by_adapter

        t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
        by_key = {r.request_key: r for r in reqs}
        # A text stand-in counts as a video of 16 frames at 448x512 (8 x 224 = 1,792 tokens);
        # a real video request as its sampled frames.
        dims = [self.video_dims.get(r.request_key, (16, 448, 512)) for r in reqs]
        ready = [ReadyAnalysis(id=k, adapter=r.adapter_name or "-", frames=d[0], width=d[1],
                               height=d[2], max_tokens=r.max_tokens,
                               ready_since=t0 + timedelta(seconds=k))
                 for k, (r, d) in enumerate(zip(reqs, dims))]
        ids = {k: r.request_key for k, r in enumerate(reqs)}
        groups = group_by_adapter(ready, self.args.batch_max_requests, self.args.batch_max_tokens)
        out = []
        for _, batches in groups.items():
            for b in batches:
                out.append([by_key[ids[item.id]] for item in b])
        return out

    def run_stream(self, reqs: list, capacity: int, profile_steps: int = 0, profile_tag: str = "stream",
                   host_profile_steps: int = 0) -> dict[str, Any]:
        """The streaming GPU worker's engine loop (workers.engine_stream.EngineStream, what
        tasks.gpu_stream drives): everything offered at once, admitted as the engine has room
        (at most ``capacity`` in flight, adapter-aware), each output judged as it finishes.
        The scheduler's own output is traced per step (``bench.gpu.step_trace``): mixed and
        decode-only steps apart. ``profile_steps``: torch.profiler over that many steps from the
        step the engine is full (a separate phase: the profiler slows what it watches).
        ``host_profile_steps``: a cProfile window of the engine thread over that many steps
        from the step the engine is full (``bench.gpu.host_profile``: whose host time)."""
        import torch

        from bench.gpu.host_profile import HostProfile
        from bench.gpu.step_trace import StepTrace, classify
        from workers.engine_stream import EngineStream

        stats: list[tuple[int, int, bool]] = []
        errors: list[str] = []
        trace = StepTrace.attach(self.llm)

        def deliver(req, out, mates):
            if out.error:
                errors.append(out.error)
            stats.append((out.prompt_tokens, out.output_tokens,
                          bool((out.health or {}).get("checks", {}).get("logprobs_finite", True))))

        stream = EngineStream(self.host, deliver, capacity=capacity)
        prof, prof_t0, prof_left, window = None, 0.0, 0, None
        host_prof, host_t0, host_left, host_window, steps_seen = None, 0.0, 0, None, 0
        _sync(torch)
        t0 = time.perf_counter()
        # Offered from another thread, as the worker's Celery thread offers them (and prepares
        # them there: frames read, prompts rendered), while this thread steps the engine.
        offering = threading.Thread(target=stream.offer, args=(reqs,), name="offering")
        offering.start()
        peak = 0
        # Per engine step while the stream still has work to offer it: what the stream had
        # admitted, and what vLLM ran and kept waiting (issue 45: admitted must be what runs).
        load: list[tuple[int, int, int]] = []
        try:
            while len(stats) < len(reqs):
                if not stream.held():
                    stream.wait_for_work(0.01)  # the first offers are still being prepared
                if profile_steps and prof is None and window is None and len(stream._running) >= min(capacity, len(reqs)):
                    from torch.profiler import ProfilerActivity, profile

                    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
                    prof = profile(activities=acts)
                    prof.__enter__()
                    prof_t0, prof_left = time.perf_counter(), profile_steps
                # From the step the engine is (nearly) full, or the 30th step: a window always opens.
                if host_profile_steps and host_prof is None and host_window is None and (
                        len(stream._running) >= 0.9 * min(capacity, len(reqs)) or steps_seen >= 30):
                    host_prof, host_t0, host_left = HostProfile(), time.perf_counter(), host_profile_steps
                    host_prof.start()
                s0 = time.perf_counter()
                stream.step()
                steps_seen += 1
                if host_prof is not None:
                    host_left -= 1
                    if host_left <= 0 or len(stats) >= len(reqs):
                        host_window = host_prof.stop(time.perf_counter() - host_t0, host_profile_steps - host_left)
                        host_prof = None
                if trace is not None:
                    trace.step_done(time.perf_counter() - s0)
                peak = max(peak, len(stream._running))
                engine = self.host.engine_load()
                if engine is not None and stream._waiting:
                    load.append((len(stream._running), engine[0], engine[1]))
                if prof is not None:
                    prof_left -= 1
                    if prof_left <= 0:
                        _sync(torch)
                        wall = time.perf_counter() - prof_t0
                        prof.__exit__(None, None, None)
                        window = classify(prof, wall)
                        steps = trace.steps[-profile_steps:] if trace is not None else []
                        window["steps"] = [(round(s.seconds * 1e3, 1), s.prefill_tokens, s.decodes) for s in steps]
                        prof.export_chrome_trace(str(Path(self.args.json).with_name(
                            f"{self.args.label}_{profile_tag}_stream_trace.json")))
                        prof = None
        finally:
            offering.join()
            if trace is not None:
                trace.close()
            if prof is not None:  # the phase ended inside the window: keep what it saw
                _sync(torch)
                wall = time.perf_counter() - prof_t0
                prof.__exit__(None, None, None)
                window = classify(prof, wall)
                window["steps_profiled"] = profile_steps - prof_left
        _sync(torch)
        row = self._row(stats, time.perf_counter() - t0, 1)
        if load:
            row.update(admitted_in_flight=round(statistics.mean(x[0] for x in load), 1),
                       engine_running_mean=round(statistics.mean(x[1] for x in load), 1),
                       engine_waiting_mean=round(statistics.mean(x[2] for x in load), 1),
                       steady_steps=len(load))
        row.update(capacity=capacity, tokens_per_request=getattr(self, "tokens_per_request", None), peak_in_flight=peak, errors=len(errors), first_error=(errors or [None])[0],
                   guard_settled=stream.stats.settled,
                   mean_admission_wait_s=round(stream.stats.admission_wait_s / max(1, stream.stats.admitted), 3))
        if trace is not None:
            n = max(1, len(stats))
            prompt_fl = n * flops_per_prompt(self.cfg, int(row["prompt_tokens"] / n))
            row["steps"] = trace.summary(prompt_fl, PEAK_BF16)
        if window is not None:
            row["profile_window"] = window
        if host_prof is not None:  # the phase ended inside the window
            host_window = host_prof.stop(time.perf_counter() - host_t0, host_profile_steps - host_left)
        if host_window is not None:
            row["host_profile"] = host_window
        return row

    def _with_mfu(self, row: dict[str, Any]) -> dict[str, Any]:
        """Model FLOPs of every prompt and output token over the phase's time, as MFU."""
        n = max(1, row["requests"])
        per_req = (row["prompt_tokens"] + row["output_tokens"]) / n
        fl = n * flops_per_prompt(self.cfg, int(per_req))
        row["tflops"] = round(fl / row["seconds"] / 1e12, 1)
        row["mfu"] = round(fl / row["seconds"] / PEAK_BF16, 4)
        return row

    def phase(self, full_name: str) -> None:
        """``NAME`` or ``NAME@punica``: the same phase with engine_patch's dense LoRA path off,
        on this engine (issue 14's side-by-side), with each phase's LoRA path counts.
        ``NAME#PxOxN``: with P prompt tokens, O output tokens, N requests (issue 35's shapes)."""
        full_name, _, shape = full_name.partition("#")
        saved = (self.args.prompt_len, self.args.out_len, self.args.n_req)
        if shape:
            self.args.prompt_len, self.args.out_len, self.args.n_req = (int(x) for x in shape.split("x"))
        try:
            self._phase_at(full_name, f"{full_name}#{shape}" if shape else full_name)
        finally:
            self.args.prompt_len, self.args.out_len, self.args.n_req = saved

    def _phase_at(self, full_name: str, key: str) -> None:
        name, _, path = full_name.partition("@")
        if name.endswith("_noschema"):
            # Issue 55: the same phase without the scenarios' schemas on this engine, so schema
            # on vs off is compared at the same batch (the grammar defers vLLM's sampling).
            saved, self.args.schemas = self.args.schemas, False
            try:
                return self._phase_at(full_name.replace("_noschema", "", 1), key)
            finally:
                self.args.schemas = saved
        dense = _dense_lora()
        if dense is not None:
            dense.set_enabled(path != "punica")
            before = dense.counts()
        try:
            self._phase(name, key)
        finally:
            if dense is not None:
                dense.set_enabled(True)
                row = self.results["phases"].get(key)
                if isinstance(row, dict):
                    row["lora_path"] = {k: v - before[k] for k, v in dense.counts().items()}

    def _phase(self, name: str, full_name: str) -> None:
        a = self.args
        n = a.n_req
        A3 = self.adapters3()
        if name == "warmup":
            # Compiles the LoRA kernels for the prefill/decode shapes and loads a00-a02.
            reqs = self.requests(16, A3 + [None], "warm", out_len=16)
            row = self.run_bare([reqs])
        elif name == "bare_nolora":
            row = self.run_bare([self.requests(n, [None], "nolora")])
        elif name == "bare_nolora_repeat":
            row = self.run_bare([self.requests(n, [None], "nolora2")])
        elif name == "bare_one":
            row = self.run_bare([self.requests(n, ["a00"], "one")])
        elif name == "bare_mixed3":
            row = self.run_bare([self.requests(n, A3, "mixed")])
        elif name == "host_one":
            row = self.run_host([self.requests(n, ["a00"], "hone")])
        elif name == "bare_sorted3":
            reqs = sorted(self.requests(n, A3, "sorted"), key=lambda r: r.adapter_name)
            row = self.run_bare([reqs])
        elif name == "host_mixed3":
            row = self.run_host([self.requests(n, A3, "hmixed")])
        elif name == "host_grouped3":
            row = self.run_host(self.dispatcher_batches(self.requests(n, A3, "hgroup")))
        elif name == "bare_grouped3":
            row = self.run_bare(self.dispatcher_batches(self.requests(n, A3, "bgroup")))
        elif name == "videos_warm":  # the vision tower's and the video shapes' first use
            row = self.run_host(self.dispatcher_batches(self.video_requests(True, full_name, 2, 16)[0]))
        elif name in ("videos", "videos_nolora"):
            row = self.videos(adapters=name == "videos", tag=full_name)
        elif name.startswith("prefill_"):
            row = self.prefill(name)
        elif name == "profile":
            row = self.profile()
        elif name == "adapters20":
            row = self.adapters20()
        # Issue 35: the streaming worker's loop vs the bare engine, all requests offered at once.
        elif name in ("stream_nolora", "stream_one", "stream_mixed3", "streamprof_one", "streamprof_nolora"):
            ads = {"nolora": [None], "one": ["a00"], "mixed3": A3}[name.split("_", 1)[1]]
            prof = a.profile_steps if name.startswith("streamprof") else 0
            reqs = self.requests(n, ads, full_name)
            row = self._with_mfu(self.run_stream(reqs, self.stream_capacity(reqs), profile_steps=prof,
                                                 profile_tag=name))
        elif name in ("all_nolora", "all_one", "all_mixed3"):  # bare llm.generate, everything at once
            ads = {"all_nolora": [None], "all_one": ["a00"], "all_mixed3": A3}[name]
            row = self._with_mfu(self.run_bare([self.requests(n, ads, full_name)]))
        # Issue 35 with video inputs: clips x shipped scenarios (frames as sampled, the scenarios'
        # prompts; scenario k on adapter a0k, or none), streamed or given to llm.generate at once.
        elif name in ("stream_videos", "stream_videos_nolora", "all_videos", "all_videos_nolora"):
            row = self.videos_at_once(stream=name.startswith("stream"), adapters=not name.endswith("nolora"),
                                      tag=full_name)
        # Issue 55: the same, with a cProfile window of the engine thread (its own phase: the
        # profiler slows the Python it watches).
        elif name in ("hostprof_videos", "hostprof_videos_nolora"):
            row = self.videos_at_once(stream=True, adapters=not name.endswith("nolora"), tag=full_name,
                                      host_profile_steps=a.host_profile_steps)
        elif name == "closed_grouped3":  # today's batch worker: closed batches of batch_max_requests
            row = self._with_mfu(self.run_host(self.dispatcher_batches(self.requests(n, A3, full_name))))
        else:
            raise ValueError(f"unknown phase {name}")
        if "videos" in name:
            row["schemas"] = self.args.schemas
        self.results["phases"][full_name] = row
        self.log(f"{full_name}: {json.dumps(row)[:400]}")

    def prefill(self, name: str) -> dict[str, Any]:
        """16 prompts x prompt_len, 1 output token: the time is (almost) all prefill."""
        kind = name.split("_", 1)[1]
        ads = {"nolora": [None], "one": ["a00"], "mixed3": self.adapters3(), "sorted3": self.adapters3()}[kind]
        reqs = self.requests(self.args.max_num_seqs, ads, name, out_len=1)
        if kind == "sorted3":
            reqs.sort(key=lambda r: r.adapter_name)
        row = self.run_bare([reqs])
        fl = sum(flops_per_prompt(self.cfg, self.args.prompt_len) for _ in reqs)
        # use the real token count, not the nominal one
        per = row["prompt_tokens"] / len(reqs)
        fl = len(reqs) * flops_per_prompt(self.cfg, int(per))
        row["model_tflop"] = round(fl / 1e12, 2)
        row["tflops"] = round(fl / row["seconds"] / 1e12, 1)
        row["mfu"] = round(fl / row["seconds"] / PEAK_BF16, 4)
        return row

    # -- videos: the headline a user plans with ---------------------------------------------
    def video_manifest(self) -> dict[str, Any]:
        """bench.gpu.videos' manifest; it may still be sampling beside this engine's start."""
        path = Path(self.args.videos)
        while not path.is_file():
            if self.time_left() < self.args.min_phase_s:
                raise TimeoutError(f"no videos manifest at {path}")
            time.sleep(2)
        return json.loads(path.read_text())

    def video_requests(self, adapters: bool, tag: str, n_clips: int | None = None,
                       out_len: int | None = None) -> tuple[list, list[dict]]:
        """One request per (clip, shipped scenario): the clip's frames as the prepare path
        sampled them for that scenario, the scenario's prompt; scenario k runs on bench adapter
        a0k (dummy weights). Every request decodes exactly --video-out-len tokens."""
        from vidlora.config import get_settings
        from vidlora.engine_io import AnalysisRequest
        from vidlora.scenarios import load_scenarios

        man = self.video_manifest()
        n_clips = n_clips or self.args.video_clips
        clips = man["clips"][self.clips_used:self.clips_used + n_clips]
        if len(clips) < n_clips:
            raise ValueError(f"the manifest has {len(man['clips'])} clips; {self.clips_used} are used "
                             f"and this phase needs {n_clips} unseen ones")
        self.clips_used += len(clips)
        s = get_settings()
        specs = load_scenarios(s.scenarios_file, s.adapter_root)
        reqs = []
        for clip in clips:
            for k, spec in enumerate(specs):
                fr = clip["frames"][spec.name]
                ad = f"a{k:02d}" if adapters else None
                key = f"{tag}-{clip['clip']}-{spec.name}"
                self.video_dims[key] = (len(fr["files"]), fr["width"], fr["height"])
                reqs.append(AnalysisRequest(
                    request_key=key, prompt=spec.prompt, system=spec.system, frames=fr["files"],
                    timestamps=fr["timestamps"], adapter_name=ad,
                    adapter_path=str(self.assets / "adapters" / ad) if ad else None,
                    max_tokens=out_len or self.args.video_out_len, temperature=1.0, top_p=1.0, seed=None,
                    # As the worker sends them (tasks.analysis_rows.build_request): the
                    # scenario's schema and repetition penalty; sampled, not greedy (dummy weights).
                    repetition_penalty=float((spec.generation or {}).get("repetition_penalty", 1.0)),
                    output_schema=spec.output_schema if self.args.schemas else None))
        return reqs, clips

    def stream_capacity(self, reqs: list) -> int:
        """--stream-capacity, or (0) what the worker admits: ``StreamRunner``'s capacity model
        over the engine's cache layout, for these requests' mean engine tokens at their longest."""
        if self.args.stream_capacity:
            return self.args.stream_capacity
        from vidlora.admission import concurrency

        self.tokens_per_request = round(statistics.mean(self.engine_tokens(r) for r in reqs))
        return concurrency(self.args.max_num_seqs, self.host.engine_memory(), self.tokens_per_request)

    def engine_tokens(self, req) -> int:
        """A request's engine tokens at its longest: its prompt as vLLM renders it (frames
        expanded) plus its answer's budget."""
        dims = self.video_dims.get(req.request_key)
        if dims is None:
            return self.args.prompt_len + req.max_tokens
        from vidlora.engine_batches import ReadyAnalysis, estimate_tokens

        frames, w, h = dims
        return estimate_tokens(ReadyAnalysis(id=0, adapter="-", frames=frames, width=w, height=h,
                                             max_tokens=req.max_tokens, ready_since=None))

    def videos(self, adapters: bool, tag: str) -> dict[str, Any]:
        """Clips x shipped scenarios through the dispatcher's grouping and EngineHost.generate,
        as the GPU worker runs them: analyses and videos (every scenario each) per hour."""
        import resource

        reqs, clips = self.video_requests(adapters, tag)
        batches = self.dispatcher_batches(reqs)
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        row = self.run_host(batches)
        return self._video_row(row, reqs, clips, cpu0, resource.getrusage(resource.RUSAGE_SELF))

    def videos_at_once(self, stream: bool, adapters: bool, tag: str, host_profile_steps: int = 0) -> dict[str, Any]:
        """Clips x shipped scenarios offered at once: through the streaming worker's loop
        (``run_stream``, up to --stream-capacity in flight) or bare ``llm.generate`` (inputs built
        before the clock starts, so the bare engine pays for vLLM's part only)."""
        import resource

        reqs, clips = self.video_requests(adapters, tag)
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        if stream:
            row = self.run_stream(reqs, self.stream_capacity(reqs), host_profile_steps=host_profile_steps)
        else:
            row = self.run_bare([reqs])
        return self._with_mfu(self._video_row(row, reqs, clips, cpu0, resource.getrusage(resource.RUSAGE_SELF)))

    def _video_row(self, row: dict[str, Any], reqs: list, clips: list, cpu0, cpu1) -> dict[str, Any]:
        n_sc = len(reqs) // len(clips)
        row.update(
            clips=len(clips), scenarios=n_sc, out_len=self.args.video_out_len,
            frames_per_request=round(statistics.mean(self.video_dims[r.request_key][0] for r in reqs), 2),
            prompt_tokens_per_request=round(row["prompt_tokens"] / len(reqs), 1),
            analyses_per_hour=round(len(reqs) / row["seconds"] * 3600),
            videos_per_hour=round(len(clips) / row["seconds"] * 3600),
            # The GPU host's own CPU: JPEG reading, the HF processor, scheduling (in-process engine).
            engine_process_cpu_s_per_analysis=round(
                (cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime) / len(reqs), 3))
        return row

    def profile(self) -> dict[str, Any]:
        """torch.profiler kernel tables: a prefill-heavy batch without and with LoRA."""
        import torch
        from torch.profiler import ProfilerActivity, profile

        out: dict[str, Any] = {}
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        for kind, ads in (("nolora", [None]), ("mixed3", self.adapters3())):
            reqs = self.requests(4, ads, f"prof-{kind}", out_len=32)
            inputs, params, loras = self.bare_inputs(reqs)
            self.llm.generate(inputs, params, lora_request=loras, use_tqdm=False)  # warm
            reqs = self.requests(4, ads, f"prof2-{kind}", out_len=32)
            inputs, params, loras = self.bare_inputs(reqs)
            with profile(activities=acts) as prof:
                self.llm.generate(inputs, params, lora_request=loras, use_tqdm=False)
                _sync(torch)
            ka = prof.key_averages()
            dev_attr = "device_time_total" if hasattr(ka[0], "device_time_total") else "cuda_time_total"
            sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
            table = ka.table(sort_by=sort, row_limit=30, max_name_column_width=70)
            Path(self.args.json).with_name(f"{self.args.label}_profile_{kind}.txt").write_text(table)
            rows = []
            total = 0.0
            for e in ka:
                t = float(getattr(e, dev_attr, 0.0) or 0.0)
                if t and getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type):
                    total += t
                    rows.append((e.key, t, e.count))
            rows.sort(key=lambda r: -r[1])
            lora = sum(t for k, t, _ in rows if "lora" in k.lower())
            out[kind] = {"gpu_kernel_ms": round(total / 1e3, 2), "lora_kernel_ms": round(lora / 1e3, 2),
                         "top": [(k[:90], round(t / 1e3, 2), c) for k, t, c in rows[:15]]}
        return out

    def adapters20(self) -> dict[str, Any]:
        """All adapters into the host cache (max_cpu_loras), then swap-in costs."""
        import torch

        names = sorted(p.name for p in (self.assets / "adapters").iterdir())[: self.args.max_cpu_loras]
        engine = self.llm.llm_engine
        load_ms = []
        for nm in names:
            lr = self.host.lora_request(nm, str((self.assets / "adapters" / nm).resolve()))
            t0 = time.perf_counter()
            engine.add_lora(lr)
            load_ms.append((time.perf_counter() - t0) * 1e3)
        listed = sorted(engine.list_loras()) if hasattr(engine, "list_loras") else None

        def one(nm: str | None) -> float:
            reqs = self.requests(1, [nm], f"swap-{nm}-{time.perf_counter_ns()}", prompt_len=16, out_len=1)
            inputs, params, loras = self.bare_inputs(reqs)
            _sync(torch)
            t0 = time.perf_counter()
            self.llm.generate(inputs, params, lora_request=loras, use_tqdm=False)
            _sync(torch)
            return (time.perf_counter() - t0) * 1e3

        # Resident: the same adapter twice in a row (second call hits the slot).
        one(names[0])
        resident = [one(names[0]) for _ in range(5)]
        nolora = [one(None) for _ in range(5)]
        # Cycle through more adapters than max_loras slots: every call swaps one in from the
        # host cache (all are registered there by add_lora above).
        swap = []
        for nm in names[self.args.max_loras:]:
            swap.append(one(nm))
        resident_all = None
        if self.args.max_loras >= len(names):
            # Every adapter in its own GPU slot: one pass loads them, a second must swap nothing.
            for nm in names:
                one(nm)
            first = list((self.host.vllm_lora_state() or {}).get("active", []))
            second = [one(nm) for nm in names]
            state_now = self.host.vllm_lora_state() or {}
            resident_all = {"adapters": len(names), "slots_active": len(state_now.get("active", [])),
                            "same_slots_after_second_pass": sorted(first) == sorted(state_now.get("active", [])),
                            "req_ms_median": round(statistics.median(second), 2),
                            "req_ms_max": round(max(second), 2)}
        state = self.host.vllm_lora_state()
        mem = self.memory_facts()
        direct_ms = self._direct_activate(names)
        return {"adapters": len(names), "add_lora_ms": [round(x, 1) for x in load_ms],
                "add_lora_ms_median": round(statistics.median(load_ms), 1),
                "listed_after_add": listed, "vllm_lora_state": state,
                "req_ms_resident_median": round(statistics.median(resident), 2),
                "req_ms_nolora_median": round(statistics.median(nolora), 2),
                "req_ms_swap_in": [round(x, 1) for x in swap],
                "req_ms_swap_in_median": round(statistics.median(swap), 2) if swap else None,
                "swap_in_cost_ms": (round(statistics.median(swap) - statistics.median(resident), 2)
                                    if swap else None),
                "direct_activate_ms": direct_ms, "all_resident": resident_all,
                "memory_after": mem}

    def _direct_activate(self, names: list[str]) -> Any:
        """Time the LoRA manager's own slot copy (host cache -> GPU slot), no forward pass."""
        import torch

        try:
            am = self._runner().lora_manager._adapter_manager
            ids = [i for i in am._registered_adapters.order if i not in am._active_adapters.order]
            out = []
            for i in ids[:6]:
                _sync(torch)
                t0 = time.perf_counter()
                am.activate_adapter(i)
                _sync(torch)
                out.append(round((time.perf_counter() - t0) * 1e3, 2))
            return {"ms": out, "median": statistics.median(out) if out else None}
        except Exception as exc:  # noqa: BLE001 - private API; the request timing stands alone
            return {"error": repr(exc)}

    def run(self) -> int:
        try:
            self.start()
        except Exception:  # noqa: BLE001
            self.results["errors"]["start"] = traceback.format_exc()[-4000:]
            self.save()
            self.log("engine start failed")
            traceback.print_exc()
            return 2
        for name in [p for p in self.args.phases.split(",") if p]:
            if self.time_left() < self.args.min_phase_s:
                self.results["errors"][name] = "skipped: device-call deadline"
                self.log(f"skip {name}: {self.time_left():.0f}s left")
                continue
            try:
                self.phase(name)
            except Exception:  # noqa: BLE001 - one failed phase must not lose the others
                self.results["errors"][name] = traceback.format_exc()[-4000:]
                traceback.print_exc()
            self.results["elapsed_s"] = round(time.time() - self.results["started"], 1)
            self.save()
        return 0


def _dense_lora():
    """engine_patch's dense LoRA module when it is applied in this process, else None."""
    import engine_patch

    if "dense_lora" not in (engine_patch.applied() or []):
        return None
    from engine_patch.patches import dense_lora

    return dense_lora


def _sync(torch) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _flatten(x):
    if isinstance(x, (list, tuple)):
        for y in x:
            yield from _flatten(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _flatten(y)
    elif hasattr(x, "data_ptr"):
        yield x


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--assets", required=True)
    p.add_argument("--label", required=True)
    p.add_argument("--json", required=True)
    p.add_argument("--patch", choices=["on", "off"], default="on")
    p.add_argument("--eager", action="store_true")
    p.add_argument("--phases", default="warmup,bare_nolora,bare_one,bare_mixed3")
    p.add_argument("--n-req", type=int, default=48)
    p.add_argument("--prompt-len", type=int, default=2000)
    p.add_argument("--out-len", type=int, default=128)
    # vidlora's defaults (vidlora/config.py): the worker's real settings
    p.add_argument("--max-loras", type=int, default=4)
    p.add_argument("--max-cpu-loras", type=int, default=20)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-lora-rank", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=16384)
    p.add_argument("--gpu-mem", type=float, default=0.9)
    p.add_argument("--kv-bytes", type=int, default=0)
    p.add_argument("--batch-max-requests", type=int, default=16)
    p.add_argument("--batch-max-tokens", type=int, default=65536)
    p.add_argument("--stream-capacity", type=int, default=0, help="stream_* phases: analyses in flight "
                   "(default 0: what the worker admits, from the engine's cache layout)")
    p.add_argument("--profile-steps", type=int, default=40, help="streamprof_* phases: engine steps "
                   "under torch.profiler, from the step the engine is full")
    p.add_argument("--videos", default="", help="bench.gpu.videos' manifest.json: enables the "
                   "videos / videos_nolora phases (video input allowed; may appear after the start)")
    p.add_argument("--host-profile-steps", type=int, default=40, help="hostprof_videos* phases: a cProfile "
                   "window of the engine thread over this many steps once the engine is full")
    p.add_argument("--video-clips", type=int, default=16, help="clips per video phase (each phase new ones)")
    p.add_argument("--video-out-len", type=int, default=256,
                   help="tokens every video analysis decodes (ignore_eos)")
    p.add_argument("--quantization", default="", choices=["", "fp8"], help="VIDLORA_QUANTIZATION")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"], help="VIDLORA_KV_CACHE_DTYPE")
    p.add_argument("--gdn-state-dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                   help="VIDLORA_GDN_STATE_DTYPE")
    p.add_argument("--no-schemas", dest="schemas", action="store_false",
                   help="video phases: leave the scenarios' output schemas out (the worker sends them)")
    p.add_argument("--llm-kwargs", default="")
    p.add_argument("--deadline", default="", help="epoch seconds; phases that would start "
                   "later than deadline - min_phase_s are skipped")
    p.add_argument("--min-phase-s", type=float, default=25.0)
    return Bench(p.parse_args()).run()


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    raise SystemExit(main())
