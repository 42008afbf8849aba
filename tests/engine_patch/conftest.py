from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.tiny import REPO, full_adapters, scenario_adapters, tiny_model


@pytest.fixture(scope="session")
def model() -> Path:
    """The tiny model (var/tiny-model)."""
    return tiny_model()


@pytest.fixture(scope="session")
def full(model) -> Path:
    """One of its PEFT adapters on every module."""
    return full_adapters(model)[0]


@pytest.fixture(scope="session")
def adapters(tmp_path_factory) -> dict[str, Path]:
    return scenario_adapters(tmp_path_factory.mktemp("derived-adapters"))


def run_scenarios(adapters: dict[str, Path], names: str, patched: bool, timeout: int = 600) -> dict:
    """Run scenarios in a fresh interpreter, so patches never leak between cases."""
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", PYTHONPATH=str(REPO),
               VIDLORA_ENGINE_PATCH="on" if patched else "off")
    cmd = [sys.executable, "-m", "tests.engine_patch.scenarios", "--names", names,
           "--adapters", json.dumps({k: str(v) for k, v in adapters.items()})]
    if patched:
        cmd.append("--patched")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError(f"no RESULT (rc={proc.returncode}):\n{proc.stderr[-3000:]}")
