from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine_patch.adapters import AdapterError, prepare_adapter

from tests.support.tiny import derive, full_adapters, tiny_model


@pytest.fixture(scope="module")
def model() -> Path:
    return tiny_model()


@pytest.fixture(scope="module")
def full(model) -> Path:
    return full_adapters(model)[0]


def _rewrite(src: Path, dst: Path, fn) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    sd = fn(load_file(str(src / "adapter_model.safetensors")))
    save_file({k: v.clone().contiguous() for k, v in sd.items()}, str(dst / "adapter_model.safetensors"))
    (dst / "adapter_config.json").write_text((src / "adapter_config.json").read_text())
    return dst


def test_full_adapter_places_every_module(model, full, tmp_path):
    p = prepare_adapter(full, model / "base", 16, tmp_path)
    assert p.rank == 8 and len(p.modules) > 10
    assert all(m.startswith("model.language_model.layers.") for m in p.modules)
    cfg = json.loads((p.path / "adapter_config.json").read_text())
    assert cfg["lora_alpha"] == cfg["r"] == 8  # scales folded into B


def test_scale_folded_exactly(model, full, tmp_path):
    src_cfg = json.loads((full / "adapter_config.json").read_text())
    p = prepare_adapter(full, model / "base", 16, tmp_path)
    a = load_file(str(full / "adapter_model.safetensors"))
    b = load_file(str(p.path / "adapter_model.safetensors"))
    k = next(k for k in a if "down_proj.lora_B" in k)
    scale = src_cfg["lora_alpha"] / src_cfg["r"]
    assert torch.allclose(b[k].float(), a[k].float() * scale)


def test_prefix_variants_normalised(model, full, tmp_path):
    text_only = _rewrite(full, tmp_path / "src", lambda sd: {k.replace("model.language_model.", "model."): v for k, v in sd.items()})
    p = prepare_adapter(text_only, model / "base", 16, tmp_path / "out")
    assert all(m.startswith("model.language_model.") for m in p.modules)


def test_z_only_is_zero_filled(model, full, tmp_path):
    z = derive(full, tmp_path / "z", keep=("in_proj_z",))
    p = prepare_adapter(z, model / "base", 16, tmp_path / "out")
    sd = load_file(str(p.path / "adapter_model.safetensors"))
    qkv = [k for k in sd if "in_proj_qkv" in k]
    assert qkv and all(torch.count_nonzero(sd[k]) == 0 for k in qkv)


def test_split_qkv_merged_block_diagonal(model, full, tmp_path):
    def split(sd):
        out = {}
        for k, v in sd.items():
            if "in_proj_qkv.lora_A" in k:
                for leaf in ("q", "k", "v"):
                    out[k.replace("in_proj_qkv", f"in_proj_{leaf}")] = v.clone()
            elif "in_proj_qkv.lora_B" in k:
                out.update(_split_b(k, v))
            else:
                out[k] = v
        return out

    base_cfg = json.loads((model / "base" / "config.json").read_text())["text_config"]
    kd = base_cfg["linear_key_head_dim"] * base_cfg["linear_num_key_heads"]

    def _split_b(k, v):
        return {k.replace("in_proj_qkv", "in_proj_q"): v[:kd], k.replace("in_proj_qkv", "in_proj_k"): v[kd:2 * kd],
                k.replace("in_proj_qkv", "in_proj_v"): v[2 * kd:]}

    src = _rewrite(full, tmp_path / "split", split)
    merged = prepare_adapter(src, model / "base", 32, tmp_path / "o1")
    ref = prepare_adapter(full, model / "base", 32, tmp_path / "o2")
    a, b = load_file(str(merged.path / "adapter_model.safetensors")), load_file(str(ref.path / "adapter_model.safetensors"))
    k = next(k for k in a if "layers.0.linear_attn.in_proj_qkv.lora_A" in k)
    kb = k.replace("lora_A", "lora_B")
    x = torch.randn(3, a[k].shape[1])
    assert torch.allclose(x @ a[k].T @ a[kb].T, x @ b[k].T @ b[kb].T, atol=1e-4)
    with pytest.raises(AdapterError, match="rank"):
        prepare_adapter(src, model / "base", 16, tmp_path / "o3")  # merged rank 24 > 16


@pytest.mark.parametrize("case,match", [
    ("tower", "vision-tower"), ("unknown", "no such weight"), ("shape", "base weight"),
    ("nan", "non-finite"), ("zero", "all-zero"), ("rank", "rank 8 > max_lora_rank 4"),
])
def test_refusals_name_the_module(model, full, tmp_path, case, match):
    if case == "rank":
        with pytest.raises(AdapterError, match=match):
            prepare_adapter(full, model / "base", 4, tmp_path)
        return

    def edit(sd):
        k = next(k for k in sd if "layers.0.mlp.down_proj.lora_A" in k)
        kb = k.replace("lora_A", "lora_B")
        if case == "tower":
            sd["base_model.model.model.visual.blocks.0.attn.qkv.lora_A.weight"] = sd[k]
            sd["base_model.model.model.visual.blocks.0.attn.qkv.lora_B.weight"] = sd[kb]
        elif case == "unknown":
            sd[k.replace("down_proj", "side_proj")] = sd.pop(k)
            sd[kb.replace("down_proj", "side_proj")] = sd.pop(kb)
        elif case == "shape":
            sd[kb] = torch.zeros(sd[kb].shape[0] + 1, sd[kb].shape[1])
        elif case == "nan":
            sd[kb] = sd[kb].clone()
            sd[kb][0, 0] = float("nan")
        elif case == "zero":
            sd = {kk: (torch.zeros_like(v) if "lora_B" in kk else v) for kk, v in sd.items()}
        return sd

    src = _rewrite(full, tmp_path / case, edit)
    with pytest.raises(AdapterError, match=match) as e:
        prepare_adapter(src, model / "base", 16, tmp_path / "out")
    if case in ("tower", "unknown", "shape", "nan"):
        assert "module " in str(e.value)


def test_a_config_only_model_has_its_checkpoint_shapes(model, full, tmp_path):
    # The benchmarks' full-size models are config-only (vLLM load_format="dummy"); the one
    # adapter path must read the same module table from the config as from the weights.
    from engine_patch.adapters import base_modules

    dummy = tmp_path / "dummy-base"
    dummy.mkdir()
    (dummy / "config.json").write_text((model / "base" / "config.json").read_text())
    assert base_modules(dummy) == base_modules(model / "base")
    out = prepare_adapter(full, dummy, 16, tmp_path / "out")
    ref = prepare_adapter(full, model / "base", 16, tmp_path / "ref")
    assert out.digest == ref.digest


def test_a_directory_without_weights_or_config_is_refused(tmp_path):
    from engine_patch.adapters import base_modules

    with pytest.raises(AdapterError, match="no \\*.safetensors"):
        base_modules(tmp_path)
