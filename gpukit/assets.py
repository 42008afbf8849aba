"""Assets for the H200 benchmark: a Qwen3.5-27B-shaped model directory (config only, for
``load_format="dummy"``) and rank-64 PEFT LoRA adapters on the GDN, attention and MLP
modules of every language-model layer.

    python -m gpukit.assets --out /dev/shm/vl --adapters 20 [--shape 27b|cpu-test|moe35|moe-cpu-test]
        [--layers N] [--weights dummy|random]

``moe35`` is the Qwen3.6-35B-A3B shape (issue 36; its adapters stay on the GDN and attention
projections, plus one ``shared_expert`` adapter with the dense target list, which registration
must refuse); ``--weights random`` writes a random checkpoint for the checks that need one
(engine_patch.verify's merge and fp32 reference), at a cut depth.

Why generated on the device machine: 20 rank-64 adapters for 64 layers are ~0.93 GB each
(~19 GB), far over what a device call can carry; random small values written straight to
safetensors are all a throughput / memory measurement needs. The tokenizer and processor
files come from the tiny model (vocabulary 512 < 248320, so every id it makes is valid).

Layout vLLM 0.26 needs (docs: shared/gpu/README.md beside the checkout): ``Qwen3_5ForConditionalGeneration``
(``model_type: qwen3_5``, ``text_config`` + a small ``vision_config``); adapter keys
``base_model.model.model.language_model.layers.N.<block>.<module>.lora_{A,B}.weight``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

# Qwen3.5-27B text shape (64 layers, 3 GDN : 1 gated full attention, 48 GDN value heads).
TEXT_27B = {
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_hidden_layers": 64,
    "num_attention_heads": 24,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "vocab_size": 248320,
    "max_position_embeddings": 262144,
    "rope_parameters": {
        "rope_type": "default", "rope_theta": 10_000_000, "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10], "mrope_interleaved": True,
    },
}
# Same code path at a size the CPU engine runs in seconds (for checking the scripts).
TEXT_CPU_TEST = dict(TEXT_27B, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                     linear_num_key_heads=2, linear_num_value_heads=4, vocab_size=1024,
                     rope_parameters=dict(TEXT_27B["rope_parameters"], mrope_section=[3, 3, 2]))

# Qwen3.6-35B-A3B (= Qwen3.5-35B-A3B's architecture, transformers model type qwen3_5_moe): the
# sizes are transformers 5.19's Qwen3_5MoeTextConfig defaults, which its docstring gives as the
# Qwen/Qwen3.5-35B-A3B configuration (tests/engine_patch/test_moe.py holds them against the
# class): 40 layers, 3 GDN : 1 gated full attention (30 + 10), 256 routed experts of width 512,
# 8 active, one shared expert of width 512, hidden 2048. Rope and context as the 27B shape
# (head_dim 256 x partial rotary 0.25 = 64 rotary dims = 32 frequencies = 11 + 11 + 10).
TEXT_MOE35 = {
    "hidden_size": 2048,
    "num_hidden_layers": 40,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "vocab_size": 248320,
    "max_position_embeddings": 262144,
    "rope_parameters": TEXT_27B["rope_parameters"],
}
# The MoE code path at a size the CPU runs in seconds (checks the scripts, not the kernels).
TEXT_MOE_CPU_TEST = dict(TEXT_MOE35, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
                         moe_intermediate_size=64, shared_expert_intermediate_size=64, num_experts=8,
                         num_experts_per_tok=2, vocab_size=1024,
                         rope_parameters=dict(TEXT_27B["rope_parameters"], mrope_section=[3, 3, 2]))
SHAPES = {"27b": TEXT_27B, "cpu-test": TEXT_CPU_TEST, "moe35": TEXT_MOE35, "moe-cpu-test": TEXT_MOE_CPU_TEST}

# Qwen3.5's vision tower at its released size (the transformers Qwen3_5VisionConfig defaults;
# 27 blocks, 1152 wide, ~0.4B parameters), for the videos-per-hour run. The tiny model's
# 2-block tower stays the default: the text-only phases never call it.
VISION_27B = {
    "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
    "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
    "num_position_embeddings": 2304, "hidden_act": "gelu_pytorch_tanh",
}
# Qwen3-VL's shipped video pixel budget (whole clip): frames the sampler sized pass unchanged.
VIDEO_SIZE_QWEN = {"shortest_edge": 4096, "longest_edge": 25165824}

RANK = 64
ALPHA = 64  # scale 1: vLLM multiplies lora_B by alpha/r at load
GDN = ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"]
ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
TINY = Path(__file__).resolve().parents[1] / "var" / "tiny-model" / "base"
# The MoE shapes take their config layout (qwen3_5_moe, Qwen3_5MoeForConditionalGeneration),
# tokenizer and processor files from the tiny MoE model (workers.tiny_moe_model).
TINY_MOE = Path(__file__).resolve().parents[1] / "var" / "tiny-moe-model" / "base"


def model_config(text: dict, tiny_base: Path, vision: dict | None = None) -> dict:
    cfg = json.loads((tiny_base / "config.json").read_text())
    tc = dict(cfg["text_config"])
    tc.update(text)
    n = tc["num_hidden_layers"]
    tc["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]
    tc["partial_rotary_factor"] = 0.25
    cfg["text_config"] = tc
    vc = dict(cfg["vision_config"], **(vision or {}))
    vc["out_hidden_size"] = tc["hidden_size"]  # the merger projects into the text width
    cfg["vision_config"] = vc
    return cfg


def is_moe(text: dict) -> bool:
    return text.get("num_experts", 0) > 0


def module_shapes(text: dict, mlp: bool = True) -> list[tuple[str, int, int]]:
    """(PEFT module name, in_features, out_features) for every adapted module: the GDN and
    attention projections, and with ``mlp`` the MLP's (on a MoE base: the shared expert's, where
    PEFT puts the dense target list)."""
    h = text["hidden_size"]
    i = text["shared_expert_intermediate_size"] if is_moe(text) else text["intermediate_size"]
    mlp_prefix = "mlp.shared_expert" if is_moe(text) else "mlp"
    kd, vd = text["linear_key_head_dim"], text["linear_value_head_dim"]
    nk, nv = text["linear_num_key_heads"], text["linear_num_value_heads"]
    hd, nq, nkv = text["head_dim"], text["num_attention_heads"], text["num_key_value_heads"]
    out: list[tuple[str, int, int]] = []
    for layer in range(text["num_hidden_layers"]):
        pre = f"base_model.model.model.language_model.layers.{layer}"
        if (layer + 1) % 4 == 0:
            out += [(f"{pre}.self_attn.q_proj", h, nq * hd * 2),  # query + output gate
                    (f"{pre}.self_attn.k_proj", h, nkv * hd),
                    (f"{pre}.self_attn.v_proj", h, nkv * hd),
                    (f"{pre}.self_attn.o_proj", nq * hd, h)]
        else:
            out += [(f"{pre}.linear_attn.in_proj_qkv", h, 2 * nk * kd + nv * vd),
                    (f"{pre}.linear_attn.in_proj_z", h, nv * vd),
                    (f"{pre}.linear_attn.in_proj_b", h, nv),
                    (f"{pre}.linear_attn.in_proj_a", h, nv),
                    (f"{pre}.linear_attn.out_proj", nv * vd, h)]
        if mlp:
            out += [(f"{pre}.{mlp_prefix}.gate_proj", h, i), (f"{pre}.{mlp_prefix}.up_proj", h, i),
                    (f"{pre}.{mlp_prefix}.down_proj", i, h)]
    return out


def adapter_params(text: dict, rank: int = RANK, mlp: bool = True) -> int:
    return sum(rank * (a + b) for _, a, b in module_shapes(text, mlp))


def write_adapter(path: Path, text: dict, seed: int, device: str, rank: int = RANK, mlp: bool = True,
                  b_std: float | None = None) -> int:
    """``b_std``: None for small updates (throughput runs); a value makes B ~ N(0, b_std^2)
    scaled by sqrt(in / rank), i.e. an update of ~b_std per weight entry, large enough that
    engine_patch.verify sees the adapter's effect above bf16 noise."""
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    g = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for name, fan_in, fan_out in module_shapes(text, mlp):
        # A ~ N(0, 1/in); B ~ N(0, 1e-3) by default: finite, non-zero updates.
        a = torch.randn(rank, fan_in, generator=g, device=device) / fan_in ** 0.5
        std = 1e-3 if b_std is None else b_std * (fan_in / rank) ** 0.5
        b = torch.randn(fan_out, rank, generator=g, device=device) * std
        tensors[f"{name}.lora_A.weight"] = a.to(torch.bfloat16).cpu()
        tensors[f"{name}.lora_B.weight"] = b.to(torch.bfloat16).cpu()
    save_file(tensors, str(path / "adapter_model.safetensors"))
    cfg = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": None,
        "r": rank, "lora_alpha": ALPHA * rank // RANK, "lora_dropout": 0.0, "bias": "none",
        "fan_in_fan_out": False, "inference_mode": True, "use_rslora": False,
        "target_modules": GDN + ATTN + (MLP if mlp else []), "modules_to_save": None,
        "rank_pattern": {}, "alpha_pattern": {},
    }
    (path / "adapter_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return sum(t.numel() * t.element_size() for t in tensors.values())


def write_weights(model: Path, device: str, seed: int = 0) -> int:
    """Random bf16 weights for the config in ``model`` (transformers' own init, the checkpoint
    layout its save_pretrained writes), for checks that need a checkpoint (engine_patch.verify's
    merged model and fp32 reference) rather than vLLM's dummy weights. The MoE router gets
    random weights (transformers starts it at zero: every token would pick the same experts)."""
    import torch
    import transformers

    from engine_patch.env import restore_transformers_configs

    restore_transformers_configs()
    cfg = transformers.AutoConfig.from_pretrained(str(model))
    cls = getattr(transformers, cfg.architectures[0])
    torch.manual_seed(seed)
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            m = cls(cfg)
    finally:
        torch.set_default_dtype(dtype)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 1.0)
    m.save_pretrained(str(model), safe_serialization=True)
    n = sum(p.numel() for p in m.parameters())
    del m
    return n


