"""NaN from the Triton LoRA-expand kernel on Hopper (sm_90) at >= 128 tokens.

#48590 #52568 #47869 #48638: the expand kernel reads the fp32 shrink buffer and casts it
to bf16 inside a pipelined wgmma loop; ptxas < 13.3 miscompiles that on sm_90 and
emits NaN. One NaN entering a GDN layer's recurrent state turns every later token `!`.

Mitigation (only on CUDA sm_90 with ptxas < 13.3 or unknown; a no-op elsewhere):
- the fp32 buffer is cast to the weights' dtype *before* the launch, so the kernel's
  CAST_TYPE path is never compiled. The kernel would round to the same dtype anyway
  (`tiled_a.to(b_dtype)` in kernel_utils), so the math is bit-identical;
- `get_lora_op_configs` for op "expand" is clamped to num_stages=1 and block_n<=32,
  which removes the software pipelining the miscompile needs.
Reviewed against the 0.32 source (`_lora_expand` looks `get_lora_op_configs` up in its
module globals at call time, so the clamp reaches the registered custom op too, and
`PunicaWrapperGPU` calls the module-level name `lora_expand`). VIDLORA_HOPPER_EXPAND=
force|off overrides detection (force is how the CPU tests exercise the wrapper).

Measured on the H200 (docs/support-matrix.md): the miscompile did not reproduce with vLLM
0.26 / Triton 3.6 or 0.32 / Triton 3.7.1 (eager, CUDA graphs, PDL). Both still compile sm_90
with ptxas 12.8, as in the reports, which come from H20s we cannot test: so the clamp stays
on where the failure cannot be ruled out. It costs ~3.5% of LoRA prefill (0.26).
"""
from __future__ import annotations

import importlib
import os
import re

from ..env import is_cuda_sm90, versions
from .base import Patch, is_marked, wraps_marked

_EXPAND_MOD = "vllm.lora.ops.triton_ops.lora_expand_op"
_PUNICA_GPU = "vllm.lora.punica_wrapper.punica_gpu"
FIXED_PTXAS = (13, 3)


def _ptxas_is_fixed() -> bool:
    v = versions().get("ptxas")
    if not v:
        return False
    nums = tuple(int(x) for x in re.findall(r"\d+", v)[:2])
    return nums >= FIXED_PTXAS


def clamp_config(cfg: dict) -> dict:
    cfg = dict(cfg)
    cfg["num_stages"] = 1
    if cfg.get("block_n"):
        cfg["block_n"] = min(int(cfg["block_n"]), 32)
    return cfg


def _wrap_configs(orig):
    @wraps_marked(orig)
    def get_lora_op_configs(op_type, *args, **kwargs):
        cfg = orig(op_type, *args, **kwargs)
        return clamp_config(cfg) if op_type == "expand" else cfg

    return get_lora_op_configs


def _wrap_expand(orig):
    import torch

    @wraps_marked(orig)
    def lora_expand(inputs, lora_b_weights, output_tensor, *args, **kwargs):
        w_dtype = lora_b_weights[0].dtype
        if inputs.dtype == torch.float32 and w_dtype in (torch.float16, torch.bfloat16):
            inputs = inputs.to(w_dtype)
        return orig(inputs, lora_b_weights, output_tensor, *args, **kwargs)

    return lora_expand


def probe() -> str | None:
    mode = os.environ.get("VIDLORA_HOPPER_EXPAND", "auto")
    if mode == "off":
        return "disabled by VIDLORA_HOPPER_EXPAND=off"
    if mode != "force":
        if not is_cuda_sm90():
            return "not CUDA sm_90"
        if _ptxas_is_fixed():
            return f"ptxas {versions().get('ptxas')} >= 13.3"
    try:
        mod = importlib.import_module(_EXPAND_MOD)
        gpu = importlib.import_module(_PUNICA_GPU)
    except Exception as exc:  # noqa: BLE001 - no Triton on this platform
        return f"triton LoRA ops not importable: {exc!r}"
    if not hasattr(mod, "get_lora_op_configs") or not hasattr(gpu, "lora_expand"):
        return "expand op layout differs from 0.26-0.34; not patched"
    if is_marked(mod.get_lora_op_configs):
        return "already applied"
    return None


def apply() -> None:
    mod = importlib.import_module(_EXPAND_MOD)
    gpu = importlib.import_module(_PUNICA_GPU)
    mod.get_lora_op_configs = _wrap_configs(mod.get_lora_op_configs)
    gpu.lora_expand = _wrap_expand(gpu.lora_expand)


PATCH = Patch(
    name="hopper_expand",
    covers="sm_90 LoRA expand NaN (#48590 #52568 #47869 #48638): bf16 input, num_stages=1, block_n<=32",
    probe=probe,
    apply=apply,
)
