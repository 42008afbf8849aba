"""Where a streaming phase's time goes (issue 35): per engine step, what the scheduler put in
it and how long it took; optionally a torch.profiler window of steps.

Model-FLOP utilisation over a phase mixes two kinds of step: *mixed* steps, where prefill
chunks run beside the running decodes (compute-bound when the chunk budget is full), and
*decode-only* steps, where nothing is left to prefill and every running request decodes one
token (weight- and state-bandwidth bound). A finite phase has decode-only steps at its start
(the first requests decode while nothing new has arrived) and at its end (the last ones decode
alone); a worker fed by a queue longer than the engine holds has them only once at its start
and once at its end, so its sustained rate is the mixed steps' rate. This module separates the
two from the scheduler's own output, so the gap to prefill-only utilisation is measured, not
guessed.

Used by ``bench.gpu.bench_engine``'s ``stream_*`` phases; no vLLM object is touched beyond
wrapping the scheduler's ``schedule`` for the duration of a phase.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Step:
    seconds: float
    prefill_tokens: int   # tokens of requests scheduled with more than one token (prefill chunks)
    decodes: int          # requests scheduled with exactly one token


@dataclass
class StepTrace:
    """Wraps the in-process scheduler's ``schedule`` while active; ``close`` restores it."""
    scheduler: Any
    steps: list[Step] = field(default_factory=list)
    _pending: list[tuple[int, int]] = field(default_factory=list)
    _orig: Any = None

    @classmethod
    def attach(cls, llm: Any) -> "StepTrace | None":
        core = getattr(llm.llm_engine, "engine_core", None)
        core = getattr(core, "engine_core", core)
        sched = getattr(core, "scheduler", None)
        if sched is None or not hasattr(sched, "schedule"):
            return None  # engine in a child process: nothing to trace here
        trace = cls(sched)
        trace._orig = sched.schedule

        def schedule(*a, **kw):
            out = trace._orig(*a, **kw)
            counts = getattr(out, "num_scheduled_tokens", None) or {}
            prefill = sum(n for n in counts.values() if n > 1)
            decodes = sum(1 for n in counts.values() if n == 1)
            trace._pending.append((prefill, decodes))
            return out

        sched.schedule = schedule
        return trace

    def close(self) -> None:
        if self._orig is not None:
            self.scheduler.schedule = self._orig
            self._orig = None

    def step_done(self, seconds: float) -> None:
        """One ``EngineStream.step``: the schedule calls it made are that step's work."""
        pend, self._pending = self._pending, []
        self.steps.append(Step(seconds, sum(p for p, _ in pend), sum(d for _, d in pend)))

    # -- reading it ------------------------------------------------------------------------
    def summary(self, prompt_flops_total: float, peak: float) -> dict[str, Any]:
        mixed = [s for s in self.steps if s.prefill_tokens]
        dec = [s for s in self.steps if not s.prefill_tokens and s.decodes]
        idle = [s for s in self.steps if not s.prefill_tokens and not s.decodes]
        wall = sum(s.seconds for s in self.steps) or 1e-9
        mixed_s = sum(s.seconds for s in mixed)
        out: dict[str, Any] = {
            "steps": len(self.steps),
            "mixed_steps": len(mixed), "mixed_s": round(mixed_s, 2),
            "mixed_mean_prefill_tokens": round(sum(s.prefill_tokens for s in mixed) / max(1, len(mixed))),
            "mixed_mean_decodes": round(sum(s.decodes for s in mixed) / max(1, len(mixed)), 1),
            "decode_only_steps": len(dec), "decode_only_s": round(sum(s.seconds for s in dec), 2),
            "decode_only_mean_batch": round(sum(s.decodes for s in dec) / max(1, len(dec)), 1),
            "decode_only_ms_per_step": round(1e3 * sum(s.seconds for s in dec) / max(1, len(dec)), 1),
            "empty_steps": len(idle), "empty_s": round(sum(s.seconds for s in idle), 2),
            "share_of_time_decode_only": round(sum(s.seconds for s in dec) / wall, 3),
            # The prompts' FLOPs are all done in mixed steps; decode FLOPs are ~1/2000 of them.
            "mfu_in_mixed_steps": round(prompt_flops_total / max(mixed_s, 1e-9) / peak, 4),
        }
        return out


# -- the profiler window --------------------------------------------------------------------------

KERNEL_CLASSES = (  # first match wins; names as CUDA kernels appear in torch.profiler on Hopper
    ("lora (Punica)", re.compile(r"lora|sgmv|bgmv|punica", re.I)),
    ("GDN (chunked/recurrent, conv1d)", re.compile(
        r"chunk|gated_delta|recurrent|conv1d|solve_tril|recompute_w_u|l2norm|fla_|kkt|cumsum|merge_16x16", re.I)),
    ("attention", re.compile(r"flash|fmha|attn|attention|paged|reshape_and_cache", re.I)),
    ("matmul (base and dense LoRA)", re.compile(r"gemm|cutlass|nvjet|xmma|cublas|matmul|sm90_|wgmma", re.I)),
    ("sampler, logits", re.compile(r"sample|topk|top_k|sort|argmax|multinomial|exponential|softmax|gather|logit|penalt", re.I)),
    ("norms, activations, rotary", re.compile(r"norm|silu|gelu|act_and_mul|rotary|rope|sigmoid", re.I)),
    ("copies", re.compile(r"memcpy|memset|copy|cat|index", re.I)),
)


def classify(prof: Any, wall_s: float) -> dict[str, Any]:
    """GPU kernel time of a profiled window by class, and the GPU's idle share of the wall."""
    ka = prof.key_averages()
    dev_attr = "device_time_total" if hasattr(ka[0], "device_time_total") else "cuda_time_total"
    totals: dict[str, float] = {}
    top: list[tuple[str, float, int]] = []
    busy = 0.0
    for e in ka:
        t = float(getattr(e, dev_attr, 0.0) or 0.0)
        if not t or "CUDA" not in str(getattr(e, "device_type", "")):
            continue
        busy += t
        top.append((e.key, t, e.count))
        cls = next((c for c, rx in KERNEL_CLASSES if rx.search(e.key)), "other")
        totals[cls] = totals.get(cls, 0.0) + t
    top.sort(key=lambda r: -r[1])
    # Host side too: what the engine thread spends its step on (a LoRA step's mapping and
    # metadata work shows here, not among the kernels), by self time.
    cpu = sorted(((e.key, float(getattr(e, "self_cpu_time_total", 0.0) or 0.0), e.count) for e in ka),
                 key=lambda r: -r[1])
    wall_us = wall_s * 1e6
    return {
        "wall_s": round(wall_s, 3),
        "gpu_busy_s": round(busy / 1e6, 3),
        "gpu_idle_share": round(max(0.0, 1 - busy / wall_us), 3) if wall_us else None,
        "by_class_share": {k: round(v / busy, 3) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])} if busy else {},
        "by_class_ms": {k: round(v / 1e3, 1) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])},
        "top": [(k[:90], round(t / 1e3, 1), c) for k, t, c in top[:40]],
        "cpu_self_top": [(k[:90], round(t / 1e3, 1), c) for k, t, c in cpu[:25] if t],
    }
