"""LoRA-safe prefix caching on hybrid models.

Upstream (0.32) keys prefix-cache blocks by ("lora", name, path)
(`kv_cache_utils._gen_lora_extra_hash_keys`), so adapters never share blocks. On
hybrid GDN models (prefix caching on by default from 0.30, "align" state caching) a
poisoned state block (a NaN from a bad batch or #56524) is still replayed to every
later request of that adapter with the same prefix. vidlora's prompts share little
beyond the system prompt, so the default policy turns prefix caching off whenever
LoRA is enabled on a hybrid model, and for every LoRA model if the installed vLLM
does not key blocks by LoRA. VIDLORA_PREFIX_CACHING=keep leaves it as configured.

Changes `EngineArgs.create_engine_config`: it builds the config; if the policy says
off and prefix caching is on, it builds it again with enable_prefix_caching=False.
"""
from __future__ import annotations

import importlib
import inspect
import logging
import os

from .base import Patch, is_marked, wraps_marked

log = logging.getLogger("engine_patch")


def lora_in_block_hash() -> bool:
    try:
        kvu = importlib.import_module("vllm.v1.core.kv_cache_utils")
    except ImportError:
        return False
    fn = getattr(kvu, "_gen_lora_extra_hash_keys", None)
    return fn is not None and "lora" in inspect.getsource(fn)


def _wrap(orig):
    @wraps_marked(orig)
    def create_engine_config(self, *args, **kwargs):
        cfg = orig(self, *args, **kwargs)
        if os.environ.get("VIDLORA_PREFIX_CACHING", "auto") == "keep":
            return cfg
        if cfg.lora_config is None or not cfg.cache_config.enable_prefix_caching:
            return cfg
        hybrid = bool(getattr(cfg.model_config, "is_hybrid", False))
        if hybrid or not lora_in_block_hash():
            why = "hybrid model" if hybrid else "block hash lacks the LoRA id"
            log.warning("engine_patch: prefix caching disabled with LoRA (%s)", why)
            self.enable_prefix_caching = False
            cfg = orig(self, *args, **kwargs)
        return cfg

    return create_engine_config


def probe() -> str | None:
    if os.environ.get("VIDLORA_PREFIX_CACHING", "auto") == "keep":
        return "VIDLORA_PREFIX_CACHING=keep"
    try:
        ea = importlib.import_module("vllm.engine.arg_utils").EngineArgs
    except (ImportError, AttributeError):
        return "no EngineArgs"
    if is_marked(ea.create_engine_config):
        return "already applied"
    return None


def apply() -> None:
    ea = importlib.import_module("vllm.engine.arg_utils").EngineArgs
    ea.create_engine_config = _wrap(ea.create_engine_config)


PATCH = Patch(
    name="prefix_cache_policy",
    covers="prefix cache off for LoRA on hybrid models (poisoned GDN state replay)",
    probe=probe,
    apply=apply,
)
