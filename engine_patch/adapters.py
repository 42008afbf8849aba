"""Normalise a PEFT LoRA adapter to exactly what vLLM's Qwen3.5 model class will place.

vLLM silently drops adapter modules whose names it cannot match (#49354): the adapter
then "loads" and changes nothing; and it reads neither ``layers_to_transform`` nor
``exclude_modules``, so tensors PEFT never applies would be applied. Here the config decides,
as PEFT decides (`peft_config`), which tensors are LoRA layers, at which rank and scale; every
applied module is placed on a real base weight of the served language model by its module
tree, with checked shapes, or refused with `AdapterError` naming the adapter's own module or
the config field. Per-module scales (alpha/r, rank_pattern, alpha_pattern, rsLoRA) are folded
into lora_B so vLLM's single global scale (lora_alpha / r) is exactly 1.0 and cannot disagree
with PEFT.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import peft_config
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


class ServerFault(OSError):
    """The server failed, not the adapter: ``what`` says what (in words without a server path),
    the message adds where, for the log. Never an adapter's verdict."""

    def __init__(self, what: str, where: Path | str, exc: BaseException) -> None:
        self.what = what
        strerror = getattr(exc, "strerror", None)
        self.short = type(exc).__name__ + (f": {strerror}" if strerror else "")  # no path: for users
        super().__init__(f"{what}: {where}: {type(exc).__name__}: {strerror or exc}")


class CacheUnwritable(ServerFault):
    """The prepared-adapter cache cannot be written (a path under a file, a read-only or full disk)."""


@dataclass(slots=True)
class PreparedAdapter:
    name: str
    path: Path            # normalised adapter dir to hand to vLLM's LoRARequest
    source: Path
    rank: int
    modules: list[str]
    digest: str           # of the normalised weights and the config (`digest`)
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
        raise AdapterError("the base model has no *.safetensors")
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
        raise AdapterError(f"the base model has no *.safetensors and its config builds no model: {exc}") from exc
    return {k[: -len(".weight")]: tuple(v.shape) for k, v in model.state_dict().items() if k.endswith(".weight")}


def _lm_prefix(base: dict[str, tuple[int, ...]]) -> str:
    for name in base:
        m = re.match(r"^(.*?)layers\.\d+\.", name)
        if m and not _TOWER.search(name) and not _MTP.search(name):
            return m.group(1)
    raise AdapterError("cannot find the language model's layers in the base checkpoint")


# Where the language model's layers sit in the models PEFT adapters are trained on: the
# vision-language class (transformers >= 4.52), its older layout, and the text-only class.
_LM_SPELLINGS = ("model.language_model.", "language_model.model.", "language_model.", "model.", "")
_MTP = re.compile(r"(^|\.)mtp\.")
OUTPUT_LAYER = "lm_head"


def place(module: str, lm_prefix: str, allow_tower: bool = False) -> str:
    """The checkpoint module an adapter module (named as trained) adapts: one of the served
    language model's ``layers.N.*`` modules, whatever prefix the training model class gave it.
    Anything else is refused by the adapter's own name for it."""
    if _TOWER.search(module):
        if allow_tower:
            return module
        raise AdapterError(f"module {module}: vision-tower LoRA, but the engine serves no tower LoRA")
    if _MTP.search(module):
        raise AdapterError(f"module {module}: multi-token-prediction (MTP) module; the engine serves "
                           "LoRA on the language model's layers only")
    if module == OUTPUT_LAYER or any(module == p + OUTPUT_LAYER for p in _LM_SPELLINGS):
        return OUTPUT_LAYER  # the output layer, top level in every served checkpoint
    for prefix in dict.fromkeys((lm_prefix, *_LM_SPELLINGS)):
        if module.startswith(prefix) and re.match(r"layers\.\d+\.[^.]", module[len(prefix):]):
            return lm_prefix + module[len(prefix):]
    raise AdapterError(f"module {module}: not a module of the served language model "
                       "(LoRA is served on its layers.N.* linear layers and its output layer lm_head only)")