def build(out: Path, n_adapters: int, shape: str, tiny_base: Path | None = None, layers: int | None = None,
          rank: int = RANK, vision: str = "tiny", weights: str = "dummy") -> dict:
    import torch

    t0 = time.perf_counter()
    text = SHAPES[shape]
    moe = is_moe(text)
    tiny_base = tiny_base or (TINY_MOE if moe else TINY)
    if layers:  # every layer's shapes unchanged, fewer of them (3 GDN : 1 attention kept)
        text = dict(text, num_hidden_layers=layers)
    model = out / "model"
    model.mkdir(parents=True, exist_ok=True)
    cfg = model_config(text, tiny_base, VISION_27B if vision == "27b" else None)
    (model / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for f in tiny_base.iterdir():  # tokenizer, chat template, processor + generation configs
        if f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, model / f.name)
    if vision == "27b":
        vp = json.loads((model / "video_preprocessor_config.json").read_text())
        vp["size"] = VIDEO_SIZE_QWEN
        (model / "video_preprocessor_config.json").write_text(json.dumps(vp, indent=2) + "\n")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    params = write_weights(model, device) if weights == "random" else None
    sizes = []
    for k in range(n_adapters):
        # On a MoE base the benchmark adapters stay off the MLP (what registration serves there),
        # with an effect verify can see; one more with the dense list (on the shared expert).
        sizes.append(write_adapter(out / "adapters" / f"a{k:02d}", text, 1000 + k, device, rank,
                                   mlp=not moe, b_std=0.01 if moe else None))
    if moe:
        write_adapter(out / "adapters" / "shared_expert", text, 999, device, rank, mlp=True, b_std=0.01)
    info = {"shape": shape, "layers": text["num_hidden_layers"], "model": str(model), "adapters": n_adapters,
            "adapter_bytes": sizes[0] if sizes else 0, "adapter_params": adapter_params(text, rank, mlp=not moe),
            "rank": rank, "vision": vision, "weights": weights, "model_params": params,
            "seconds": round(time.perf_counter() - t0, 1)}
    (out / "assets.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--adapters", type=int, default=20)
    p.add_argument("--shape", choices=sorted(SHAPES), default="27b")
    p.add_argument("--tiny-base", type=Path, default=None,
                   help="config layout, tokenizer and processor files (default: the tiny model, or the tiny MoE model)")
    p.add_argument("--weights", choices=["dummy", "random"], default="dummy",
                   help="dummy: config only (vLLM load_format=dummy); random: write a random bf16 checkpoint")
    p.add_argument("--layers", type=int, default=None,
                   help="fewer language-model layers of the same shapes (a multiple of 4)")
    p.add_argument("--rank", type=int, default=RANK)
    p.add_argument("--vision", choices=["tiny", "27b"], default="tiny",
                   help="the vision tower: the tiny model's, or Qwen3.5's released size (video runs)")
    a = p.parse_args()
    if a.layers is not None and (a.layers < 4 or a.layers % 4):
        p.error("--layers must be a positive multiple of 4 (3 GDN layers : 1 attention layer)")
    print(json.dumps(build(a.out, a.adapters, a.shape, a.tiny_base, a.layers, a.rank, a.vision, a.weights)))


if __name__ == "__main__":
    main()
