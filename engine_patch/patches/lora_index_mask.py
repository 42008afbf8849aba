"""Failures 2 and 4 on CPU: a no-adapter token (index -1) gets the last adapter slot.

vLLM's pure-torch punica ops (`vllm/lora/ops/torch_ops/lora_ops.py`: `bgmv_shrink`,
`bgmv_expand`, `bgmv_expand_slice`, and the `sgmv_*` ops that call them) gather
`weights[lora_indices]` directly, so -1 ("no LoRA") silently indexes the LAST slot
(upstream PR #48421 / #49656, open). A base request batched next to LoRA requests
then gets another request's adapter (failure 2), and when that adapter produces
inf/NaN the base request turns to `!!!!` too (failure 4). The Triton kernels skip -1.

The fix mirrors the Triton early exit: rows whose index is < 0 get an exact zero
delta, chosen with `torch.where` (not a multiply) so a NaN in any slot can never
reach them.
"""
from __future__ import annotations

import torch

from .base import Patch, is_marked, mark

_NAMES = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")


def _gather(weights: torch.Tensor, idx: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    valid = idx >= 0
    sel = weights[idx.clamp(min=0)].to(dtype=dtype)
    if sel.dim() == 4:
        sel = sel.squeeze(dim=1)
    return sel, valid


def _delta(inputs: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    sel, valid = _gather(weights, idx, dtype)
    out = torch.einsum("bi, boi -> bo", inputs.to(dtype=dtype), sel)
    return torch.where(valid.unsqueeze(-1), out, torch.zeros((), dtype=out.dtype, device=out.device))


@mark
def bgmv_shrink(inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling: float = 1.0):
    outputs = _delta(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs[:]


@mark
def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs: bool = True):
    outputs = _delta(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    # LoRA adapter and model may add different amounts of padding to output (upstream #18773).
    common_len = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common_len] += outputs[:limit, :common_len]
    else:
        output_tensor[:, :common_len] = outputs[:limit, :common_len]


@mark
def bgmv_expand_slice(inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset: int,
                      slice_size: int, add_inputs: bool = True):
    outputs = _delta(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs[:]
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs[:]


_NEW = {"bgmv_shrink": bgmv_shrink, "bgmv_expand": bgmv_expand, "bgmv_expand_slice": bgmv_expand_slice}


def probe() -> str | None:
    try:
        from vllm.lora.ops.torch_ops import lora_ops
    except ImportError:
        return "vllm.lora.ops.torch_ops.lora_ops not present"
    if all(is_marked(getattr(lora_ops, n, None)) for n in _NAMES):
        return "already applied"
    # Behavioural check of the installed op: slot 1 holds ones, the token says -1.
    w = torch.ones(2, 1, 3, 4)
    w[0] = 0
    out = torch.zeros(1, 3)
    lora_ops.bgmv_shrink(torch.ones(1, 4), w, out, torch.tensor([-1]), 1.0)
    if torch.count_nonzero(out) == 0:
        return "upstream torch ops already skip index -1"
    return None


def apply() -> None:
    import sys

    from vllm.lora.ops import torch_ops
    from vllm.lora.ops.torch_ops import lora_ops

    # sgmv_* look the bgmv_* names up in lora_ops' globals, so patching the module
    # covers prefill; the re-exports and punica_cpu's `from ... import` copies need it too.
    holders = [lora_ops, torch_ops]
    for mod_name in ("vllm.lora.punica_wrapper.punica_cpu",):
        try:
            __import__(mod_name)
            holders.append(sys.modules[mod_name])
        except ImportError:
            pass
    for mod in holders:
        for name, fn in _NEW.items():
            if hasattr(mod, name):
                setattr(mod, name, fn)


PATCH = Patch(
    name="lora_index_mask",
    covers="failures 2+4 on CPU: index -1 aliases the last LoRA slot (#48421)",
    probe=probe,
    apply=apply,
)