def unreadable(file: str, exc: BaseException) -> AdapterError:
    """A file of the adapter that cannot be read, named (relative to the adapter) with why."""
    why = getattr(exc, "strerror", None) if isinstance(exc, OSError) else None
    return AdapterError(f"{file} cannot be read: {type(exc).__name__}: {why or exc}")


def _load_weights(src: Path) -> dict[str, torch.Tensor]:
    st, bin_ = src / "adapter_model.safetensors", src / "adapter_model.bin"
    if st.exists():
        from safetensors.torch import load_file

        try:
            return load_file(str(st))
        except Exception as exc:  # noqa: BLE001 - truncated, corrupt or unreadable: the file's fault
            raise unreadable(st.name, exc) from None
    if bin_.exists():
        import pickle

        try:
            weights = torch.load(str(bin_), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            # PyTorch's own message advises loading unsafely; the reason must not.
            raise AdapterError("adapter_model.bin: a pickle that needs code to load (only plain tensors are "
                               "read); save the adapter as adapter_model.safetensors") from None
        except Exception as exc:  # noqa: BLE001 - truncated or unreadable
            raise unreadable(bin_.name, exc) from None
        if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
            raise AdapterError("adapter_model.bin: not a dictionary of tensors")
        return weights
    raise AdapterError("no adapter_model.safetensors or adapter_model.bin")


def module_names(src: Path) -> list[str]:
    """The adapter's modules as trained (keys without PEFT's prefix), from the file headers:
    what a check that needs no tensors (`engine_patch.moe`) reads."""
    st = Path(src) / "adapter_model.safetensors"
    if st.exists():
        from safetensors import safe_open

        try:
            with safe_open(str(st), framework="pt") as sf:
                keys = list(sf.keys())
        except Exception as exc:  # noqa: BLE001 - the file's fault, named
            raise unreadable(st.name, exc) from None
    else:
        keys = list(_load_weights(Path(src)))
    return sorted({m.group("mod") for k in keys if (m := _KEY.match(k))})


_PEFT_PREFIX = "base_model.model."
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def shown(key: str) -> str:
    """A tensor key or module as a reason shows it: without PEFT's ``base_model.model.``, its
    control characters escaped (a newline in a key must not break the reason's line)."""
    if key.startswith(_PEFT_PREFIX):
        key = key[len(_PEFT_PREFIX):]
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], key)


def _pairs(weights: dict[str, torch.Tensor]) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """Adapter module (named as trained, without PEFT's ``base_model.model.``) -> {"A", "B"},
    and the other tensors (key without the prefix -> tensor), for `_extras` to judge."""
    if not weights:
        raise AdapterError("adapter has no tensors: it would load and change nothing")
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    extras: dict[str, torch.Tensor] = {}
    for key, t in weights.items():
        m = _KEY.match(key)
        if not m:
            extras[key[len(_PEFT_PREFIX):] if key.startswith(_PEFT_PREFIX) else key] = t
            continue
        ab = pairs.setdefault(m.group("mod"), {})
        if m.group("ab") in ab:
            raise AdapterError(f"module {m.group('mod')}: lora_{m.group('ab')} is given twice")
        ab[m.group("ab")] = t
    return pairs, extras


# Tensors PEFT saves beside A and B that only training reads (the forward at inference is a
# plain LoRA's): marker in the key -> the config field that makes PEFT write them.
_TRAINING_ONLY = {".lora_velora_embed": "velora_config", ".lora_monteclora_sampler.": "monteclora_config"}
# Copies of base parameters PEFT may save (bias="all"/"lora_only"; the output layer's weight
# when lm_head is a target): suffix -> what the module's base parameter is called.
_BASE_COPIES = (".base_layer.weight", ".bias")


