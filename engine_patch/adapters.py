"""Normalise a PEFT LoRA adapter to exactly what vLLM's Qwen3.5 model class will place.

vLLM silently drops adapter modules whose names it cannot match (#49354): the adapter
then "loads" and changes nothing. Here every module is either placed on a real base
weight with checked shapes, or refused with `AdapterError` naming it. Per-module
scales (alpha/r, rank_pattern, alpha_pattern, rsLoRA) are folded into lora_B so vLLM's
single global scale (lora_alpha / r) is exactly 1.0 and cannot disagree with PEFT.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .env import restore_transformers_configs

# PEFT members that vLLM packs into one layer: missing members are zero-filled so the
# packed layer sees every member (failure 1) and the math is unchanged (0 @ 0 = 0).
PACKED_GROUPS = (
    ("linear_attn.in_proj_qkv", "linear_attn.in_proj_z"),
    ("linear_attn.in_proj_b", "linear_attn.in_proj_a"),
    ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ("mlp.gate_proj", "mlp.up_proj"),
)
_SPLIT_QKV = ("in_proj_q", "in_proj_k", "in_proj_v")
_TOWER = re.compile(r"(^|\.)(visual|vision_tower|vision_model|merger)\.")
_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<mod>.+)\.lora_(?P<ab>[AB])(?:\.(?P<adapter>[^.]+))?\.weight$")


class AdapterError(ValueError):
    """The adapter cannot be served correctly; the message names the module and why."""


@dataclass(slots=True)
class PreparedAdapter:
    name: str
    path: Path            # normalised adapter dir to hand to vLLM's LoRARequest
    source: Path
    rank: int
    modules: list[str]
    digest: str           # of the normalised weights: changes iff the math changes
    notes: list[str] = field(default_factory=list)


def base_modules(model_path: Path) -> dict[str, tuple[int, ...]]:
    """Checkpoint module name -> weight shape, from safetensors headers only.

    A model directory with a config and no weights (vLLM ``load_format="dummy"``: the
    benchmarks' full-size shapes) gets the shapes of the model its config describes."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files and (Path(model_path) / "config.json").is_file():
        return _config_modules(Path(model_path))
    if not files:
        raise AdapterError(f"no *.safetensors in {model_path}")
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():
                if k.endswith(".weight"):
                    shapes[k[: -len(".weight")]] = tuple(sf.get_slice(k).get_shape())
    return shapes


def _config_modules(model_path: Path) -> dict[str, tuple[int, ...]]:
    """Module name -> weight shape of the transformers model built on the meta device (no memory)."""
    import torch
    import transformers

    restore_transformers_configs()  # an engine in this process may have replaced it
    cfg = transformers.AutoConfig.from_pretrained(str(model_path))
    multimodal = hasattr(cfg, "vision_config")
    auto = transformers.AutoModelForImageTextToText if multimodal else transformers.AutoModelForCausalLM
    try:
        with torch.device("meta"):
            model = auto.from_config(cfg)
    except Exception as exc:  # noqa: BLE001 - an unknown architecture is the adapter's refusal reason
        raise AdapterError(f"{model_path} has no *.safetensors and its config builds no model: {exc}") from exc
    return {k[: -len(".weight")]: tuple(v.shape) for k, v in model.state_dict().items() if k.endswith(".weight")}


def _lm_prefix(base: dict[str, tuple[int, ...]]) -> str:
    for name in base:
        m = re.match(r"^(.*?)layers\.\d+\.", name)
        if m and not _TOWER.search(name) and not name.startswith("mtp."):
            return m.group(1)
    raise AdapterError("cannot find the language model's layers in the base checkpoint")


def _canonical(module: str, lm_prefix: str) -> str:
    """Map any PEFT spelling of a language-model module onto the checkpoint's."""
    m = re.search(r"(?:^|\.)(layers\.\d+\..+)$", module)
    return lm_prefix + m.group(1) if m and not _TOWER.search(module) else module


PEFT_DEFAULT_ALPHA = 8  # peft.LoraConfig.lora_alpha when a config leaves it out


def pattern_key(patterns, module: str) -> str | None:
    """PEFT's own rule (peft.utils.other.get_pattern_key): the FIRST pattern, in the config's
    order, that matches the module name anchored at its end on a dot boundary."""
    for key in patterns:
        if re.match(rf"(.*\.)?({key})$", module):
            return key
    return None


def _peft_scale(cfg: dict, module: str, rank: int) -> float:
    """The scale PEFT multiplies B @ A by for ``module`` (its key as trained, without the
    ``base_model.model.`` prefix): alpha_pattern first match, else lora_alpha; / r or / sqrt(r)."""
    alpha_pattern = cfg.get("alpha_pattern") or {}
    key = pattern_key(alpha_pattern, module)
    alpha = alpha_pattern[key] if key is not None else cfg.get("lora_alpha", PEFT_DEFAULT_ALPHA)
    return alpha / math.sqrt(rank) if cfg.get("use_rslora") else alpha / rank


def _load_weights(src: Path) -> dict[str, torch.Tensor]:
    st, bin_ = src / "adapter_model.safetensors", src / "adapter_model.bin"
    if st.exists():
        from safetensors.torch import load_file

        return load_file(str(st))
    if bin_.exists():
        return torch.load(str(bin_), map_location="cpu", weights_only=True)
    raise AdapterError(f"{src}: no adapter_model.safetensors or adapter_model.bin")


# Config features that change what PEFT computes but that vLLM ignores or rejects: an adapter
# using one cannot be served exactly, so it is refused (field -> why).
_UNSERVABLE = {
    "use_dora": "DoRA (weight-decomposed LoRA) is not supported by vLLM",
    "lora_bias": "LoRA bias terms (lora_bias) are not applied by vLLM",
    "modules_to_save": "fully trained modules (modules_to_save) would be ignored by vLLM",
    "trainable_token_indices": "trained token embeddings (trainable_token_indices) would be ignored by vLLM",
    "target_parameters": "LoRA on raw parameters (target_parameters) is not supported by vLLM",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens) is not supported by vLLM",
    "use_qalora": "QA-LoRA pooling (use_qalora) is not supported by vLLM",
    "layer_replication": "layer replication is not supported by vLLM",
    "megatron_config": "Megatron-sharded LoRA layers are not supported by vLLM",
}


