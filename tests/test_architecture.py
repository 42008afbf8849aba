"""The house's floors (`.importlinter`): cli > web > tasks > demo_model > testmodels > workers >
engine_patch > vidlora, nothing that serves (web, tasks) builds a model, and no import cycle among
the modules of any package."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.env import ROOT


def test_no_package_imports_a_floor_above_it_and_nothing_imports_in_a_circle():
    lint = Path(sys.executable).with_name("lint-imports")
    # This checkout's code, not whatever an editable install points at.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([str(lint), "--no-cache", "--config", str(ROOT / ".importlinter")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "3 kept, 0 broken" in run.stdout


def test_tests_import_helpers_from_support_not_from_other_tests():
    """One harness: shared helpers live in tests/support; a test module or conftest is never
    imported by another test (pytest loads conftests under their own names)."""
    import ast

    offenders = []
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests."):
                leaf = node.module.rsplit(".", 1)[-1]
                if leaf == "conftest" or leaf.startswith("test_"):
                    offenders.append(f"{path.relative_to(ROOT)}: from {node.module}")
    assert not offenders, offenders
