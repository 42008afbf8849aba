"""The README's main-job command on a fresh state: embedded database and queue, no external
services; it must end with a correct answer for every generated scene (the shipped demo model
reads them) and the UI answering."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.env import ROOT
pytestmark = pytest.mark.engine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def path_without_ffmpeg(tmp_path: Path) -> str:
    """A PATH with every command of this one except ffmpeg and ffprobe: a machine with nothing
    but Python (the README's promise for the demo)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if not entry or not os.path.isdir(entry):
            continue
        for name in os.listdir(entry):
            target = Path(entry) / name
            link = bin_dir / name
            if name in ("ffmpeg", "ffprobe") or link.exists() or not os.access(target, os.X_OK):
                continue
            link.symlink_to(target)
    return str(bin_dir)


def test_demo_command_analyses_every_sample_and_serves_the_ui(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIDLORA_")}
    env["VIDLORA_VAR_DIR"] = str(tmp_path / "var")  # fresh embedded state
    env["PATH"] = path_without_ffmpeg(tmp_path)
    proc = subprocess.Popen(
        ["./scripts/demo.sh", "--serve-for", "60", "--timeout", "900", "--port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "review UI:" in line:
                break
        output = "".join(lines)
        assert "review UI:" in output, output[-5000:]
        time.sleep(1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/auth/login", timeout=30) as resp:
            assert resp.status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    db = sqlite3.connect(tmp_path / "var" / "vidlora.db")
    statuses = db.execute("SELECT status, count(*) FROM analysis GROUP BY status").fetchall()
    results = db.execute("SELECT count(*) FROM result").fetchone()[0]
    assert dict(statuses) == {"done": 9}, (statuses, output[-5000:])
    assert results == 9
    # The summary table: every analysis with its answer beside the truth, and the count of right
    # ones: the shipped model reads every one of these scenes.
    table = output[output.index("video  "):]
    assert table.count(" done ") == 9, table
    rows = [line for line in table.splitlines() if line.startswith(("artifact-", "tomb-", "mural-"))]
    assert len(rows) == 9 and all(line.rstrip().endswith("yes") for line in rows), table
    assert "9 of 9 answers match what the videos show" in table, table
    assert "ffmpeg" not in os.listdir(tmp_path / "bin")
