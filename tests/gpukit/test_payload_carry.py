"""gpukit/payload/carry.py, as build.sh runs it on the committed GPU lock: the device gets what the
image runs (issue 57)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CARRY = REPO / "gpukit" / "payload" / "carry.py"
LOCK = REPO / "requirements" / "lock-gpu.txt"


def _run(*args: str) -> str:
    return subprocess.run([sys.executable, str(CARRY), *map(str, args)], check=True, capture_output=True,
                          text=True, cwd=REPO).stdout


def _decisions(*args: str) -> dict[str, str]:
    rows = {}
    for line in _run(LOCK, "--explain", *args).splitlines():
        decision, pin = line.split()[:2]
        rows[pin.split("==")[0]] = decision
    return rows


def test_carries_the_locked_structured_output_backends_at_the_locked_versions():
    pins = dict(line.split("==") for line in _run(LOCK).split())
    locked = dict(line.split(" ")[0].split("==") for line in LOCK.read_text().splitlines()
                  if "==" in line and not line.startswith(("#", " ")))
    for name in ("xgrammar", "llguidance", "lm-format-enforcer", "interegular", "outlines-core", "lark"):
        assert pins[name] == locked[name], name
    assert pins["transformers"] == locked["transformers"]  # the image has one; the lock's goes


def test_stack_image_and_skips():
    d = _decisions()
    assert {d["vllm"], d["torch"], d["triton"], d["torchvision"]} == {"stack"}
    assert d["nvidia-cublas"] == "image"  # the device's CUDA libraries (plan.md: symbols checked)
    assert d["celery"] == "skip" and d["flask"] == "skip"


def test_every_rule_names_a_locked_package():
    result = subprocess.run([sys.executable, str(CARRY), str(LOCK)], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0 and "rules for packages this lock does not have" not in result.stderr, result.stderr


def test_over_a_payload_leaves_out_what_it_already_carries(tmp_path):
    locked = [line.split(" ")[0] for line in LOCK.read_text().splitlines() if line.startswith(("vllm==", "xgrammar=="))]
    manifest = tmp_path / "MANIFEST.txt"
    manifest.write_text("mode=full vllm=x\n" + "".join(
        f"{p.replace('==', '-')}-py3-none-any.whl raw=1 staged=1 xz=1\n" for p in locked))
    d = _decisions("--base", manifest)
    assert d["xgrammar"] == "base" and d["llguidance"] == "carry"
