"""Adapters that are fine on disk and break at run time (the guard's and the faults' inputs)."""

from __future__ import annotations

import shutil
from pathlib import Path


def make_overflow_adapter(src: Path, dst: Path, value: float = 1e30) -> Path:
    """A copy of adapter ``src`` whose layer-0 MLP down_proj lora_B is ``value`` everywhere.

    Finite on disk (engine_patch's loader accepts it), but the residual stream overflows in
    bf16 at run time: the realistic shape of the LoRA NaN/inf faults, reaching the engine
    with no bypass. The tiny model then emits token 0 ('!') at every step.
    """
    from safetensors.torch import load_file, save_file

    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    weights = dst / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    [key] = [k for k in tensors if k.endswith("layers.0.mlp.down_proj.lora_B.weight")]
    tensors[key] = tensors[key].clone().fill_(value)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return dst
