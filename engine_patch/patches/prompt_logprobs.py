"""Failure 3: `prompt_logprobs` with more than one LoRA request in a batch.

`GPUModelRunner._get_prompt_logprobs_dict` (also used by the CPU runner) calls
`model.compute_logits(hidden_states[offset:offset + n])` once per request, but the
LoRA logits processor still applies the *sampler* mapping (one index per request):
on CPU `PunicaWrapperCPU.add_lora_logits` -> `bgmv_shrink` raises
`einsum(): subscript b has size <num_reqs> ... <n>`; on GPU
`PunicaWrapperGPU.add_lora_logits` reads `prompt_mapping_meta.meta_args(n)`, i.e. the
first n per-request entries, so prompt logits silently use other requests' adapters.

The fix: while prompt logprobs are computed, `compute_logits` is wrapped so that the
rows it is given (a view of the step's hidden states) are mapped back to their token
positions, and `add_lora_logits` applies exactly those tokens' adapters (a per-adapter
torch matmul; prompt logprobs are rare, so clarity beats speed here).
"""
from __future__ import annotations

import contextvars
import importlib
import inspect

import torch

from .base import Patch, is_marked, wraps_marked

_OVERRIDE: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar(
    "vidlora_prompt_logits_lora_indices", default=None
)
_PUNICA_CLASSES = (
    ("vllm.lora.punica_wrapper.punica_cpu", "PunicaWrapperCPU"),
    ("vllm.lora.punica_wrapper.punica_gpu", "PunicaWrapperGPU"),
    ("vllm.lora.punica_wrapper.punica_xpu", "PunicaWrapperXPU"),
)
_RUNNER = ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")


def logits_delta(y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                 scale: float, indices: torch.Tensor) -> torch.Tensor:
    """y[rows of adapter l] += (x @ A[l].T * scale) @ B[l].T, in fp32; index < 0 = no LoRA."""
    y2 = y.view(-1, y.shape[-1])
    x2 = x.view(-1, x.shape[-1])
    a = lora_a.squeeze(1) if lora_a.dim() == 4 else lora_a
    b = lora_b.squeeze(1) if lora_b.dim() == 4 else lora_b
    for lora in indices.unique().tolist():
        if lora < 0:
            continue
        rows = (indices == lora).nonzero().squeeze(1)
        d = (x2[rows].float() @ a[lora].float().T) * scale @ b[lora].float().T
        common = min(d.shape[1], y2.shape[1])
        y2[rows, :common] += d[:, :common].to(y2.dtype)
    return y


def _wrap_add_lora_logits(orig):
    @wraps_marked(orig)
    def add_lora_logits(self, y, x, lora_a_stacked, lora_b_stacked, scale, *args, **kwargs):
        indices = _OVERRIDE.get()
        if indices is None or indices.numel() != x.view(-1, x.shape[-1]).shape[0]:
            return orig(self, y, x, lora_a_stacked, lora_b_stacked, scale, *args, **kwargs)
        return logits_delta(y, x, lora_a_stacked, lora_b_stacked, scale, indices)

    return add_lora_logits


def _lora_logits_layer(runner):
    cached = getattr(runner, "_vidlora_lora_logits", False)
    if cached is not False:
        return cached
    from vllm.lora.layers.logits_processor import LogitsProcessorWithLoRA

    found = None
    model = getattr(runner, "model", None)
    if isinstance(model, torch.nn.Module):
        found = next((m for m in model.modules() if isinstance(m, LogitsProcessorWithLoRA)), None)
    runner._vidlora_lora_logits = found
    return found


def _row_offset(view: torch.Tensor, base: torch.Tensor) -> int | None:
    """Row index of `view` inside `base`, if `view` is a row slice of it."""
    if (view.dim() != 2 or base.dim() != 2 or view.stride() != base.stride()
            or view.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()):
        return None
    delta = view.storage_offset() - base.storage_offset()
    if delta < 0 or delta % base.stride(0):
        return None
    return delta // base.stride(0)


def _wrap_prompt_logprobs(orig):
    @wraps_marked(orig)
    def _get_prompt_logprobs_dict(self, hidden_states, num_scheduled_tokens):
        layer = _lora_logits_layer(self) if self.num_prompt_logprobs else None
        if layer is None:
            return orig(self, hidden_states, num_scheduled_tokens)
        token_indices = layer.punica_wrapper.token_lora_indices
        model = self.model
        inner = model.compute_logits

        def compute_logits(h, *args, **kwargs):
            off = _row_offset(h, hidden_states)
            if off is None or off + h.shape[0] > token_indices.numel():
                return inner(h, *args, **kwargs)
            token = _OVERRIDE.set(token_indices[off : off + h.shape[0]])
            try:
                return inner(h, *args, **kwargs)
            finally:
                _OVERRIDE.reset(token)

        had_attr = "compute_logits" in vars(model)
        model.compute_logits = compute_logits
        try:
            return orig(self, hidden_states, num_scheduled_tokens)
        finally:
            if had_attr:
                model.compute_logits = inner
            else:
                del model.compute_logits

    return _get_prompt_logprobs_dict


def probe() -> str | None:
    try:
        runner = getattr(importlib.import_module(_RUNNER[0]), _RUNNER[1])
    except (ImportError, AttributeError):
        # 0.34 removed the V1 runner; the V2 runner (the CUDA default from 0.29 on) scores
        # prompts in its own PromptLogprobsWorker, which engine_patch.verify check b measures.
        return "no V1 GPUModelRunner (removed in vLLM 0.34): nothing to wrap"
    fn = getattr(runner, "_get_prompt_logprobs_dict", None)
    if fn is None:
        return "no _get_prompt_logprobs_dict in this vLLM"
    if is_marked(fn):
        return "already applied"
    if "lora" in inspect.getsource(fn).lower():
        return "upstream _get_prompt_logprobs_dict already sets a per-token LoRA mapping"
    return None


def apply() -> None:
    runner = getattr(importlib.import_module(_RUNNER[0]), _RUNNER[1])
    runner._get_prompt_logprobs_dict = _wrap_prompt_logprobs(runner._get_prompt_logprobs_dict)
    for mod_name, cls_name in _PUNICA_CLASSES:
        try:
            cls = getattr(importlib.import_module(mod_name), cls_name)
        except Exception:  # noqa: BLE001 - platform wrappers may not import here
            continue
        fn = vars(cls).get("add_lora_logits")
        if fn is not None and not is_marked(fn):
            cls.add_lora_logits = _wrap_add_lora_logits(fn)


PATCH = Patch(
    name="prompt_logprobs",
    covers="failure 3: prompt_logprobs with several LoRA requests (sampler mapping used per token)",
    probe=probe,
    apply=apply,
)
