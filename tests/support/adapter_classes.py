"""Adapter classes users bring, built with PEFT on the tiny model (or derived from one by a
change PEFT's own arithmetic does not see), each with what vidlora must do with it.

`build_classes(root, model)` -> {class name: AdapterClass}. A served class names its oracle:
the adapter that PEFT, loaded on this model class, computes the same function with (itself,
or the canonical adapter it was derived from by a renaming or re-packing). A refused class
names the words the refusal must contain (the module or config field, and why).
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from testmodels.tiny import LORA_DELTA_RATIO, LORA_TARGETS


@dataclass(frozen=True)
class AdapterClass:
    path: Path
    oracle: Path | None = None  # served: PEFT on this adapter computes what must be served
    refused: tuple[str, ...] = ()  # refused: words the reason must contain
    stage: str = "host"  # where it must be refused: "host" (files) or "device" (engine checks)


# Refused classes PEFT itself refuses to load (the error PeftModel.from_pretrained raises).
PEFT_REFUSES = {"lora_alpha_string": TypeError, "no_peft_type": KeyError}


def peft_adapter(model, out: Path, seed: int, ratio: float = LORA_DELTA_RATIO, **config) -> Path:
    """A PEFT LoRA on ``model`` with random A and B (each module's delta ~ ``ratio`` of its
    weight), saved as PEFT saves it."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(**{"lora_dropout": 0.0, "bias": "none", "task_type": "CAUSAL_LM", **config})
    torch.manual_seed(seed)
    peft_model = get_peft_model(model, cfg, adapter_name="default")
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for _, mod in peft_model.named_modules():
            if not hasattr(mod, "lora_B") or "default" not in getattr(mod, "lora_B", {}):
                continue
            b = mod.lora_B["default"].weight
            rnd = torch.randn(b.shape, generator=g)
            delta = mod.scaling["default"] * (rnd @ mod.lora_A["default"].weight.float())
            w = mod.get_base_layer().weight.float()
            b.copy_(rnd * (ratio * w.norm() / delta.norm().clamp_min(1e-12)))
    out.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(out), safe_serialization=True)
    peft_model.unload()
    return out


def rewrite(src: Path, dst: Path, tensors=None, config=None) -> Path:
    """Copy adapter ``src`` to ``dst`` with its tensors and/or config changed by a function."""
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    sd = load_file(str(src / "adapter_model.safetensors"))
    if tensors is not None:
        sd = tensors(sd)
    save_file({k: v.clone().contiguous() for k, v in sd.items()}, str(dst / "adapter_model.safetensors"))
    cfg = json.loads((src / "adapter_config.json").read_text())
    if config is not None:
        cfg = config(cfg)
    (dst / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
    return dst


def _split_qkv(sd: dict, key_dim: int) -> dict:
    """PEFT on a model whose GDN has separate in_proj_q/k/v: A shared, B cut into row blocks."""
    out = {}
    for k, v in sd.items():
        if "in_proj_qkv.lora_A" in k:
            for leaf in ("q", "k", "v"):
                out[k.replace("in_proj_qkv", f"in_proj_{leaf}")] = v
        elif "in_proj_qkv.lora_B" in k:
            out[k.replace("in_proj_qkv", "in_proj_q")] = v[:key_dim]
            out[k.replace("in_proj_qkv", "in_proj_k")] = v[key_dim:2 * key_dim]
            out[k.replace("in_proj_qkv", "in_proj_v")] = v[2 * key_dim:]
        else:
            out[k] = v
    return out


def _layer0_b(sd: dict, fn) -> dict:
    k = next(k for k in sd if k.endswith("layers.0.mlp.down_proj.lora_B.weight"))
    sd[k] = fn(sd[k])
    return sd


def _self(path: Path) -> AdapterClass:
    return AdapterClass(path, oracle=path)


class _RunsCode:
    def __reduce__(self):
        return (print, ("adapter code ran",))


def _pickled(src: Path, dst: Path) -> Path:
    """The adapter as a pickle that runs code when loaded unsafely."""
    import pickle

    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "adapter_config.json", dst / "adapter_config.json")
    (dst / "adapter_model.bin").write_bytes(pickle.dumps({"payload": _RunsCode()}))
    return dst


def _linked(src: Path, dst: Path, elsewhere: Path) -> Path:
    """An adapter whose weights file is a link to a file outside its directory."""
    elsewhere.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "adapter_model.safetensors", elsewhere / "weights.safetensors")
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "adapter_config.json", dst / "adapter_config.json")
    (dst / "adapter_model.safetensors").symlink_to(elsewhere / "weights.safetensors")
    return dst