def _check_config(cfg: dict, src: Path) -> None:
    if cfg.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{src}: config peft_type: {cfg.get('peft_type')} is not LORA")
    if cfg.get("bias", "none") != "none":
        raise AdapterError(f"{src}: config bias: bias={cfg.get('bias')!r} trains base biases, which vLLM ignores")
    for key, why in _UNSERVABLE.items():
        if cfg.get(key):
            raise AdapterError(f"{src}: config {key}: {why}")


def normalise(weights: dict[str, torch.Tensor], cfg: dict, base: dict[str, tuple[int, ...]],
              max_rank: int, allow_tower: bool = False) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], list[str]]:
    """-> {checkpoint module: (A [r,in], B_scaled [out,r])}, notes. Pure; unit-testable."""
    notes: list[str] = []
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    if not weights:
        raise AdapterError("adapter has no tensors: it would load and change nothing")
    for key, t in weights.items():
        m = _KEY.match(key)
        if not m:
            what = ("a LoRA bias" if ".lora_B.bias" in key or ".lora_A.bias" in key else
                    "an embedding LoRA (vLLM serves none on this model)" if "lora_embedding_" in key else
                    "a DoRA magnitude vector" if "lora_magnitude_vector" in key else
                    "not a LoRA A/B weight")
            raise AdapterError(f"module {key.rsplit('.lora_', 1)[0]}: tensor {key!r} is {what}")
        pairs.setdefault(m.group("mod"), {})[m.group("ab")] = t.float()
    lm_prefix = _lm_prefix(base)
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    split: dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}
    for mod, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise AdapterError(f"module {mod}: has lora_{''.join(ab)} but not both A and B")
        a, b = ab["A"], ab["B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise AdapterError(f"module {mod}: A {tuple(a.shape)} and B {tuple(b.shape)} do not form a LoRA pair")
        rank = a.shape[0]
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise AdapterError(f"module {mod}: non-finite values in lora_A/lora_B")
        if _TOWER.search(mod) and not allow_tower:
            raise AdapterError(f"module {mod}: vision-tower LoRA, but the engine serves no tower LoRA")
        name = _canonical(mod, lm_prefix)
        b = b * _peft_scale(cfg, mod, rank)
        leaf = name.rsplit(".", 1)[-1]
        if leaf in _SPLIT_QKV:
            split.setdefault(name.rsplit(".", 1)[0], {})[leaf] = (a, b)
            continue
        out[name] = (a, b)
    for parent, parts in split.items():
        # Split q/k/v GDN projections -> one in_proj_qkv: A stacked, B block-diagonal.
        target = f"{parent}.in_proj_qkv"
        if target not in base:
            raise AdapterError(f"module {parent}.in_proj_q/k/v: base has no {target}")
        rows = _qkv_rows(base[target][0], parts)
        a_list, b_blocks = [], []
        for leaf, n in zip(_SPLIT_QKV, rows):
            if leaf in parts:
                a_list.append(parts[leaf][0])
                b_blocks.append(parts[leaf][1])
            else:
                b_blocks.append(torch.zeros(n, 0))
        out[target] = (torch.cat(a_list), torch.block_diag(*b_blocks))
        notes.append(f"{parent}: merged {sorted(parts)} into in_proj_qkv (rank {out[target][0].shape[0]})")
    for name, (a, b) in out.items():
        if name not in base:
            raise AdapterError(f"module {name}: no such weight in the base model")
        o, i = base[name][:2]
        if a.shape[1] != i or b.shape[0] != o:
            raise AdapterError(f"module {name}: LoRA maps {a.shape[1]}->{b.shape[0]}, base weight is {i}->{o}")
        if a.shape[0] > max_rank:
            raise AdapterError(f"module {name}: rank {a.shape[0]} > max_lora_rank {max_rank}")
    _fill_groups(out, base, notes)
    if not out:
        raise AdapterError("adapter has no LoRA modules")
    if all(torch.count_nonzero(b) == 0 or torch.count_nonzero(a) == 0 for a, b in out.values()):
        raise AdapterError("adapter is all-zero: it would load and change nothing")
    return out, notes


def _qkv_rows(total: int, parts: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> list[int]:
    known = {k: v[1].shape[0] for k, v in parts.items()}
    q = known.get("in_proj_q", known.get("in_proj_k"))
    if q is None:  # only v known: q = k = (total - v) / 2
        q = (total - known["in_proj_v"]) // 2
    v = known.get("in_proj_v", total - 2 * q)
    if 2 * q + v != total:
        raise AdapterError(f"in_proj_q/k/v rows {known} do not add up to in_proj_qkv's {total}")
    return [q, q, v]


def _fill_groups(out, base, notes) -> None:
    for name in list(out):
        for group in PACKED_GROUPS:
            hit = next((m for m in group if name.endswith("." + m)), None)
            if hit is None:
                continue
            parent = name[: -len(hit)]
            rank = max(out[parent + m][0].shape[0] for m in group if parent + m in out)
            for m in group:
                full = parent + m
                if full not in out and full in base:
                    o, i = base[full][:2]
                    out[full] = (torch.zeros(rank, i), torch.zeros(o, rank))
                    notes.append(f"{full}: zero-filled missing packed member")


def _digest(mods: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> str:
    h = hashlib.sha256()
    for name in sorted(mods):
        a, b = mods[name]
        h.update(name.encode())
        h.update(a.contiguous().numpy().tobytes())
        h.update(b.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def prepare_adapter(src: Path, model_path: Path, max_rank: int, cache_dir: Path,
                    *, allow_tower: bool = False, dtype: torch.dtype = torch.float32,
                    base: dict[str, tuple[int, ...]] | None = None) -> PreparedAdapter:
    """Check and normalise `src`; write the result under `cache_dir` (reused if present).

    Callers go through `engine_patch.registration.AdapterRegistry`, the one adapter path."""
    src, model_path, cache_dir = Path(src), Path(model_path), Path(cache_dir)
    cfg_path = src / "adapter_config.json"
    if not cfg_path.exists():
        raise AdapterError(f"{src}: no adapter_config.json")
    cfg = json.loads(cfg_path.read_text())
    _check_config(cfg, src)
    mods, notes = normalise(_load_weights(src), cfg, base if base is not None else base_modules(model_path),
                            max_rank, allow_tower)
    digest = _digest(mods)
    rank = max(a.shape[0] for a, _ in mods.values())
    dst = cache_dir / f"{src.name}-{digest}"
    if not (dst / "adapter_model.safetensors").exists():
        from safetensors.torch import save_file

        tmp = dst.with_name(dst.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        tensors = {}
        for name, (a, b) in mods.items():
            tensors[f"base_model.model.{name}.lora_A.weight"] = a.to(dtype).contiguous()
            tensors[f"base_model.model.{name}.lora_B.weight"] = b.to(dtype).contiguous()
        save_file(tensors, str(tmp / "adapter_model.safetensors"))
        leaves = sorted({n.rsplit(".", 1)[-1] for n in mods})
        new_cfg = {k: v for k, v in cfg.items() if k not in ("rank_pattern", "alpha_pattern", "layers_to_transform")}
        # Scales are folded into B: vLLM's lora_alpha / r must be exactly 1.
        new_cfg.update(r=rank, lora_alpha=rank, use_rslora=False, target_modules=leaves,
                       exclude_modules=None, vidlora_source=str(src), vidlora_digest=digest)
        (tmp / "adapter_config.json").write_text(json.dumps(new_cfg, indent=2, sort_keys=True))
        shutil.rmtree(dst, ignore_errors=True)
        tmp.rename(dst)
    return PreparedAdapter(name=src.name, path=dst, source=src, rank=rank,
                           modules=sorted(mods), digest=digest, notes=notes)
