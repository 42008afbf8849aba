"""The `vidlora` command as a user runs it: a fresh process with this session's environment."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.env import ROOT


def vidlora(*args: str, stdin: str | None = None, text: bool = True, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT, env=dict(os.environ), input=stdin,
                          capture_output=True, text=text, timeout=timeout)