def _extras(extras: dict[str, torch.Tensor], cfg: dict, base_tensor, lm_prefix: str) -> list[str]:
    """Judge the tensors that are no LoRA A/B weight: left out (with a note) where they change
    nothing at inference, else refused by name. A saved copy of a base parameter changes
    nothing only if it equals the base model's (it then loads as what is already there)."""
    inert: dict[str, list[str]] = {}
    copies: list[str] = []
    for name, t in sorted(extras.items()):
        field = next((f for marker, f in _TRAINING_ONLY.items() if marker in name), None)
        if field and cfg.get(field):
            inert.setdefault(field, []).append(name)
            continue
        suffix = next((x for x in _BASE_COPIES if name.endswith(x)), None)
        if suffix is None or "lora_" in name:
            what = ("a LoRA bias" if ".lora_B.bias" in name or ".lora_A.bias" in name else
                    "an embedding LoRA (vLLM serves none on this model)" if "lora_embedding_" in name else
                    "a DoRA magnitude vector" if "lora_magnitude_vector" in name else
                    "not a LoRA A/B weight")
            where = f"module {shown(name.rsplit('.lora_', 1)[0])}: " if ".lora_" in name else ""
            raise AdapterError(f"{where}tensor {shown(name)} is {what}")
        module = name[: -len(suffix)]
        param = "bias" if suffix == ".bias" else "weight"
        ref = _base_copy(module, param, base_tensor, lm_prefix)
        if ref is not None and tuple(ref.shape) == tuple(t.shape) and torch.equal(ref.float(), t.float()):
            copies.append(name)
            continue
        bias = cfg.get("bias", "none")
        if param == "bias" and bias != "none":
            raise AdapterError(f"config bias: bias={bias!r} saved the base bias {shown(name)}, which differs from "
                               "the base model's (trained): vLLM ignores trained base biases")
        raise AdapterError(f"module {shown(module)}: tensor {shown(name)} is a copy of its base {param} that differs "
                           "from the base model's (trained, or a resized vocabulary): vLLM ignores it")
    notes = [f"left out, as only training reads them ({field}; inference is a plain LoRA): {_few(names)}"
             for field, names in inert.items()]
    if copies:
        notes.append(f"left out, unchanged copies of base parameters: {_few(copies)}")
    return notes


