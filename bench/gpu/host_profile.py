"""Where the engine thread's time goes in steady state (issue 55): a cProfile window over
engine steps, each function's own time put in one bucket by where it lives.

The GPU waits on the host between steps whenever the host's part of a step is longer than the
GPU's, which is what happens when every request carries a JSON schema: vLLM then defers each
step's sampling until the previous step's output has been processed (``EngineCore.
step_with_batch_queue``, ``pending_structured_output_tokens``), so the host's output
processing no longer overlaps the GPU's next forward. This module measures that host part, by
owner (vLLM's scheduler, its output processing, the grammar, vidlora's stream and guard) and
the time the thread spent blocked waiting for the GPU, so a decode step's time splits into
"GPU" and "host, whose".

Only the thread that steps the engine is profiled (cProfile is per thread); the offering
thread, which prepares inputs, is not in the window.
"""

from __future__ import annotations

import cProfile
import pstats
from typing import Any

# First match wins: (bucket, substrings of the function's file or name). Waits come first:
# a blocked thread's time is the GPU's, not the host's.
BUCKETS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gpu_wait", ("synchronize", "method 'acquire'", "method 'wait'", "Future.result",
                  "_thread.lock", "cudaStreamSynchronize", "method 'item'", "method 'tolist'",
                  "method 'cpu'")),
    ("grammar", ("structured_output", "xgrammar", "llguidance", "outlines", "lm_format_enforcer",
                 "get_grammar_bitmask")),
    ("vllm_scheduler", ("vllm/v1/core/",)),
    ("vllm_output_processing", ("vllm/v1/engine/output_processor", "vllm/v1/engine/detokenizer",
                                "vllm/v1/engine/logprobs", "vllm/outputs", "vllm/tokenizers",
                                "tokenizers", "transformers/")),
    ("vllm_engine_core", ("vllm/v1/engine/",)),
    ("vllm_model_runner", ("vllm/v1/worker/", "vllm/v1/sample/", "vllm/v1/attention/",
                           "vllm/model_executor/", "vllm/lora/", "vllm/v1/executor/",
                           "vllm/forward_context", "vllm/compilation/")),
    ("vidlora_stream", ("workers/engine_stream", "workers/engine_host", "workers/engine_outputs",
                        "vidlora/")),
    ("vidlora_guard", ("engine_patch/",)),
    ("torch", ("torch/", "method '", "built-in method")),
    ("vllm_other", ("vllm/",)),
)


def bucket_of(file: str, name: str) -> str:
    where = f"{file}:{name}"
    for bucket, keys in BUCKETS:
        if any(k in where for k in keys):
            return bucket
    return "other"


class HostProfile:
    """``start()`` before the first profiled step, ``stop(wall_s, steps)`` after the last."""

    def __init__(self) -> None:
        self.prof = cProfile.Profile()

    def start(self) -> None:
        self.prof.enable()

    def stop(self, wall_s: float, steps: int, top: int = 25) -> dict[str, Any]:
        self.prof.disable()
        st = pstats.Stats(self.prof)
        buckets: dict[str, float] = {}
        rows = []
        for (file, line, name), (_cc, _nc, tottime, cumtime, _callers) in st.stats.items():  # type: ignore[attr-defined]
            b = bucket_of(file, name)
            buckets[b] = buckets.get(b, 0.0) + tottime
            rows.append((tottime, cumtime, b, f"{_short(file)}:{line}({name})"))
        rows.sort(reverse=True)
        per_step = {k: round(v / max(1, steps) * 1e3, 2) for k, v in sorted(buckets.items(), key=lambda kv: -kv[1])}
        host = sum(v for k, v in per_step.items() if k != "gpu_wait")
        return {
            "steps": steps, "wall_ms_per_step": round(wall_s / max(1, steps) * 1e3, 2),
            "ms_per_step": per_step,
            "host_ms_per_step": round(host, 2),
            "gpu_wait_ms_per_step": per_step.get("gpu_wait", 0.0),
            "top_own_time": [(label, b, round(t / max(1, steps) * 1e3, 3), round(c / max(1, steps) * 1e3, 3))
                             for t, c, b, label in rows[:top]],
            "note": "ms per step of each function's own time under cProfile (which slows Python "
                    "code ~1.3-2x): shares, not absolute costs; gpu_wait is the thread blocked on the GPU",
        }


def _short(file: str) -> str:
    for mark in ("site-packages/", "/vidlora/", "/workers/", "/engine_patch/"):
        if mark in file:
            return file.split(mark, 1)[1] if mark == "site-packages/" else mark.strip("/") + "/" + file.split(mark, 1)[1]
    return file
