"""Build a tiny random-weight Qwen3.5 vision-language model and one LoRA adapter per scenario.

The model has the real ``Qwen3_5ForConditionalGeneration`` architecture (Gated-DeltaNet
"linear_attention" layers and gated "full_attention" layers in Qwen's 3:1 pattern, mRoPE,
a vision tower with patch 16 / spatial merge 2 / temporal patch 2) at toy sizes, so the
whole serving path (chat template, video processor, vLLM's hybrid KV/state cache, the GDN
packed projections and multi-LoRA) runs on a laptop CPU in seconds. Nothing is downloaded.

    python -m testmodels.tiny --out var/tiny-model [--scenarios-file scenarios.yaml]

Layout::

    out/base/                 config.json, model.safetensors (bf16), tokenizer, chat template,
                              generation_config.json, preprocessor_config.json,
                              video_preprocessor_config.json
    out/adapters/<scenario>/  PEFT adapter_config.json + adapter_model.safetensors
    out/.tiny-model-stamp     build parameters; a second build with the same ones is a no-op

Everything is seeded, so two builds with the same parameters give byte-identical weights.
The adapters' B matrices are random, not PEFT's zeros: an adapter that changes nothing
cannot tell a working LoRA path from a silently broken one (vLLM #49354), which is exactly
what the tests and engine_patch's self-checks need to see.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_SCENARIOS = ["artifact_identification", "tomb_structure", "murals_inscriptions"]

# Bump when the build changes in a way the parameters below do not capture
# (library versions, say); edits to this file are captured by its hash.
BUILD_VERSION = 1
SEED = 1234
LORA_RANK = 8
LORA_ALPHA = 16
# Size of each adapter's update relative to the base weight (Frobenius norm ratio).
# Large enough that greedy tokens change on a random model, small enough to stay finite.
LORA_DELTA_RATIO = 0.5

GDN_MODULES = ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"]
ATTN_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP_MODULES = ["gate_proj", "up_proj", "down_proj"]
LORA_TARGETS = GDN_MODULES + ATTN_MODULES + MLP_MODULES

# Qwen's special tokens, in Qwen's order (ids follow the base vocabulary).
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]
# Not "special" in Qwen's tokenizer (they survive skip_special_tokens), but single tokens.
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]

TEXT_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_5_text",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "full_attention_interval": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,  # the CPU GDN kernel only takes 128 (as the real models)
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "attn_output_gate": True,
    "attention_bias": False,
    "tie_word_embeddings": False,
    # Same shape as the real checkpoints: partial rotary, interleaved mRoPE (t, h, w).
    # rotary dim = 64 * 0.25 = 16 -> 8 frequencies = 3 + 3 + 2.
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10_000_000,
        "partial_rotary_factor": 0.25,
        "mrope_section": [3, 3, 2],
        "mrope_interleaved": True,
    },
    "initializer_range": 0.02,
    "dtype": "bfloat16",
}

VISION_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_5_vision",
    "depth": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 2,
    "in_channels": 3,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 64,  # = text hidden_size
    "num_position_embeddings": 256,  # a square: 16 x 16 learned grid, interpolated
    "hidden_act": "gelu_pytorch_tanh",
    "initializer_range": 0.02,
}

# Pixel budgets: Qwen's real values are far larger; these keep a test video at ~100-200
# visual tokens so CPU LoRA stays fast. The frame sampler decides real frame sizes.
IMAGE_SIZE = {"shortest_edge": 32 * 32 * 4, "longest_edge": 448 * 448}
VIDEO_SIZE = {"shortest_edge": 32 * 32 * 4, "longest_edge": 16 * 224 * 224}

# Qwen3-VL / Qwen3.5 chat template, without tool calling. Video items render as
# <|vision_start|><|video_pad|><|vision_end|>, which the processor expands per frame with
# "<t seconds>" timestamps. ``enable_thinking=false`` closes an empty think block, as Qwen3.5.
CHAT_TEMPLATE = r"""{%- set image_count = namespace(value=0) -%}
{%- set video_count = namespace(value=0) -%}
{%- macro render_content(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- else -%}
        {%- for item in content -%}
            {%- if item.type == 'image' or 'image' in item or 'image_url' in item -%}
                {%- set image_count.value = image_count.value + 1 -%}
                {%- if add_vision_id is defined and add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                <|vision_start|><|image_pad|><|vision_end|>
            {%- elif item.type == 'video' or 'video' in item or 'video_url' in item -%}
                {%- set video_count.value = video_count.value + 1 -%}
                {%- if add_vision_id is defined and add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                <|vision_start|><|video_pad|><|vision_end|>
            {%- elif 'text' in item -%}
                {{- item.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- for message in messages -%}
    {{- '<|im_start|>' + message.role + '\n' -}}
    {{- render_content(message.content) -}}
    {{- '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if enable_thinking is defined and enable_thinking is false -%}
        {{- '<think>\n\n</think>\n\n' -}}
    {%- endif -%}
{%- endif -%}
"""

# A fixed corpus for the byte-level BPE merges: deterministic, and it makes ordinary
# English and JSON into multi-byte tokens so prompts stay short.
_CORPUS = """
You are a careful archaeologist. Describe the video. Identify the artifact, its material,
period and condition. Describe the tomb structure: chambers, corridors, vaults, walls, doors.
Read the murals and inscriptions; transcribe visible text; note pigments and damage.
Answer in JSON with keys "summary", "objects", "confidence", "timestamps", "notes".
The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 10 seconds frame video
image scene camera light stone bronze jade pottery ceramic gold silver wood painting.
{"summary": "", "objects": [], "confidence": 0.5, "notes": null, "true": false}
artifact_identification tomb_structure murals_inscriptions system user assistant
"""
BPE_VOCAB = 448  # base tokens (256 bytes + merges); specials and padding come on top
VOCAB_MULTIPLE = 64


def _build_params(scenarios: list[str]) -> dict[str, Any]:
    return {
        "build_version": BUILD_VERSION,
        "seed": SEED,
        "text": TEXT_CONFIG,
        "vision": VISION_CONFIG,
        "lora": {"rank": LORA_RANK, "alpha": LORA_ALPHA, "ratio": LORA_DELTA_RATIO,
                 "targets": LORA_TARGETS},
        "bpe_vocab": BPE_VOCAB,
        "image_size": IMAGE_SIZE,
        "video_size": VIDEO_SIZE,
        "chat_template": hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest(),
        "scenarios": sorted(scenarios),
        # Any edit to this file rebuilds: the code is part of what the stamp vouches for.
        "source": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
    }


# -- tokenizer ------------------------------------------------------------------------------


def build_tokenizer(corpus: str = _CORPUS, bpe_vocab: int = BPE_VOCAB):
    """Byte-level BPE with Qwen's pre-tokenizer, special tokens and chat template, its merges
    learnt from ``corpus`` (deterministic: the same corpus gives the same vocabulary)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    # Qwen2/3's split regex (the Qwen3.5 tokenizer class uses this exact one).
    split = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
        r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_vocab,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator([corpus] * 4, trainer=trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.add_tokens(ADDED_TOKENS)
    # Pad to a round vocabulary with reserved special tokens, as Qwen's vocab is padded.
    n = tok.get_vocab_size(with_added_tokens=True)
    padded = -(-n // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    tok.add_special_tokens([f"<|reserved_{i}|>" for i in range(padded - n)])

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        model_max_length=262144,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


# -- model ----------------------------------------------------------------------------------


def config_fields(tok, text_config: dict[str, Any], vision_config: dict[str, Any]) -> dict[str, Any]:
    """What a Qwen3.5-family config takes from the tokenizer (vocabulary size and special token
    ids), with these text and vision settings: shared by the dense and the MoE tiny models."""
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    text = dict(text_config, vocab_size=len(tok), eos_token_id=ids["<|im_end|>"],
                bos_token_id=None, pad_token_id=ids["<|endoftext|>"])
    return dict(
        text_config=text,
        vision_config=dict(vision_config),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
        dtype="bfloat16",
    )


def model_config(tok, text_config: dict[str, Any] = TEXT_CONFIG,
                 vision_config: dict[str, Any] = VISION_CONFIG):
    """The ``Qwen3_5Config`` for ``tok`` with these text and vision settings."""
    from transformers import Qwen3_5Config

    fields = config_fields(tok, text_config, vision_config)
    fields["text_config"].pop("full_attention_interval", None)
    return Qwen3_5Config(**fields, architectures=["Qwen3_5ForConditionalGeneration"])


def widen_lm_head(model, seed: int) -> None:
    """Random weights give near-uniform logits; a wide lm_head makes greedy decoding decisive,
    so that a working adapter flips tokens instead of nudging logprobs in the third digit.
    The embeddings stay at 0.02 so the layers (and their LoRA deltas) dominate the residual."""
    import torch

    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        head = model.lm_head.weight
        head.copy_(torch.randn(head.shape, generator=g) * 0.5)


def _build_model(config):
    import torch
    from transformers import Qwen3_5ForConditionalGeneration

    torch.manual_seed(SEED)
    model = Qwen3_5ForConditionalGeneration(config)
    widen_lm_head(model, SEED + 1)
    return model.to(torch.bfloat16).eval()


def write_processor_configs(base: Path) -> None:
    """Write the image and video processor configs as Qwen ships them (mean/std 0.5)."""
    common = {
        "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "rescale_factor": 1 / 255, "resample": 3,
        "patch_size": VISION_CONFIG["patch_size"],
        "temporal_patch_size": VISION_CONFIG["temporal_patch_size"],
        "merge_size": VISION_CONFIG["spatial_merge_size"],
        "processor_class": "Qwen3VLProcessor",
    }
    image = dict(common, size=IMAGE_SIZE, image_processor_type="Qwen2VLImageProcessor")
    video = dict(
        common, size=VIDEO_SIZE, video_processor_type="Qwen3VLVideoProcessor",
        # Frames arrive pre-sampled (timestamps chosen by vidlora's sampler); never resample.
        do_sample_frames=False, fps=2, min_frames=2, max_frames=768,
        cap_pixels_per_frame=False,
    )
    (base / "preprocessor_config.json").write_text(json.dumps(image, indent=2) + "\n")
    (base / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2) + "\n")


def write_generation_config(base: Path, tok) -> None:
    cfg = {
        "bos_token_id": None,
        "eos_token_id": [tok.convert_tokens_to_ids("<|im_end|>"),
                         tok.convert_tokens_to_ids("<|endoftext|>")],
        "pad_token_id": tok.convert_tokens_to_ids("<|endoftext|>"),
        "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
    }
    (base / "generation_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


# -- adapters -------------------------------------------------------------------------------


def _build_adapter(model, name: str, index: int, out_dir: Path) -> None:
    """Wrap ``model`` with a rank-8 PEFT LoRA, randomise B, save, and unwrap again."""
    import torch
    from peft import LoraConfig, get_peft_model

    # PEFT's suffix match on these names reaches only the language model: the vision tower
    # names its layers attn.qkv / attn.proj / linear_fc1 / linear_fc2. Checked after saving.
    cfg = LoraConfig(
        r=LORA_RANK, lora_alpha=LORA_ALPHA, lora_dropout=0.0, bias="none",
        target_modules=list(LORA_TARGETS), task_type="CAUSAL_LM",
    )
    seed = SEED + 1000 * (index + 1)
    torch.manual_seed(seed)  # PEFT's kaiming init of A draws from the global generator
    peft_model = get_peft_model(model, cfg, adapter_name="default")
    g = torch.Generator().manual_seed(seed + 1)
    scale = LORA_ALPHA / LORA_RANK
    with torch.no_grad():
        for mod_name, mod in peft_model.named_modules():
            if not hasattr(mod, "lora_B") or "default" not in getattr(mod, "lora_B", {}):
                continue
            a = mod.lora_A["default"].weight.float()
            b = mod.lora_B["default"].weight
            w = mod.get_base_layer().weight.float()
            rnd = torch.randn(b.shape, generator=g)
            delta = scale * (rnd @ a)
            ratio = LORA_DELTA_RATIO * w.norm() / delta.norm().clamp_min(1e-12)
            b.copy_((rnd * ratio).to(b.dtype))
    out_dir.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(out_dir), safe_serialization=True)
    peft_model.unload()  # restores the plain model for the next adapter
    # PEFT keeps target_modules as a set: sort it so the file is the same on every build.
    # Its model card README carries nothing we need and is dropped for the same reason.
    cfg_path = out_dir / "adapter_config.json"
    acfg = json.loads(cfg_path.read_text())
    acfg["target_modules"] = sorted(acfg["target_modules"])
    cfg_path.write_text(json.dumps(acfg, indent=2, sort_keys=True) + "\n")
    (out_dir / "README.md").unlink(missing_ok=True)


def _check_adapter(path: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(path / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
        bad = [k for k in keys if "language_model" not in k]
        if bad:
            raise RuntimeError(f"adapter {path.name} reaches outside the language model: {bad[:3]}")
        for k in keys:
            t = f.get_tensor(k)
            if not t.float().isfinite().all():
                raise RuntimeError(f"adapter {path.name}: non-finite {k}")
            if "lora_B" in k and t.abs().max() == 0:
                raise RuntimeError(f"adapter {path.name}: zero {k}")
    found = {k.split(".lora_")[0].rsplit(".", 1)[-1] for k in keys}
    if found != set(LORA_TARGETS):
        raise RuntimeError(f"adapter {path.name}: targets {sorted(found)} != {LORA_TARGETS}")


# -- entry points ---------------------------------------------------------------------------


def scenario_names(scenarios_file: Path | None) -> list[str]:
    """Adapter names to build, from a scenarios YAML.

    vidlora's format is ``{"scenarios": [{"name": ..., "adapter": ...}, ...]}`` with
    ``adapter`` relative to the adapter root; a bare list of names or a name -> entry mapping
    is accepted too. An entry without an adapter needs none; one whose adapter is an
    absolute or nested path points at real weights, which this script must not shadow.
    """
    if scenarios_file is None:
        return list(DEFAULT_SCENARIOS)
    import yaml

    data = yaml.safe_load(Path(scenarios_file).read_text()) or {}
    if isinstance(data, dict) and "scenarios" in data:
        data = data["scenarios"]
    if isinstance(data, dict):
        data = [dict(v or {}, name=k) for k, v in data.items()]
    names: list[str] = []
    for item in data:
        if not isinstance(item, dict):
            names.append(str(item))
            continue
        adapter = item.get("adapter", item.get("name")) if "adapter" in item or \
            "prompt" not in item else None
        if not adapter:
            continue
        if Path(str(adapter)).is_absolute() or len(Path(str(adapter)).parts) != 1:
            log.info("scenario %s: adapter %s is not a tiny-model adapter; skipped",
                     item.get("name"), adapter)
            continue
        if adapter not in names:
            names.append(str(adapter))
    if not names:
        raise ValueError(f"no adapters to build for {scenarios_file}")
    return names


def _default_out() -> Path:
    try:
        from vidlora.config import get_settings

        return Path(get_settings().var_dir) / "tiny-model"
    except Exception:  # settings unavailable (bare checkout): the documented default
        return Path("var/tiny-model")


def _default_scenarios_file() -> Path | None:
    try:
        from vidlora.config import get_settings

        path = Path(get_settings().scenarios_file)
        return path if path.is_file() else None
    except Exception:
        return None


def build(out: Path, scenarios: list[str] | None = None, force: bool = False) -> Path:
    """Build the tiny model into ``out`` (idempotent); returns ``out/base``."""
    out = Path(out)
    scenarios = list(scenarios or DEFAULT_SCENARIOS)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Several test sessions may build the same tree at once: one builds, the others wait
    # and then find the stamp.
    import fcntl

    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(out, scenarios, force)


def _readable_by_all(root: Path) -> None:
    """Weights are data every worker reads, whatever its uid: the compose stack's containers
    bind-mount this tree and run as uid 10001, and safetensors writes its files 0600."""
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        want = mode | (0o555 if path.is_dir() else 0o444)
        if want != mode:
            path.chmod(want)


def _build_locked(out: Path, scenarios: list[str], force: bool) -> Path:
    params = _build_params(scenarios)
    stamp = out / ".tiny-model-stamp"
    base = out / "base"
    if not force and stamp.exists():
        try:
            have = json.loads(stamp.read_text())
        except ValueError:
            have = {}
        # Up to date if built by the same code and parameters with at least these adapters
        # (so callers asking for a subset do not rebuild the tree back and forth).
        wanted = dict(params, scenarios=None)
        if (dict(have, scenarios=None) == wanted
                and set(params["scenarios"]) <= set(have.get("scenarios") or [])):
            log.info("tiny model already built at %s", out)
            _readable_by_all(out)
            return base

    t0 = time.perf_counter()
    import torch

    # Build next to the target and swap in, so a crash never leaves a half-written model
    # behind a stale stamp.
    tmp = out.with_name(out.name + ".tmp-build")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "base").mkdir(parents=True)

    with torch.random.fork_rng(devices=[]):
        tok = build_tokenizer()
        config = model_config(tok)
        model = _build_model(config)
        model.save_pretrained(str(tmp / "base"), safe_serialization=True)
        tok.save_pretrained(str(tmp / "base"))
        write_processor_configs(tmp / "base")
        write_generation_config(tmp / "base", tok)
        for i, name in enumerate(sorted(scenarios)):
            adir = tmp / "adapters" / name
            _build_adapter(model, name, i, adir)
            _check_adapter(adir)

    (tmp / ".tiny-model-stamp").write_text(json.dumps(params, indent=2, sort_keys=True) + "\n")
    publish(tmp, out)
    log.info("built tiny model in %s (%.1fs)", out, time.perf_counter() - t0)
    return out / "base"


def publish(tmp: Path, out: Path) -> None:
    """Make the finished build in `tmp` readable by all and put it at `out`. Two renames, so a
    process reading the old tree (an engine loading an adapter lazily) sees it vanish for
    microseconds, not for the length of an rmtree."""
    _readable_by_all(tmp)
    old = out.with_name(out.name + ".old-build")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="default: <var_dir>/tiny-model, where the settings look for it")
    parser.add_argument("--scenarios-file", type=Path, default=None,
                        help="build one adapter per scenario adapter in it (default: the "
                             "configured scenarios.yaml if present, else the 3 built-ins)")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    t0 = time.perf_counter()
    out = args.out or _default_out()
    names = scenario_names(args.scenarios_file or _default_scenarios_file())
    base = build(out, names, force=args.force)
    print(f"{base} ({time.perf_counter() - t0:.1f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