def _few(names: list[str]) -> str:
    return ", ".join(shown(n) for n in names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _base_copy(module: str, param: str, base_tensor, lm_prefix: str) -> torch.Tensor | None:
    """The base model's ``param`` of the adapter's ``module`` (named as trained), or None."""
    if base_tensor is None:
        return None
    names = [module]
    try:
        names.append(place(module, lm_prefix, allow_tower=True))
    except AdapterError:
        pass
    for name in dict.fromkeys(names):
        ref = base_tensor(f"{name}.{param}")
        if ref is not None:
            return ref
    return None


class BaseTensors:
    """Tensors of the base checkpoint by name, read on demand from its safetensors (headers
    indexed once); None for a name it lacks or a config-only model."""

    def __init__(self, model_path: Path) -> None:
        self.model_path = Path(model_path)
        self._where: dict[str, Path] | None = None

    def __call__(self, key: str) -> torch.Tensor | None:
        from safetensors import safe_open

        try:
            if self._where is None:
                where: dict[str, Path] = {}
                for f in sorted(self.model_path.glob("*.safetensors")):
                    with safe_open(str(f), framework="pt") as sf:
                        where.update((k, f) for k in sf.keys())
                self._where = where
            f = self._where.get(key)
            if f is None:
                return None
            with safe_open(str(f), framework="pt") as sf:
                return sf.get_tensor(key)
        except Exception as exc:  # noqa: BLE001 - the base model's files: the server's
            raise ServerFault("the base model cannot be read", self.model_path, exc) from exc


def normalise(weights: dict[str, torch.Tensor], cfg: dict, base: dict[str, tuple[int, ...]],
              max_rank: int, allow_tower: bool = False,
              base_tensor=None) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], list[str]]:
    """-> {checkpoint module: (A [r,in], B_scaled [out,r])}, notes. Pure; unit-testable.

    Exactly what ``PeftModel.from_pretrained`` applies: the config decides which tensors are
    LoRA layers (the others are left out, as PEFT leaves them out, and named in the notes),
    their rank and their scale; each applied module is placed by the model's module tree and
    may be adapted once. ``base_tensor`` (name -> the base checkpoint's tensor, or None) lets
    saved copies of base parameters be checked unchanged; without it they are refused."""
    why = peft_config.refusal(cfg)
    if why:
        raise AdapterError(why)
    notes: list[str] = []
    lm_prefix = _lm_prefix(base)
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    origin: dict[str, str] = {}  # checkpoint module -> the adapter's name for it
    split: dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}
    ignored: list[str] = []
    zero_scale = False
    pairs, extras = _pairs(weights)
    notes += _extras(extras, cfg, base_tensor, lm_prefix)
    for mod, ab in sorted(pairs.items()):
        if not peft_config.targets(cfg, mod):
            ignored.append(mod)
            continue
        if set(ab) != {"A", "B"}:
            raise AdapterError(f"module {mod}: has lora_{''.join(ab)} but not both A and B")
        if peft_config.by_parameter(cfg, mod) and peft_config.by_module(cfg, mod):
            raise AdapterError(f"module {mod}: targeted by both target_modules and config target_parameters "
                               "(PEFT nests two LoRAs on it; one pair of tensors cannot hold both)")
        a, b = ab["A"].float(), ab["B"].float()
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise AdapterError(f"module {mod}: A {tuple(a.shape)} and B {tuple(b.shape)} do not form a LoRA pair")
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise AdapterError(f"module {mod}: non-finite values in lora_A/lora_B")
        name = place(mod, lm_prefix, allow_tower)
        want = peft_config.rank(cfg, mod)
        if a.shape[0] != want:
            raise AdapterError(f"module {mod}: its tensors have rank {a.shape[0]} but the config gives it "
                               f"rank {want} (r / rank_pattern); PEFT refuses to load it (size mismatch)")
        factor = peft_config.scale(cfg, mod)
        zero_scale |= factor == 0
        b = b * factor
        parent, _, leaf = name.rpartition(".")
        twin = (origin.get(f"{parent}.in_proj_qkv") if leaf in _SPLIT_QKV else
                next((origin[f"{parent}.{s}"] for s in _SPLIT_QKV if f"{parent}.{s}" in origin), None)
                if leaf == "in_proj_qkv" else None) or origin.get(name)
        if twin is not None:
            raise AdapterError(f"module {mod}: {name} is adapted twice (also as {twin})")
        origin[name] = mod
        if leaf in _SPLIT_QKV:
            split.setdefault(parent, {})[leaf] = (a, b)
        else:
            out[name] = (a, b)
    if ignored:
        shown = ", ".join(ignored[:4]) + (f" and {len(ignored) - 4} more" if len(ignored) > 4 else "")
        notes.append(f"left out, as PEFT leaves them out (the config does not target them): {shown}")
    for parent, parts in split.items():
        # Split q/k/v GDN projections -> one in_proj_qkv: A stacked, B block-diagonal.
        target = f"{parent}.in_proj_qkv"
        names = [origin[f"{parent}.{leaf}"] for leaf in _SPLIT_QKV if leaf in parts]
        if target not in base:
            raise AdapterError(f"module {names[0]}: base has no {target}")
        rows = _qkv_rows(base[target][0], parts)
        a_list, b_blocks = [], []
        for leaf, n in zip(_SPLIT_QKV, rows):
            if leaf in parts:
                a_list.append(parts[leaf][0])
                b_blocks.append(parts[leaf][1])
            else:
                b_blocks.append(torch.zeros(n, 0))
        out[target] = (torch.cat(a_list), torch.block_diag(*b_blocks))
        origin[target] = " + ".join(names)
        notes.append(f"{parent}: merged {sorted(parts)} into in_proj_qkv (rank {out[target][0].shape[0]})")
    for name, (a, b) in out.items():
        if name not in base:
            if name == OUTPUT_LAYER:
                raise AdapterError(f"module {origin[name]}: the base model has no separate output layer weight "
                                   "(it is tied to the input embeddings)")
            raise AdapterError(f"module {origin[name]}: no such weight in the base model")
        if len(base[name]) != 2:
            by = " (targeted by config target_parameters)" if peft_config.by_parameter(cfg, origin[name]) else ""
            raise AdapterError(f"module {origin[name]}{by}: not a linear layer (its base weight has shape "
                               f"{base[name]}); vLLM serves LoRA on linear layers only")
        o, i = base[name]
        if a.shape[1] != i or b.shape[0] != o:
            raise AdapterError(f"module {origin[name]}: LoRA maps {a.shape[1]}->{b.shape[0]}, base weight is {i}->{o}")
        if a.shape[0] > max_rank:
            raise AdapterError(f"module {origin[name]}: rank {a.shape[0]} > max_lora_rank {max_rank}")
    _fill_groups(out, base, notes)
    if not out:
        raise AdapterError("the config targets none of the adapter's modules: it would load and change nothing"
                           if ignored else "adapter has no LoRA modules")
    if all(torch.count_nonzero(b) == 0 or torch.count_nonzero(a) == 0 for a, b in out.values()):
        if zero_scale:
            raise AdapterError("adapter is all-zero: lora_alpha (or alpha_pattern) is 0, so PEFT scales "
                               "its modules by 0 and it would load and change nothing")
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


