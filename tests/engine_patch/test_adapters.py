from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine_patch.adapters import AdapterError, prepare_adapter

from tests.support.tiny import derive


def _rewrite(src: Path, dst: Path, fn=lambda sd: sd, targets: tuple[str, ...] = (), **config) -> Path:
    """``src`` with its tensors edited by ``fn``, ``targets`` added to target_modules and
    ``config`` fields set."""
    dst.mkdir(parents=True, exist_ok=True)
    sd = fn(load_file(str(src / "adapter_model.safetensors")))
    save_file({k: v.clone().contiguous() for k, v in sd.items()}, str(dst / "adapter_model.safetensors"))
    cfg = json.loads((src / "adapter_config.json").read_text())
    cfg["target_modules"] = [*cfg["target_modules"], *targets]
    cfg.update(config)
    (dst / "adapter_config.json").write_text(json.dumps(cfg))
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

    src = _rewrite(full, tmp_path / "split", split, targets=("in_proj_q", "in_proj_k", "in_proj_v"))
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

    src = _rewrite(full, tmp_path / case, edit, targets=("side_proj", "attn.qkv"))
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


# -- the config decides what is applied, as PEFT decides it ---------------------------------

def _modules(p) -> set[str]:
    return {m.split("layers.", 1)[1] for m in p.modules}


def test_tensors_the_config_does_not_target_are_left_out_and_named(model, full, tmp_path):
    def add_untargeted(sd):
        k = next(k for k in sd if "layers.0.mlp.down_proj.lora_A" in k)
        sd[k.replace("down_proj", "side_proj")] = sd[k]
        sd[k.replace("down_proj", "side_proj").replace("lora_A", "lora_B")] = sd[k.replace("lora_A", "lora_B")]
        return sd

    src = _rewrite(full, tmp_path / "extra", add_untargeted)
    p, ref = prepare_adapter(src, model / "base", 16, tmp_path / "o"), prepare_adapter(full, model / "base", 16, tmp_path / "r")
    assert p.modules == ref.modules
    assert any("left out, as PEFT leaves them out" in n and "layers.0.mlp.side_proj" in n for n in p.notes)


def test_layers_to_transform_and_exclude_modules_are_read(model, full, tmp_path):
    only0 = prepare_adapter(_rewrite(full, tmp_path / "l0", layers_to_transform=[0]), model / "base", 16, tmp_path / "o1")
    assert {m.split(".")[0] for m in _modules(only0)} == {"0"}
    pat = prepare_adapter(_rewrite(full, tmp_path / "lp", layers_to_transform=1, layers_pattern="layers"),
                          model / "base", 16, tmp_path / "o2")
    assert {m.split(".")[0] for m in _modules(pat)} == {"1"}
    excl = prepare_adapter(_rewrite(full, tmp_path / "ex", exclude_modules=["down_proj"]), model / "base", 16, tmp_path / "o3")
    assert not any(m.endswith("down_proj") for m in excl.modules)
    rx = prepare_adapter(_rewrite(full, tmp_path / "rx", target_modules=r".*layers\.1\.mlp\.(up|down)_proj"),
                         model / "base", 16, tmp_path / "o4")
    assert _modules(rx) == {"1.mlp.down_proj", "1.mlp.up_proj", "1.mlp.gate_proj"}  # gate zero-filled (packed)


@pytest.mark.parametrize("case,match", [
    ("rank_disagrees", r"rank 8 but the config gives it rank 4 \(r / rank_pattern\)"),
    ("mtp", r"module model\.mtp\.layers\.0\.self_attn\.q_proj: multi-token-prediction"),
    ("two_prefixes", r"adapted twice \(also as model\.language_model\.layers\.0\.mlp\.down_proj\)"),
    ("qkv_and_split", r"layers\.0\.linear_attn\.in_proj_qkv is adapted twice"),
    ("lm_head", r"module lm_head: LoRA maps 128->16, base weight is 64->512"),
    ("pissa", r"config init_lora_weights: 'pissa' rewrites the base weights"),
    ("olora", r"config init_lora_weights: 'olora'"),
    ("alpha_zero", r"all-zero: lora_alpha"),
    ("no_targets", r"config target_modules is empty"),
    ("targets_none", r"the config targets none of the adapter's modules"),
])
def test_refusals_name_the_config_field_or_the_adapters_own_module(model, full, tmp_path, case, match):
    def first(sd, part):
        return next(k for k in sd if f"layers.0.{part}.lora_A" in k)

    def edit(sd):
        k = first(sd, "mlp.down_proj")
        kb = k.replace("lora_A", "lora_B")
        if case == "mtp":
            q = k.replace("model.language_model.layers.0.mlp.down_proj", "model.mtp.layers.0.self_attn.q_proj")
            sd[q], sd[q.replace("lora_A", "lora_B")] = sd[k], sd[kb]
        elif case == "two_prefixes":
            sd[k.replace("model.language_model.", "model.")] = sd[k]
            sd[kb.replace("model.language_model.", "model.")] = sd[kb]
        elif case == "qkv_and_split":
            q = first(sd, "linear_attn.in_proj_qkv")
            sd[q.replace("in_proj_qkv", "in_proj_q")] = sd[q]
            sd[q.replace("in_proj_qkv", "in_proj_q").replace("lora_A", "lora_B")] = sd[q.replace("lora_A", "lora_B")][:8]
        elif case == "lm_head":
            sd["base_model.model.lm_head.lora_A.weight"] = torch.zeros(8, sd[k].shape[1])
            sd["base_model.model.lm_head.lora_B.weight"] = torch.zeros(16, 8)
        return sd

    config = {"rank_disagrees": {"rank_pattern": {"down_proj": 4}}, "pissa": {"init_lora_weights": "pissa"},
              "olora": {"init_lora_weights": "olora"}, "alpha_zero": {"lora_alpha": 0},
              "no_targets": {"target_modules": []}, "targets_none": {"target_modules": ["side_proj"]}}.get(case, {})
    targets = {"mtp": ("q_proj",), "qkv_and_split": ("in_proj_q",), "lm_head": ("lm_head",)}.get(case, ())
    src = _rewrite(full, tmp_path / case, edit, targets=targets, **config)
    with pytest.raises(AdapterError, match=match):
        prepare_adapter(src, model / "base", 32, tmp_path / "out")


