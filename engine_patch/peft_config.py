"""What a PEFT LoRA config says about each module, decided the way PEFT decides it.

Pure functions over the config dict as saved (``adapter_config.json``) and a module name as
the adapter was trained on it (its key without ``base_model.model.``). Each mirrors the PEFT
code that makes the same decision (peft 0.21): ``tuners_utils.check_target_module_exists``
(targets, ``exclude_modules``, ``layers_to_transform`` / ``layers_pattern``),
``utils.other.get_pattern_key`` (``rank_pattern`` / ``alpha_pattern``) and ``LoraLayer.update_layer``
(the scale). `tests/engine_patch/test_peft_config.py` holds them against PEFT itself.
"""
from __future__ import annotations

import math
import re
from typing import Any

# LoraConfig's defaults, for a config that leaves a field out.
PEFT_DEFAULT_R = 8
PEFT_DEFAULT_ALPHA = 8
ALL_LINEAR = "all-linear"
OUTPUT_EMBEDDING = "lm_head"  # PEFT's all-linear leaves the model's output layer out

# Config features that change what PEFT computes but that vLLM ignores or rejects (field -> why).
_UNSERVABLE = {
    "use_dora": "DoRA (weight-decomposed LoRA) is not supported by vLLM",
    "lora_bias": "LoRA bias terms (lora_bias) are not applied by vLLM",
    "modules_to_save": "fully trained modules (modules_to_save) would be ignored by vLLM",
    "trainable_token_indices": "trained token embeddings (trainable_token_indices) would be ignored by vLLM",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens) is not supported by vLLM",
    "use_qalora": "QA-LoRA pooling (use_qalora) is not supported by vLLM",
    "use_bdlora": "block-diagonal LoRA (use_bdlora) is not supported by vLLM",
    "layer_replication": "layer replication is not supported by vLLM",
    "megatron_config": "Megatron-sharded LoRA layers are not supported by vLLM",
}
# init_lora_weights values after which the saved A and B are a plain LoRA on the unchanged base.
# PiSSA, OLoRA, CorDA and LoftQ rewrite the base weights when PEFT loads the adapter, so on the
# served (unchanged) base they compute something else (vLLM's PEFTHelper draws the same line).
_PLAIN_INITS = ("gaussian", "eva", "orthogonal", "mica", "lora_ga")


def refusal(cfg: dict[str, Any]) -> str | None:
    """Why no engine can serve what PEFT computes for this config (naming the field), or None."""
    if cfg.get("peft_type", "LORA") != "LORA":
        return f"config peft_type: {cfg.get('peft_type')!r} is not LORA"
    # bias="all"/"lora_only" is judged by what the file holds (adapters._extras): on a base
    # without linear biases it saves none, or unchanged copies, and is a plain LoRA.
    for key, why in _UNSERVABLE.items():
        if cfg.get(key):
            return f"config {key}: {why}"
    init = cfg.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower() not in _PLAIN_INITS:
        return (f"config init_lora_weights: {init!r} rewrites the base weights when PEFT loads the adapter "
                "(PiSSA, OLoRA, CorDA and LoftQ do), so on the served base it computes something else; "
                "convert it to a plain LoRA with PEFT's save_pretrained(path_initial_model_for_weight_conversion=...)")
    targets = cfg.get("target_modules")
    params = cfg.get("target_parameters") or []
    if not targets and not params:
        return "config target_modules is empty: PEFT would not know which modules the adapter adapts"
    for param in params:
        if not isinstance(param, str) or not param.endswith(".weight"):
            return (f"config target_parameters: {param!r} is not a linear layer's weight; vLLM serves LoRA on "
                    "linear layers only")
    alphas = {"lora_alpha": cfg.get("lora_alpha", PEFT_DEFAULT_ALPHA),
              **{f"alpha_pattern[{k!r}]": v for k, v in (cfg.get("alpha_pattern") or {}).items()}}
    for name, value in alphas.items():
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            # PEFT divides it by r when it builds the layer: a string or null raises TypeError.
            return (f"config {name}: {value!r} is not a number; PEFT refuses the adapter (TypeError when it "
                    "computes the scale lora_alpha / r)")
    ranks = {"r": cfg.get("r", PEFT_DEFAULT_R),
             **{f"rank_pattern[{k!r}]": v for k, v in (cfg.get("rank_pattern") or {}).items()}}
    for name, value in ranks.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            return f"config {name}: {value!r} is not a positive rank"
    if isinstance(targets, str) and targets:
        for field in ("layers_to_transform", "layers_pattern"):
            if cfg.get(field) is not None:
                return f"config {field} cannot be used when target_modules is a regular expression (PEFT refuses the config)"
    if cfg.get("layers_pattern") and cfg.get("layers_to_transform") is None:
        return "config layers_pattern is given without layers_to_transform (PEFT refuses the config)"
    for pattern in _patterns(cfg):
        try:
            re.compile(pattern)
        except re.error as exc:
            return f"config pattern {pattern!r} is not a regular expression: {exc}"
    return None


