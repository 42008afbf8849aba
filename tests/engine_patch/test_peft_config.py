"""engine_patch.peft_config decides what PEFT decides: for random configs (targets as a list,
a regex or all-linear, excludes, layer filters, rank and alpha patterns) and every module name
of the served model class, the same targets, ranks and scales as PEFT's own code."""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_patch import peft_config

LM = "model.language_model.layers.{i}.{m}"
LEAVES = ("linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_b", "linear_attn.in_proj_a",
          "linear_attn.out_proj", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
KEYS = [LM.format(i=i, m=m) for i in range(4) for m in LEAVES] + [
    "model.visual.blocks.0.attn.qkv", "model.visual.merger.linear_fc1", "lm_head",
    "model.layers.1.mlp.down_proj",  # an adapter trained on the text-only class
]
SHORT = sorted({m.rsplit(".", 1)[1] for m in LEAVES} | {"qkv", "linear_fc1"})

target_lists = st.lists(st.sampled_from(SHORT + [LM.format(i=2, m="mlp.up_proj")]), min_size=1, max_size=6, unique=True)
regexes = st.sampled_from([r".*\.mlp\.(up|down)_proj", r".*layers\.[02]\..*", r".*(q|v)_proj",
                           r"model\.language_model\.layers\.\d+\.linear_attn\..*", r".*visual.*qkv"])
configs = st.fixed_dictionaries({
    "target_modules": st.one_of(target_lists, regexes, st.just("all-linear")),
    "r": st.integers(1, 16),
    "lora_alpha": st.integers(0, 64),
    "use_rslora": st.booleans(),
}, optional={
    "exclude_modules": st.one_of(st.lists(st.sampled_from(SHORT), max_size=3, unique=True),
                                 st.sampled_from([r".*layers\.1\..*", r".*o_proj"])),
    "layers_to_transform": st.one_of(st.integers(0, 3), st.lists(st.integers(0, 3), max_size=3, unique=True)),
    "layers_pattern": st.sampled_from(["layers", ["blocks", "layers"], "h"]),
    "rank_pattern": st.dictionaries(st.sampled_from(["down_proj", "mlp.up_proj", r"layers\.2\.mlp\.gate_proj", "q_proj"]),
                                    st.integers(1, 16), max_size=3),
    "alpha_pattern": st.dictionaries(st.sampled_from(["down_proj", "in_proj_z", "mlp.down_proj"]),
                                     st.integers(1, 64), max_size=3),
})


def peft_decides(cfg: dict, key: str):
    """PEFT's own answer: is ``key`` a LoRA layer, and with which rank and alpha."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists
    from peft.utils.other import get_pattern_key

    lc = LoraConfig(**cfg)
    if lc.target_modules == "all-linear":
        # _maybe_include_all_linear_layers: every linear module by full name, the output layer left out.
        lc.target_modules = {k for k in KEYS if k != "lm_head"}
    found = check_target_module_exists(lc, key)
    found = bool(found) and type(found).__name__ != "_ExcludedModule"
    r = lc.rank_pattern.get(get_pattern_key(lc.rank_pattern.keys(), key), lc.r)
    alpha = lc.alpha_pattern.get(get_pattern_key(lc.alpha_pattern.keys(), key), lc.lora_alpha)
    return found, r, alpha


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs)
def test_targets_ranks_and_scales_are_peft_s(cfg):
    why = peft_config.refusal(cfg)
    if why:
        if "PEFT refuses the config" in why:
            with pytest.raises(ValueError):
                peft_decides(cfg, KEYS[0])
        return
    for key in KEYS:
        found, r, alpha = peft_decides(cfg, key)
        assert peft_config.targets(cfg, key) == found, (cfg, key)
        assert peft_config.rank(cfg, key) == r, (cfg, key)
        want = alpha / (math.sqrt(r) if cfg["use_rslora"] else r)
        assert peft_config.scale(cfg, key) == pytest.approx(want), (cfg, key)


@pytest.mark.parametrize("cfg,field", [
    ({"target_modules": ["q_proj"], "init_lora_weights": "pissa_niter_4"}, "init_lora_weights"),
    ({"target_modules": ["q_proj"], "init_lora_weights": "loftq"}, "init_lora_weights"),
    ({"target_modules": ["q_proj"], "use_dora": True}, "use_dora"),
    ({"target_modules": ["q_proj"], "r": 0}, "config r"),
    ({"target_modules": ["q_proj"], "rank_pattern": {"q_proj": -1}}, "rank_pattern['q_proj']"),
    ({"target_modules": "(", "r": 4}, "not a regular expression"),
    ({"target_modules": None}, "target_modules"),
])
def test_refusals_name_the_field(cfg, field):
    assert field in (peft_config.refusal(cfg) or "")


@pytest.mark.parametrize("init", [True, False, "gaussian", "eva", "orthogonal"])
def test_plain_inits_are_served(init):
    assert peft_config.refusal({"target_modules": ["q_proj"], "init_lora_weights": init}) is None


@pytest.mark.parametrize("params,key,hit", [
    (["mlp.down_proj.weight"], "model.language_model.layers.0.mlp.down_proj", True),
    (["model.language_model.layers.0.mlp.down_proj.weight"], "model.language_model.layers.0.mlp.down_proj", True),
    (["down_proj.weight"], "model.language_model.layers.0.mlp.down_proj", True),
    (["mlp.down_proj.weight"], "model.language_model.layers.0.mlp.up_proj", False),
    (["p.down_proj.weight"], "model.language_model.layers.0.mlp.down_proj", False),  # dot boundary, as PEFT
])
def test_target_parameters_name_a_modules_weight_as_peft_matches_them(params, key, hit):
    cfg = {"target_modules": None, "target_parameters": params}
    assert peft_config.refusal(cfg) is None
    assert peft_config.targets(cfg, key) is hit and peft_config.by_module(cfg, key) is False


@pytest.mark.parametrize("cfg,words", [
    ({"target_parameters": ["mlp.experts.gate_up_proj"]}, "config target_parameters: 'mlp.experts.gate_up_proj'"),
    ({"target_modules": ["q_proj"], "lora_alpha": "16"}, "config lora_alpha: '16' is not a number"),
    ({"target_modules": ["q_proj"], "lora_alpha": None}, "config lora_alpha: None is not a number"),
    ({"target_modules": ["q_proj"], "alpha_pattern": {"q_proj": "2"}}, "config alpha_pattern['q_proj']: '2'"),
])
def test_configs_peft_refuses_name_the_field(cfg, words):
    assert words in (peft_config.refusal(cfg) or "")


def test_a_bias_setting_alone_is_no_refusal():
    """bias="all"/"lora_only" is judged by the tensors the file holds (engine_patch.adapters)."""
    assert peft_config.refusal({"target_modules": ["q_proj"], "bias": "all"}) is None
