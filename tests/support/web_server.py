"""The web app as users run it: `vidlora web` (gunicorn) in its own process, on a free port,
its log captured. The resumable-upload tests and bench/upload_resume.py use it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.support.env import ROOT
from tests.support.workers import free_port

SECRET = "resumable-tests-" + "x" * 40


class WebServer:
    def __init__(self, log_path: Path, extra_env: dict[str, str] | None = None, threads: int = 4) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        env = {**os.environ, "VIDLORA_SECRET_KEY": SECRET, **(extra_env or {})}
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "web", "--host", "127.0.0.1", "--port", str(self.port),
             "--workers", "1", "--threads", str(threads)],
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"vidlora web exited {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2):
                    return
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"vidlora web did not answer in {timeout}s:\n{self.log()}")

    def worker_pid(self) -> int:
        """The gunicorn worker that serves requests (the app runs there, not in the arbiter)."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        return int(children[0])

    def log(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