def _patterns(cfg: dict[str, Any]) -> list[str]:
    out = [*(cfg.get("rank_pattern") or {}), *(cfg.get("alpha_pattern") or {})]
    for field in ("target_modules", "exclude_modules"):
        value = cfg.get(field)
        if isinstance(value, str) and value.lower() != ALL_LINEAR:
            out.append(value)
    return out


def _named(names, key: str) -> bool:
    """A list of names matches a module given in full or by a trailing dotted part."""
    return key in names or any(key.endswith(f".{n}") for n in names)


def by_parameter(cfg: dict[str, Any], key: str) -> bool:
    """Does ``target_parameters`` name module ``key``'s weight? PEFT's rule (_inject_parameters):
    ``{module}.{param}`` equals an entry or ends in ``.{entry}``. On a dense weight its ParamWrapper
    computes a module LoRA's delta, saved under the same keys."""
    full = f"{key}.weight"
    return any(full == p or full.endswith(f".{p}") for p in cfg.get("target_parameters") or ())


def targets(cfg: dict[str, Any], key: str) -> bool:
    """Does PEFT create a LoRA layer on module ``key`` for this config?"""
    return by_parameter(cfg, key) or by_module(cfg, key)


def by_module(cfg: dict[str, Any], key: str) -> bool:
    """Does ``target_modules`` (with its filters) make module ``key`` a LoRA layer?"""
    exclude = cfg.get("exclude_modules")
    if exclude:
        if isinstance(exclude, str) and re.fullmatch(exclude, key):
            return False
        if not isinstance(exclude, str) and _named(exclude, key):
            return False
    wanted = cfg.get("target_modules") or ()
    if isinstance(wanted, str):
        if wanted.lower() == ALL_LINEAR:
            return key.rsplit(".", 1)[-1] != OUTPUT_EMBEDDING
        return re.fullmatch(wanted, key) is not None
    if key in wanted:
        return True  # named in full: PEFT skips the layer filter for it
    if not any(key.endswith(f".{t}") for t in wanted):
        return False
    layers = cfg.get("layers_to_transform")
    if layers is None or layers == []:
        return True
    index = layer_index(key, cfg.get("layers_pattern"))
    if index is None:
        return False
    return index == layers if isinstance(layers, int) else index in layers


def layer_index(key: str, layers_pattern: str | list[str] | None) -> int | None:
    """The first numbered segment of ``key`` (after ``layers_pattern`` when one is given)."""
    if not layers_pattern:
        m = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", key)
    else:
        m = None
        for pattern in [layers_pattern] if isinstance(layers_pattern, str) else layers_pattern:
            m = re.match(rf"(?:^|.*?\.){pattern}\.(?P<idx>\d+)\.", key)
            if m:
                break
    return int(m.group("idx")) if m else None


def pattern_key(patterns, module: str) -> str | None:
    """PEFT's rule (get_pattern_key): the FIRST pattern, in the config's order, that matches the
    module name anchored at its end on a dot boundary."""
    for key in patterns:
        if re.match(rf"(.*\.)?({key})$", module):
            return key
    return None


def rank(cfg: dict[str, Any], key: str) -> int:
    """The rank PEFT gives module ``key``'s LoRA layer (its A and B must have it)."""
    patterns = cfg.get("rank_pattern") or {}
    hit = pattern_key(patterns, key)
    return int(patterns[hit] if hit is not None else cfg.get("r", PEFT_DEFAULT_R))


def alpha(cfg: dict[str, Any], key: str) -> float:
    patterns = cfg.get("alpha_pattern") or {}
    hit = pattern_key(patterns, key)
    return float(patterns[hit] if hit is not None else cfg.get("lora_alpha", PEFT_DEFAULT_ALPHA))


def scale(cfg: dict[str, Any], key: str) -> float:
    """What PEFT multiplies ``B @ A`` by on module ``key``: alpha / r, or alpha / sqrt(r) (rsLoRA)."""
    r = rank(cfg, key)
    return alpha(cfg, key) / (math.sqrt(r) if cfg.get("use_rslora") else r)