def digest(mods: dict[str, tuple[torch.Tensor, torch.Tensor]], cfg: dict) -> str:
    """The adapter's identity: its normalised weights AND its whole config, so an adapter whose
    config changes on disk (a PiSSA twin, an edited target list) is never taken for another."""
    h = hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode())
    for name in sorted(mods):
        a, b = mods[name]
        h.update(name.encode())
        h.update(a.contiguous().numpy().tobytes())
        h.update(b.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def read_config(src: Path) -> dict:
    try:
        cfg = json.loads((src / "adapter_config.json").read_text())
    except FileNotFoundError:
        raise AdapterError("no adapter_config.json (not a PEFT adapter)") from None
    except ValueError as exc:
        raise AdapterError(f"adapter_config.json is not valid JSON: {exc}") from None
    except OSError as exc:
        raise unreadable("adapter_config.json", exc) from None
    if not isinstance(cfg, dict):
        raise AdapterError("adapter_config.json is not a JSON object")
    if "peft_type" not in cfg:
        # PeftConfig.from_pretrained cannot tell the adapter's kind without it (KeyError).
        raise AdapterError('adapter_config.json has no peft_type: PEFT cannot tell which kind of adapter it is '
                           'and refuses to load it; a LoRA adapter says "peft_type": "LORA"')
    return cfg


def prepare_adapter(src: Path, model_path: Path, max_rank: int, cache_dir: Path,
                    *, allow_tower: bool = False, dtype: torch.dtype = torch.float32,
                    base: dict[str, tuple[int, ...]] | None = None) -> PreparedAdapter:
    """Check and normalise `src`; write the result under `cache_dir` (reused if present).

    Callers go through `engine_patch.registration.AdapterRegistry`, the one adapter path."""
    src, model_path, cache_dir = Path(src), Path(model_path), Path(cache_dir)
    cfg = read_config(src)
    mods, notes = normalise(_load_weights(src), cfg, base if base is not None else base_modules(model_path),
                            max_rank, allow_tower, base_tensor=BaseTensors(model_path))
    ident = digest(mods, cfg)
    rank = max(a.shape[0] for a, _ in mods.values())
    dst = cache_dir / f"{src.name}-{ident}"
    if not (dst / "adapter_model.safetensors").exists():
        try:
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
            dropped = ("rank_pattern", "alpha_pattern", "layers_to_transform", "layers_pattern",
                       "target_parameters", "velora_config", "monteclora_config")
            new_cfg = {k: v for k, v in cfg.items() if k not in dropped}
            # What PEFT applies is in the tensors now: scales folded into B (vLLM's lora_alpha / r
            # must be exactly 1), targets the modules written, a plain LoRA init.
            new_cfg.update(r=rank, lora_alpha=rank, use_rslora=False, target_modules=leaves, exclude_modules=None,
                           bias="none", init_lora_weights=True, vidlora_source=str(src), vidlora_digest=ident)
            (tmp / "adapter_config.json").write_text(json.dumps(new_cfg, indent=2, sort_keys=True))
            shutil.rmtree(dst, ignore_errors=True)
            tmp.rename(dst)
        except Exception as exc:  # noqa: BLE001 - a path under a file, read-only or full: the server's
            raise CacheUnwritable("the prepared-adapter cache cannot be written", cache_dir, exc) from exc
    return PreparedAdapter(name=src.name, path=dst, source=src, rank=rank,
                           modules=sorted(mods), digest=ident, notes=notes)
