"""Tiny model + adapters the engine tests use (derived adapters built into a temp dir)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "var" / "tiny-model"
TINY_MOE = REPO / "var" / "tiny-moe-model"


def tiny_model() -> Path:
    """var/tiny-model (built with testmodels.tiny when missing)."""
    if not (TINY / "base" / "config.json").exists():
        from testmodels.tiny import build

        build(TINY)
    return TINY


def tiny_moe_model() -> Path:
    """var/tiny-moe-model (built with testmodels.tiny_moe when missing or stale)."""
    from testmodels.tiny_moe import build

    build(TINY_MOE)
    return TINY_MOE


def full_adapters(root: Path) -> list[Path]:
    return sorted(p for p in (root / "adapters").iterdir() if (p / "adapter_config.json").exists())


def derive(src: Path, dst: Path, keep: tuple[str, ...] | None = None,
           blow_up: str | None = None, targets: list[str] | None = None) -> Path:
    """Copy a PEFT adapter keeping only modules in `keep`; fill `blow_up`'s lora_B with NaN
    (an adapter that yields non-finite values; vLLM itself loads it without a check)."""
    import torch
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    sd = load_file(str(src / "adapter_model.safetensors"))
    if keep is not None:
        sd = {k: v for k, v in sd.items() if any(f".{m}." in k for m in keep)}
    if blow_up is not None:
        hits = [k for k in sd if blow_up in k and "lora_B" in k]
        assert hits, blow_up
        for k in hits:
            sd[k] = torch.full_like(sd[k], float("nan"))
    save_file(sd, str(dst / "adapter_model.safetensors"))
    cfg = json.loads((src / "adapter_config.json").read_text())
    if targets is not None or keep is not None:
        cfg["target_modules"] = list(targets or keep or [])
    (dst / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
    return dst


def scenario_adapters(out: Path) -> dict[str, Path]:
    """A, B: full adapters; zonly: only in_proj_z; boom: A with a blown-up layer-0 down_proj."""
    root = tiny_model()
    full = full_adapters(root)
    if out.exists():
        shutil.rmtree(out)
    return {
        "A": full[0],
        "B": full[1],
        "zonly": derive(full[0], out / "zonly", keep=("in_proj_z",)),
        "boom": derive(full[0], out / "boom", blow_up="layers.0.mlp.down_proj"),
    }
