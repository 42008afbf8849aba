"""The shipped demo weights: within the repo's 5 MB, and still what ``demo_model.train`` makes
(the short rerun CI can afford, against the fingerprint recorded when they were made)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from demo_model import WEIGHTS
from tests.support.env import ROOT


def test_shipped_weights_fit_in_five_megabytes_and_are_the_recorded_files():
    record = json.loads((WEIGHTS / "TRAINING.json").read_text())
    files = sorted(p for p in WEIGHTS.rglob("*") if p.is_file() and p.name != "TRAINING.json")
    assert [str(p.relative_to(WEIGHTS)) for p in files] == sorted(record["files"])
    assert sum(p.stat().st_size for p in files) < 5 * 10**6
    # Each scenario's adapter, and the generic answer without one, learnt on unseen scenes.
    assert set(record["accuracy"]) == {f"{s}/{m}" for s in ("artifact_identification", "tomb_structure",
                                                            "murals_inscriptions") for m in ("adapter", "base")}


def test_the_training_script_still_makes_the_shipped_weights():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "demo_model.train", "--check"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["files_ok"], result
