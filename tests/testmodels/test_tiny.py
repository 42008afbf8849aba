"""The tiny Qwen3.5 model and its adapters: layout, architecture, determinism, and that each
adapter really changes the model (checked with transformers + PEFT, no vLLM needed)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from testmodels import tiny

SCENARIOS = ["artifact_identification", "tomb_structure", "murals_inscriptions"]


def _tree_hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "tiny-model"
    t0 = time.perf_counter()
    tiny.build(out, SCENARIOS)
    assert time.perf_counter() - t0 < 60, "the tiny model must build in seconds"
    return out


def test_layout(built: Path) -> None:
    base = built / "base"
    for name in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "chat_template.jinja", "generation_config.json", "preprocessor_config.json",
                 "video_preprocessor_config.json"]:
        assert (base / name).is_file(), name
    for s in SCENARIOS:
        assert (built / "adapters" / s / "adapter_config.json").is_file()
        assert (built / "adapters" / s / "adapter_model.safetensors").is_file()


def test_config_is_real_qwen35_architecture(built: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(built / "base")
    assert cfg.model_type == "qwen3_5"
    assert cfg.architectures == ["Qwen3_5ForConditionalGeneration"]
    text = cfg.text_config
    assert text.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    assert cfg.vision_config.patch_size == 16
    assert cfg.vision_config.spatial_merge_size == 2
    assert cfg.vision_config.temporal_patch_size == 2
    assert cfg.vision_config.out_hidden_size == text.hidden_size
    tok = AutoTokenizer.from_pretrained(built / "base")
    assert len(tok) == text.vocab_size
    assert cfg.video_token_id == tok.convert_tokens_to_ids("<|video_pad|>")
    assert cfg.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")
    assert cfg.vision_start_token_id == tok.convert_tokens_to_ids("<|vision_start|>")
    assert cfg.vision_end_token_id == tok.convert_tokens_to_ids("<|vision_end|>")
    for t in ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>"]:
        assert len(tok.encode(t, add_special_tokens=False)) == 1, t


def test_weight_names(built: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(built / "base" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        dtypes = {f.get_slice(k).get_dtype() for k in keys}
    assert "lm_head.weight" in keys
    assert any(k.startswith("model.visual.") for k in keys)
    assert "model.language_model.layers.0.linear_attn.in_proj_qkv.weight" in keys
    assert "model.language_model.layers.0.linear_attn.in_proj_ba.weight" not in keys
    assert "model.language_model.layers.3.self_attn.q_proj.weight" in keys
    assert all(k.startswith(("model.language_model.", "model.visual.", "lm_head.")) for k in keys)
    assert dtypes == {"BF16"}


def test_adapters(built: Path) -> None:
    from safetensors import safe_open

    seen = set()
    for s in SCENARIOS:
        path = built / "adapters" / s
        cfg = json.loads((path / "adapter_config.json").read_text())
        assert cfg["r"] == 8 and cfg["peft_type"] == "LORA"
        assert sorted(cfg["target_modules"]) == sorted(tiny.LORA_TARGETS)
        with safe_open(str(path / "adapter_model.safetensors"), "pt") as f:
            keys = list(f.keys())
            assert all(".language_model." in k for k in keys)
            b = f.get_tensor(next(k for k in keys if k.endswith("in_proj_z.lora_B.weight")))
            assert b.abs().max() > 0  # not PEFT's zero init
            seen.add(hashlib.sha256(b.float().numpy().tobytes()).hexdigest())
        modules = {k.split(".lora_")[0].rsplit(".", 1)[-1] for k in keys}
        assert modules == set(tiny.LORA_TARGETS)
    assert len(seen) == len(SCENARIOS)  # each adapter is different


def test_idempotent_and_deterministic(built: Path, tmp_path: Path) -> None:
    before = _tree_hashes(built)
    t0 = time.perf_counter()
    tiny.build(built, SCENARIOS)
    assert time.perf_counter() - t0 < 1.0  # stamp matched: nothing rebuilt
    assert _tree_hashes(built) == before
    other = tiny.build(tmp_path / "again", SCENARIOS).parent
    assert _tree_hashes(other) == before


def test_scenarios_file(tmp_path: Path) -> None:
    f = tmp_path / "scenarios.yaml"
    f.write_text(
        "scenarios:\n"
        "  - {name: a, prompt: x, adapter: a}\n"
        "  - {name: b, prompt: x, adapter: b_lora}\n"
        "  - {name: c, prompt: x}\n"  # no adapter: nothing to build
        "  - {name: d, prompt: x, adapter: /real/weights/d}\n"  # real weights: not ours
    )
    assert tiny.scenario_names(f) == ["a", "b_lora"]
    f.write_text("scenarios: [a, b]\n")
    assert tiny.scenario_names(f) == ["a", "b"]
    assert tiny.scenario_names(None) == SCENARIOS
    root = Path(tiny.__file__).resolve().parent.parent
    if (root / "scenarios.yaml").is_file():  # the project's own file
        assert set(tiny.scenario_names(root / "scenarios.yaml")) >= set(SCENARIOS)


def test_processor_renders_video(built: Path) -> None:
    import numpy as np
    from transformers import AutoProcessor
    from transformers.video_utils import VideoMetadata

    proc = AutoProcessor.from_pretrained(built / "base")
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Hi"}]}]
    prompt = proc.tokenizer.apply_chat_template(messages, tokenize=False,
                                                add_generation_prompt=True)
    assert "<|vision_start|><|video_pad|><|vision_end|>Hi<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    frames = np.random.default_rng(0).integers(0, 255, (4, 64, 64, 3), dtype=np.uint8)
    md = VideoMetadata(fps=2.0, duration=2.0, total_num_frames=4, frames_indices=[0, 1, 2, 3],
                       video_backend="opencv")
    out = proc(text=[prompt], videos=[frames], video_metadata=[md], do_sample_frames=False,
               return_tensors="pt")
    assert out["video_grid_thw"].tolist() == [[2, 4, 4]]
    text = proc.tokenizer.decode(out["input_ids"][0])
    assert "<0.2 seconds>" in text and "<1.2 seconds>" in text


def test_adapters_change_transformers_output(built: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(built / "base")
    ids = torch.tensor([tok.encode("Describe the tomb structure and the murals.")])
    model = Qwen3_5ForConditionalGeneration.from_pretrained(built / "base",
                                                            dtype=torch.float32).eval()
    with torch.no_grad():
        base = model(input_ids=ids).logits
    assert torch.isfinite(base).all()
    outs = []
    for s in SCENARIOS:
        peft = PeftModel.from_pretrained(model, str(built / "adapters" / s)).eval()
        with torch.no_grad():
            logits = peft(input_ids=ids).logits
        assert torch.isfinite(logits).all()
        # Visible: the greedy next token moves at some position, not just the logits.
        assert (logits.argmax(-1) != base.argmax(-1)).any(), s
        outs.append(logits)
        model = peft.unload()
    assert not torch.allclose(outs[0], outs[1])
