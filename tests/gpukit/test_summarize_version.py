"""gpukit.summarize_version as the README's call list runs it: a check that did not run is listed
as not run, never as passed, and --md writes the record with the command that made it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_md_record_lists_unrun_checks_as_not_run(tmp_path):
    res = tmp_path / "res"
    res.mkdir()
    (res / "selfcheck_b27_graphs.json").write_text(json.dumps({"passed": True, "checks": [], "versions": {
        "vllm": "0.34.0", "device": "NVIDIA H100 80GB HBM3 sm_90"}}))
    out, md = tmp_path / "vllm_0.34.0", tmp_path / "vllm_0.34.md"
    subprocess.run([sys.executable, "-m", "gpukit.summarize_version", "--res", str(res), "--out", str(out),
                    "--md", str(md)], check=True, capture_output=True, cwd=REPO)
    text = md.read_text()
    assert text.startswith("# vLLM 0.34.0 on NVIDIA H100 80GB HBM3 sm_90")
    assert "Made by `python -m gpukit.summarize_version --res" in text
    assert "| fault_on | False | - |" in text and "| verify_long | False | - |" in text
    assert (out / "selfcheck_b27_graphs.json").is_file()