def build_classes(root: Path, model_dir: Path, canonical: Path) -> dict[str, AdapterClass]:
    """Every class under ``root``; ``canonical`` is a tiny-model adapter PEFT wrote."""
    from transformers import AutoModelForImageTextToText

    root.mkdir(parents=True, exist_ok=True)
    text = json.loads((model_dir / "config.json").read_text())["text_config"]
    key_dim = text["linear_key_head_dim"] * text["linear_num_key_heads"]
    model = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32)
    lm = r"model\.language_model\.layers\.\d+\."
    c: dict[str, AdapterClass] = {"canonical": AdapterClass(canonical, oracle=canonical)}

    # -- served: renamed or re-packed (the oracle is the canonical adapter) ----------------
    c["text_prefix"] = AdapterClass(rewrite(canonical, root / "text_prefix", lambda sd: {
        k.replace("model.language_model.", "model."): v for k, v in sd.items()}), oracle=canonical)
    c["language_model_prefix"] = AdapterClass(rewrite(canonical, root / "lm_prefix", lambda sd: {
        k.replace("base_model.model.model.language_model.", "base_model.model.language_model.model."): v
        for k, v in sd.items()}), oracle=canonical)
    c["split_qkv"] = AdapterClass(rewrite(canonical, root / "split_qkv", lambda sd: _split_qkv(sd, key_dim),
                                          lambda cfg: dict(cfg, target_modules=[
                                              *[m for m in cfg["target_modules"] if m != "in_proj_qkv"],
                                              "in_proj_q", "in_proj_k", "in_proj_v"])), oracle=canonical)
    # -- served: PEFT features that change the arithmetic (the oracle is PEFT on itself) ---
    patterns = peft_adapter(model, root / "patterns", 11, r=8, lora_alpha=16, target_modules=list(LORA_TARGETS),
                            rank_pattern={"down_proj": 4, f"{lm}linear_attn.out_proj": 2},
                            # PEFT takes the FIRST anchored match: mlp.down_proj -> 64, not 2.
                            alpha_pattern={"mlp.down_proj": 64, "down_proj": 2, "in_proj_z": 1})
    c["rank_alpha_patterns"] = AdapterClass(patterns, oracle=patterns)
    rslora = peft_adapter(model, root / "rslora", 12, r=16, lora_alpha=8, use_rslora=True,
                          target_modules=["q_proj", "v_proj", "in_proj_qkv", "down_proj"])
    c["rslora"] = AdapterClass(rslora, oracle=rslora)
    z_only = peft_adapter(model, root / "z_only", 13, ratio=4.0, r=8, lora_alpha=8, target_modules=["in_proj_z"])
    c["packed_member_only"] = AdapterClass(z_only, oracle=z_only)
    no_alpha = rewrite(canonical, root / "no_alpha", config=lambda cfg: {k: v for k, v in cfg.items()
                                                                          if k != "lora_alpha"})
    c["alpha_left_out"] = AdapterClass(no_alpha, oracle=no_alpha)

    # -- refused on the host, naming the module or config field ---------------------------
    tower = peft_adapter(model, root / "tower_only", 14, r=4, lora_alpha=4,
                         target_modules=r".*visual\.blocks\.\d+\.attn\.qkv")
    c["vision_tower_only"] = AdapterClass(tower, refused=("visual.blocks.0.attn.qkv", "vision-tower"))
    mixed = peft_adapter(model, root / "tower_and_lm", 15, r=4, lora_alpha=4,
                         target_modules=r".*(visual\.blocks\.\d+\.attn\.qkv|language_model\.layers\.\d+\.mlp\.down_proj)")
    c["vision_tower_and_lm"] = AdapterClass(mixed, refused=("visual.blocks", "vision-tower"))
    big = peft_adapter(model, root / "rank64", 16, r=64, lora_alpha=64, target_modules=["down_proj"])
    c["rank_above_limit"] = AdapterClass(big, refused=("mlp.down_proj", "rank 64 > max_lora_rank"))
    c["shape_mismatch"] = AdapterClass(rewrite(canonical, root / "shape", lambda sd: _layer0_b(
        sd, lambda b: torch.zeros(b.shape[0] + 1, b.shape[1]))), refused=("layers.0.mlp.down_proj", "base weight"))

    def unknown(sd):
        return {k.replace("layers.0.mlp.down_proj", "layers.0.mlp.side_proj"): v for k, v in sd.items()}

    c["unknown_module"] = AdapterClass(rewrite(canonical, root / "unknown", unknown, lambda cfg: dict(
        cfg, target_modules=[*cfg["target_modules"], "side_proj"])),
                                       refused=("layers.0.mlp.side_proj", "no such weight"))
    c["empty"] = AdapterClass(rewrite(canonical, root / "empty", lambda sd: {}), refused=("no tensors",))
    c["lora_bias"] = AdapterClass(peft_adapter(model, root / "lora_bias", 17, r=4, lora_alpha=4, lora_bias=True,
                                               target_modules=["down_proj"]), refused=("lora_bias",))
    c["dora"] = AdapterClass(peft_adapter(model, root / "dora", 18, r=4, lora_alpha=4, use_dora=True,
                                          target_modules=["down_proj"]), refused=("use_dora", "DoRA"))
    c["modules_to_save"] = AdapterClass(
        peft_adapter(model, root / "mts", 19, r=4, lora_alpha=4, target_modules=["down_proj"],
                     modules_to_save=["lm_head"]), refused=("modules_to_save",))
    c["all_zero"] = AdapterClass(rewrite(canonical, root / "zero", lambda sd: {
        k: (torch.zeros_like(v) if "lora_B" in k else v) for k, v in sd.items()}), refused=("all-zero",))
    c["non_finite"] = AdapterClass(rewrite(canonical, root / "nan", lambda sd: _layer0_b(
        sd, lambda b: b.clone().fill_(float("nan")))), refused=("layers.0.mlp.down_proj", "non-finite"))
    truncated = rewrite(canonical, root / "truncated")
    data = (truncated / "adapter_model.safetensors").read_bytes()
    (truncated / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    c["truncated_file"] = AdapterClass(truncated, refused=("adapter_model.safetensors cannot be read",))

    # -- served: the config decides which tensors are applied, as PEFT decides -------------
    # Each is PEFT-built, then given tensors its config does not target (edited on disk): PEFT
    # leaves them out, so the oracle is PEFT on the adapter itself.
    def with_foreign(src: Path, dst: Path, foreign) -> Path:
        donor = load_file(str(canonical / "adapter_model.safetensors"))
        return rewrite(src, dst, lambda sd: {**sd, **{k: v for k, v in donor.items() if foreign(k)}})

    down_only = peft_adapter(model, root / "down_only_src", 21, r=8, lora_alpha=16, target_modules=["down_proj"])
    c["untargeted_tensors"] = _self(with_foreign(down_only, root / "untargeted", lambda k: "mlp.up_proj" in k))
    layer0 = peft_adapter(model, root / "layer0_src", 22, r=8, lora_alpha=16, target_modules=list(LORA_TARGETS),
                          layers_to_transform=[0])
    c["layers_to_transform"] = _self(with_foreign(layer0, root / "layer0", lambda k: "layers.1." in k))
    by_pattern = peft_adapter(model, root / "pattern_src", 23, r=4, lora_alpha=8, target_modules=["gate_proj", "up_proj"],
                              layers_to_transform=1, layers_pattern="layers")
    c["layers_pattern"] = _self(with_foreign(by_pattern, root / "pattern", lambda k: "layers.0.mlp" in k))
    regex = peft_adapter(model, root / "regex_src", 24, r=8, lora_alpha=8,
                         target_modules=rf"{lm}(linear_attn\.out_proj|self_attn\.o_proj)")
    c["target_regex"] = _self(with_foreign(regex, root / "regex", lambda k: "down_proj" in k))
    excluded = peft_adapter(model, root / "exclude_src", 25, r=8, lora_alpha=16, target_modules=list(LORA_TARGETS),
                            exclude_modules=["out_proj", "o_proj"])
    c["exclude_modules"] = _self(with_foreign(excluded, root / "exclude", lambda k: "out_proj" in k or "o_proj" in k))

    # -- refused on the host: the tensors and the config disagree, or a module is no LM layer ----
    c["rank_disagrees"] = AdapterClass(rewrite(canonical, root / "rank_disagrees", config=lambda cfg: dict(
        cfg, rank_pattern={"down_proj": 4})), refused=("mlp.down_proj", "rank 8", "rank 4", "size mismatch"))

    def mtp(sd):
        # Qwen3.6's multi-token-prediction block is a full-attention layer, like layer 3 here.
        k = next(k for k in sd if k.endswith("layers.3.self_attn.q_proj.lora_A.weight"))
        for ab in ("lora_A", "lora_B"):
            key = k.replace("lora_A", ab)
            sd[key.replace("model.language_model.layers.3", "mtp.layers.0")] = sd[key]
        return sd

    c["mtp_module"] = AdapterClass(rewrite(canonical, root / "mtp", mtp),
                                   refused=("module mtp.layers.0.self_attn.q_proj", "multi-token-prediction"))

    def twice(sd):
        for k in [k for k in sd if "layers.0.mlp.down_proj" in k]:
            sd[k.replace("model.language_model.", "model.")] = sd[k]
        return sd

    c["two_prefixes"] = AdapterClass(rewrite(canonical, root / "two_prefixes", twice),
                                     refused=("layers.0.mlp.down_proj", "adapted twice"))
    c["qkv_and_split"] = AdapterClass(rewrite(canonical, root / "qkv_and_split", lambda sd: {
        **sd, **{k.replace("in_proj_qkv", "in_proj_q"): (v if "lora_A" in k else v[:key_dim])
                 for k, v in sd.items() if "layers.0.linear_attn.in_proj_qkv" in k}},
        lambda cfg: dict(cfg, target_modules=[*cfg["target_modules"], "in_proj_q"])),
        refused=("in_proj_qkv", "adapted twice"))
    c["pissa_unconverted"] = AdapterClass(rewrite(canonical, root / "pissa", config=lambda cfg: dict(
        cfg, init_lora_weights="pissa")), refused=("init_lora_weights", "pissa", "path_initial_model_for_weight_conversion"))
    c["olora_unconverted"] = AdapterClass(rewrite(canonical, root / "olora", config=lambda cfg: dict(
        cfg, init_lora_weights="olora")), refused=("init_lora_weights", "olora"))
    c["alpha_zero"] = AdapterClass(rewrite(canonical, root / "alpha_zero", config=lambda cfg: dict(
        cfg, lora_alpha=0)), refused=("all-zero", "lora_alpha"))
    c["all_linear_with_tower"] = AdapterClass(
        peft_adapter(model, root / "all_linear", 26, r=4, lora_alpha=4, target_modules="all-linear"),
        refused=("model.visual.", "vision-tower"))
    c["pickle_with_code"] = AdapterClass(_pickled(canonical, root / "pickled"), refused=("adapter_model.bin", "needs code"))
    c["link_outside_root"] = AdapterClass(_linked(canonical, root / "linked", root / "elsewhere"),
                                          refused=("adapter_model.safetensors", "outside the adapter root"))

    # -- served: PEFT applies them as plain LoRA on this base (issue 48) -------------------
    # The output layer alone (PEFT also saves lm_head's unchanged base weight beside A and B).
    c["lm_head_only"] = _self(peft_adapter(model, root / "lm_head", 27, r=8, lora_alpha=16, target_modules=["lm_head"]))
    # bias="all" saves every bias of the model (here only the vision tower's, untrained) and
    # "lora_only" those of adapted layers (none: Qwen3.5's linear layers have no bias).
    c["bias_all"] = _self(peft_adapter(model, root / "bias_all", 28, r=8, lora_alpha=16,
                                       target_modules=["down_proj", "in_proj_z"], bias="all"))
    c["bias_lora_only"] = _self(peft_adapter(model, root / "bias_lora_only", 29, r=8, lora_alpha=16,
                                             target_modules=["down_proj", "q_proj"], bias="lora_only"))
    # VeLoRA (a backward-pass trick) and MonteCLoRA (sampling while training) save tensors
    # only training reads; PEFT's inference forward is a plain LoRA's.
    from peft.tuners.lora.config import MontecloraConfig, VeloraConfig

    c["velora"] = _self(peft_adapter(model, root / "velora", 30, r=8, lora_alpha=16, target_modules=["down_proj", "o_proj"],
                                     velora_config=VeloraConfig()))
    c["monteclora"] = _self(peft_adapter(model, root / "monteclora", 31, r=8, lora_alpha=16,
                                         target_modules=["down_proj", "out_proj"], monteclora_config=MontecloraConfig()))
    # LoRA on a dense weight by parameter: PEFT's ParamWrapper, a module LoRA's computation.
    c["target_parameters_dense"] = _self(peft_adapter(model, root / "tparams", 32, r=8, lora_alpha=16,
                                                      target_modules=None, target_parameters=["mlp.down_proj.weight"]))

    # -- refused on the host, as PEFT refuses them (PeftModel.from_pretrained raises) --------
    c["lora_alpha_string"] = AdapterClass(rewrite(canonical, root / "alpha_string", config=lambda cfg: dict(
        cfg, lora_alpha=str(cfg["lora_alpha"]))), refused=("config lora_alpha", "is not a number", "TypeError"))
    c["no_peft_type"] = AdapterClass(rewrite(canonical, root / "no_peft_type", config=lambda cfg: {
        k: v for k, v in cfg.items() if k != "peft_type"}), refused=("peft_type", "PEFT cannot tell"))

    # -- refused on the device: loads, but does nothing, or its output is degenerate ------
    c["changes_nothing"] = AdapterClass(rewrite(canonical, root / "tiny", lambda sd: {
        k: (v * 1e-9 if "lora_B" in k else v) for k, v in sd.items()}),
        refused=("changes nothing",), stage="device")
    c["overflows"] = AdapterClass(rewrite(canonical, root / "overflow", lambda sd: _layer0_b(
        sd, lambda b: b.clone().fill_(1e30))), refused=("canary", "greedy runs"), stage="device")
    del model
    return c