def test_identity_covers_the_config(model, full, tmp_path):
    """A config edited in place is a new adapter, even where the weights normalise the same."""
    same = prepare_adapter(_rewrite(full, tmp_path / "a"), model / "base", 16, tmp_path / "o1")
    noted = prepare_adapter(_rewrite(full, tmp_path / "b", base_model_name_or_path="elsewhere"),
                            model / "base", 16, tmp_path / "o2")
    assert same.digest == prepare_adapter(full, model / "base", 16, tmp_path / "o3").digest
    assert noted.digest != same.digest


def test_a_pickle_that_needs_code_is_refused_without_unsafe_advice(model, full, tmp_path):
    import pickle

    class Boom:
        def __reduce__(self):
            return (print, ("ran",))

    src = tmp_path / "pickled"
    src.mkdir()
    (src / "adapter_config.json").write_text((full / "adapter_config.json").read_text())
    (src / "adapter_model.bin").write_bytes(pickle.dumps({"x": Boom()}))
    with pytest.raises(AdapterError) as e:
        prepare_adapter(src, model / "base", 16, tmp_path / "out")
    assert "needs code to load" in str(e.value)
    assert "weights_only" not in str(e.value) and "\x1b" not in str(e.value)


def test_the_output_layer_alone_is_placed(model, full, tmp_path):
    """target_modules=["lm_head"]: PEFT adapts the output layer, and vLLM serves it."""
    def head_only(sd):
        return {"base_model.model.lm_head.lora_A.weight": torch.randn(8, 64),  # hidden 64, vocabulary 512
                "base_model.model.lm_head.lora_B.weight": torch.randn(512, 8)}

    p = prepare_adapter(_rewrite(full, tmp_path / "head", head_only, target_modules=["lm_head"]),
                        model / "base", 16, tmp_path / "o")
    assert p.modules == ["lm_head"]


@pytest.mark.parametrize("cfg,match", [
    ({"lora_alpha": "16"}, r"config lora_alpha: '16' is not a number; PEFT refuses the adapter \(TypeError"),
    ({"alpha_pattern": {"down_proj": None}}, r"config alpha_pattern\['down_proj'\]: None is not a number"),
    ({"peft_type": None}, r"adapter_config.json has no peft_type: PEFT cannot tell"),
])
def test_configs_peft_refuses_are_refused(model, full, tmp_path, cfg, match):
    src = _rewrite(full, tmp_path / "c", **{k: v for k, v in cfg.items() if k != "peft_type"})
    if "peft_type" in cfg:
        data = json.loads((src / "adapter_config.json").read_text())
        del data["peft_type"]
        (src / "adapter_config.json").write_text(json.dumps(data))
    with pytest.raises(AdapterError, match=match):
        prepare_adapter(src, model / "base", 16, tmp_path / "o")


@pytest.mark.parametrize("key,match", [
    ("base_model.model.model.language_model.layers.0.mlp.down_proj.extra",
     r"^tensor model\.language_model\.layers\.0\.mlp\.down_proj\.extra is not a LoRA A/B weight$"),
    ("base_model.model.odd\nkey.lora_A.weight", r"^module odd\\nkey: tensor odd\\nkey\.lora_A\.weight is not"),
    ("base_model.model.model.language_model.layers.0.mlp.down_proj.bias",
     r"^module model\.language_model\.layers\.0\.mlp\.down_proj: tensor .*down_proj\.bias is a copy of its base bias"),
])
def test_stray_tensors_are_named_once_without_control_characters(model, full, tmp_path, key, match):
    src = _rewrite(full, tmp_path / "s", lambda sd: {**sd, key: torch.ones(3)})
    with pytest.raises(AdapterError, match=match) as e:
        prepare_adapter(src, model / "base", 16, tmp_path / "o")
    assert "base_model.model." not in str(e.value) and "\n" not in str(e.value)


def test_unchanged_base_copies_are_left_out_and_changed_ones_refused_by_field(model, full, tmp_path):
    """bias="all" saves every bias of the model (here the vision tower's, untrained): unchanged
    copies load as what is there, so the file is a plain LoRA; a trained one is refused."""
    from safetensors import safe_open

    with safe_open(str(next((model / "base").glob("*.safetensors"))), framework="pt") as sf:
        key = next(k for k in sf.keys() if k.endswith("attn.qkv.bias"))
        bias = sf.get_tensor(key)
    same = _rewrite(full, tmp_path / "same", lambda sd: {**sd, f"base_model.model.{key}": bias.float()}, bias="all")
    p = prepare_adapter(same, model / "base", 16, tmp_path / "o1")
    ref = prepare_adapter(full, model / "base", 16, tmp_path / "o2")
    assert p.modules == ref.modules and any("unchanged copies of base parameters" in n for n in p.notes)
    trained = _rewrite(full, tmp_path / "trained", lambda sd: {**sd, f"base_model.model.{key}": bias.float() + 1},
                       bias="all")
    with pytest.raises(AdapterError, match=r"^config bias: bias='all' saved the base bias model\.visual\."):
        prepare_adapter(trained, model / "base", 16, tmp_path / "o3")
