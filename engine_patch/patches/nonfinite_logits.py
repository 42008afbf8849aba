"""Keep a request's non-finite logits out of the V2 sampler's index arithmetic.

On vLLM's V2 model runner (`vllm.v1.worker.gpu`, the default on CUDA from 0.29 on), a request
whose logits row holds a NaN (or +inf) is sampled by `gumbel_sample`: a Triton block argmax
whose comparisons are all false on NaN, so the winning index can land on a masked lane past
the vocabulary. That token id then indexes `compute_topk_scores`' gather (logprobs) and the
next step's embedding: on the H200 with vLLM 0.32 this was `vectorized_gather_kernel:
Assertion 'ind >= 0 && ind < ind_dim_size'`, a device-side assert that loses the CUDA
context, so every request in the batch and every later call failed until the process was
replaced (bench/results/h200_field.md). On the V1 runner (0.26, and the CPU runner of every
version) torch's argmax picks the NaN's own index, which is in range: the request returns
`!!!!` and its batch-mates are untouched.

The patch wraps the V2 `Sampler.__call__`. Rows with a NaN or +inf logit (one fused row sum:
NaN or +inf propagates, a logits processor's -inf mask does not) are replaced, before any
sampling arithmetic, by a row that puts all mass on token 0, and their returned logprobs are
set to NaN. So the bad request:
- samples an in-range token, and the rest of the step (the other rows) is untouched;
- looks exactly as it did on the V1 runner: token 0 (`!` in the Qwen vocabulary) with
  non-finite logprobs, which the run-time guard (`engine_patch.guard.check_output`) already
  refuses and isolates, whether or not logprobs were asked for (token-0 runs).
Everything stays on the device with no host sync: two element-wise passes over the logits,
cheap beside a decode step.
"""
from __future__ import annotations

import importlib
import inspect

import torch

from .base import Patch, is_marked, wraps_marked

_SAMPLER = ("vllm.v1.worker.gpu.sample.sampler", "Sampler")
# The token every sanitised row samples: the V1 runner's own outcome for an all-NaN row.
FALLBACK_TOKEN = 0


def nonfinite_rows(logits: torch.Tensor) -> torch.Tensor:
    """Bool [rows]: the row holds a NaN or +inf. A -inf (a processor's mask) alone is fine."""
    s = logits.sum(dim=-1, dtype=torch.float32)
    return torch.isnan(s) | torch.isposinf(s)


def sanitise(logits: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    """A copy of `logits` whose `bad` rows put all mass on FALLBACK_TOKEN (0 there, -inf
    elsewhere: greedy, temperature, top-k/top-p and Gumbel noise all pick it)."""
    fill = torch.full((logits.shape[-1],), float("-inf"), dtype=logits.dtype, device=logits.device)
    fill[FALLBACK_TOKEN] = 0
    return torch.where(bad[:, None], fill, logits)


def mark_logprobs(logprobs_tensors, bad: torch.Tensor):
    """The sampler's LogprobsTensors with the `bad` rows' logprobs set to NaN."""
    if logprobs_tensors is None or logprobs_tensors.logprobs.shape[0] != bad.shape[0]:
        return logprobs_tensors
    lp = logprobs_tensors.logprobs
    return logprobs_tensors._replace(logprobs=torch.where(bad[:, None], torch.full_like(lp, float("nan")), lp))


def _sampler_cls():
    mod_name, cls_name = _SAMPLER
    return getattr(importlib.import_module(mod_name), cls_name)


def _wrap(orig):
    @wraps_marked(orig)
    def __call__(self, logits, input_batch, *args, **kwargs):
        bad = nonfinite_rows(logits)
        out = orig(self, sanitise(logits, bad), input_batch, *args, **kwargs)
        out.logprobs_tensors = mark_logprobs(out.logprobs_tensors, bad)
        return out

    return __call__


def probe() -> str | None:
    try:
        cls = _sampler_cls()
    except Exception as exc:  # noqa: BLE001 - no V2 runner in this vLLM: nothing indexes with NaN
        return f"no V2 model-runner sampler ({type(exc).__name__}); the V1 sampler keeps NaN rows in range"
    call = cls.__call__
    if is_marked(call):
        return "already applied"
    params = list(inspect.signature(call).parameters)
    if params[:3] != ["self", "logits", "input_batch"]:
        return f"unexpected Sampler.__call__ signature {params}: not wrapped"
    out = importlib.import_module("vllm.v1.worker.gpu.sample.output")
    fields = getattr(out.SamplerOutput, "__dataclass_fields__", {})
    if "logprobs_tensors" not in fields:
        return "SamplerOutput has no logprobs_tensors: not wrapped"
    return None


def apply() -> None:
    cls = _sampler_cls()
    cls.__call__ = _wrap(cls.__call__)


PATCH = Patch(
    name="nonfinite_logits",
    covers="V2 sampler: a NaN logits row indexes out of range -> device-side assert, CUDA context lost (vLLM 0.29+, seen on 0.32)",
    probe=probe,
    apply=apply,
)
