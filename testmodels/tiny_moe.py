"""Build a tiny random-weight Qwen3.5/3.6 MoE vision-language model and PEFT adapters for it.

The MoE sibling of `testmodels.tiny`: the real ``Qwen3_5MoeForConditionalGeneration``
architecture (transformers model type ``qwen3_5_moe``, the one Qwen3.5-35B-A3B and
Qwen3.6-35B-A3B ship as; vLLM serves it with the class of the same name), Gated-DeltaNet and
gated full-attention layers in Qwen's 3:1 pattern, and in every layer a sparse MoE block:
a top-k router (``mlp.gate``), routed experts (``mlp.experts``, per expert gate/up/down in
the checkpoint, fused 3-D in transformers), a shared expert (``mlp.shared_expert``) and its
sigmoid gate (``mlp.shared_expert_gate``). Toy sizes (4 layers, 4 experts, 2 active), the
dense tiny model's tokenizer, chat template and processor configs. Nothing is downloaded.

    python -m testmodels.tiny_moe --out var/tiny-moe-model

Layout::

    out/base/                    config.json, model.safetensors (bf16), tokenizer, processor configs
    out/adapters/attn_gdn/       LoRA on the GDN and attention projections (what a MoE base serves)
    out/adapters/attn_gdn_b/     a second one (mixed batches of two adapters)
    out/adapters/shared_expert/  the dense tiny model's target list (gate/up/down_proj): on this
                                 architecture PEFT puts it on the shared expert
    out/adapters/experts/        LoRA on the routed experts' fused weights (PEFT target_parameters)
    out/.tiny-moe-model-stamp    build parameters; a second build with the same ones is a no-op

As in the dense tiny model the adapters' B matrices are random (an adapter that changes
nothing cannot tell a working LoRA path from a dropped one) and everything is seeded.
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

from testmodels import tiny as dense

log = logging.getLogger(__name__)

BUILD_VERSION = 1
SEED = 4321

# The dense tiny model's text shape with its MLP replaced by a sparse MoE block. The expert
# and shared-expert widths are the real ratio (Qwen3.5-35B-A3B: 512 and 512 at hidden 2048).
TEXT_CONFIG: dict[str, Any] = {
    **{k: v for k, v in dense.TEXT_CONFIG.items() if k not in ("intermediate_size", "full_attention_interval")},
    "model_type": "qwen3_5_moe_text",
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
}
VISION_CONFIG: dict[str, Any] = {**dense.VISION_CONFIG, "model_type": "qwen3_5_moe_vision"}

# adapter name -> PEFT LoraConfig fields (beyond rank, alpha and dropout).
ADAPTERS: dict[str, dict[str, Any]] = {
    "attn_gdn": {"target_modules": dense.GDN_MODULES + dense.ATTN_MODULES},
    "attn_gdn_b": {"target_modules": dense.GDN_MODULES + dense.ATTN_MODULES},
    "shared_expert": {"target_modules": list(dense.MLP_MODULES)},
    "experts": {"target_modules": [], "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]},
}


def _build_params() -> dict[str, Any]:
    return {
        "build_version": BUILD_VERSION,
        "seed": SEED,
        "text": TEXT_CONFIG,
        "vision": VISION_CONFIG,
        "lora": {"rank": dense.LORA_RANK, "alpha": dense.LORA_ALPHA, "ratio": dense.LORA_DELTA_RATIO},
        "adapters": ADAPTERS,
        # Edits to either file rebuild: the tokenizer and processor configs come from the dense one.
        "source": hashlib.sha256(Path(__file__).read_bytes() + Path(dense.__file__).read_bytes()).hexdigest(),
    }


def model_config(tok, text_config: dict[str, Any] = TEXT_CONFIG, vision_config: dict[str, Any] = VISION_CONFIG):
    """The ``Qwen3_5MoeConfig`` for ``tok`` (vocabulary size and special token ids from it)."""
    from transformers import Qwen3_5MoeConfig

    return Qwen3_5MoeConfig(**dense.config_fields(tok, text_config, vision_config),
                            architectures=["Qwen3_5MoeForConditionalGeneration"])


def _build_model(config):
    import torch
    from transformers import Qwen3_5MoeForConditionalGeneration

    torch.manual_seed(SEED)
    model = Qwen3_5MoeForConditionalGeneration(config)
    with torch.no_grad():
        g = torch.Generator().manual_seed(SEED + 1)
        # A wide lm_head makes greedy decoding decisive (testmodels.tiny says why).
        model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape, generator=g) * 0.5)
        # transformers initialises the router to zeros: every expert would score the same and
        # top-k would pick by index. A random router makes routing depend on the token, as in a
        # trained model, so a wrong expert choice shows in the output.
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
    return model.to(torch.bfloat16).eval()


def _build_adapter(model, out_dir: Path, seed: int, fields: dict[str, Any]) -> None:
    """Wrap ``model`` with a PEFT LoRA, randomise B to a fixed share of each base weight, save,
    unwrap."""
    import torch
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=dense.LORA_RANK, lora_alpha=dense.LORA_ALPHA, lora_dropout=0.0, bias="none",
                     task_type="CAUSAL_LM", **fields)
    torch.manual_seed(seed)  # PEFT's init of A draws from the global generator
    peft_model = get_peft_model(model, cfg, adapter_name="default")
    g = torch.Generator().manual_seed(seed + 1)
    scale = dense.LORA_ALPHA / dense.LORA_RANK
    with torch.no_grad():
        for _, mod in peft_model.named_modules():
            if "default" not in getattr(mod, "lora_B", {}):
                continue
            a = mod.lora_A["default"].weight.float()
            b = mod.lora_B["default"].weight
            rnd = torch.randn(b.shape, generator=g)
            base = getattr(mod.get_base_layer(), "weight", None)
            if base is None or base.dim() != 2:
                b.copy_((rnd * 0.05).to(b.dtype))  # a fused 3-D expert weight: a plain small update
                continue
            delta = scale * (rnd @ a)
            b.copy_((rnd * dense.LORA_DELTA_RATIO * base.float().norm() / delta.norm().clamp_min(1e-12)).to(b.dtype))
    out_dir.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(out_dir), safe_serialization=True)
    peft_model.unload()
    cfg_path = out_dir / "adapter_config.json"
    acfg = json.loads(cfg_path.read_text())
    for key in ("target_modules", "target_parameters"):  # PEFT keeps sets: same file every build
        if isinstance(acfg.get(key), list):
            acfg[key] = sorted(acfg[key])
    cfg_path.write_text(json.dumps(acfg, indent=2, sort_keys=True) + "\n")
    (out_dir / "README.md").unlink(missing_ok=True)


def _check_adapter(path: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(path / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
        if not keys:
            raise RuntimeError(f"adapter {path.name} has no tensors")
        for k in keys:
            if "language_model" not in k:
                raise RuntimeError(f"adapter {path.name} reaches outside the language model: {k}")
            t = f.get_tensor(k)
            if not t.float().isfinite().all() or ("lora_B" in k and t.abs().max() == 0):
                raise RuntimeError(f"adapter {path.name}: non-finite or zero {k}")


def build(out: Path, force: bool = False) -> Path:
    """Build the tiny MoE model and its adapters into ``out`` (idempotent); returns ``out/base``."""
    import fcntl

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(out, force)


def _build_locked(out: Path, force: bool) -> Path:
    params = _build_params()
    stamp = out / ".tiny-moe-model-stamp"
    if not force and stamp.exists():
        try:
            if json.loads(stamp.read_text()) == json.loads(json.dumps(params)):
                return out / "base"
        except ValueError:
            pass
    import torch

    t0 = time.perf_counter()
    tmp = out.with_name(out.name + ".tmp-build")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "base").mkdir(parents=True)
    with torch.random.fork_rng(devices=[]):
        tok = dense.build_tokenizer()
        model = _build_model(model_config(tok))
        model.save_pretrained(str(tmp / "base"), safe_serialization=True)
        tok.save_pretrained(str(tmp / "base"))
        dense.write_processor_configs(tmp / "base")
        dense.write_generation_config(tmp / "base", tok)
        for i, (name, fields) in enumerate(sorted(ADAPTERS.items())):
            _build_adapter(model, tmp / "adapters" / name, SEED + 1000 * (i + 1), fields)
            _check_adapter(tmp / "adapters" / name)
    stamp_tmp = tmp / stamp.name
    stamp_tmp.write_text(json.dumps(params, indent=2, sort_keys=True) + "\n")
    dense.publish(tmp, out)
    log.info("built tiny MoE model in %s (%.1fs)", out, time.perf_counter() - t0)
    return out / "base"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("var/tiny-moe-model"))
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    t0 = time.perf_counter()
    base = build(args.out, force=args.force)
    print(f"{base} ({time.perf_counter() - t0:.1f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
