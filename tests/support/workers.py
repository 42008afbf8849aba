"""The one harness for real worker processes: start `vidlora worker ...` subprocesses with
their logs captured, wait on conditions with a diagnosis on timeout, stop them. The test
suite and the benchmarks (bench/pipeline.py, bench/rss.py) both use it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.env import ROOT
from tests.support.netns import Host


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.5, what: str = "condition",
             diagnose: Callable[[], str] | None = None):
    """Poll ``predicate`` until it is truthy; on timeout fail with ``diagnose()`` appended
    (worker states and log tails), so a CI failure says why, not only that it waited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f"\n{diagnose()}" if diagnose else ""))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """A Prometheus endpoint's samples: (name, sorted labels) -> value."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def describe_workers(*workers: "WorkerProcess", lines: int = 25) -> str:
    return "\n".join(w.describe(lines) for w in workers)


class WorkerProcess:
    """A real `vidlora worker ...` subprocess with its log captured to a file."""

    def __init__(self, kind: str, log_path: Path, extra_env: dict[str, str] | None = None, args=(),
                 host: "Host | None" = None):
        self.kind, self.log_path, self.args = kind, log_path, tuple(args)
        self.extra_env = dict(extra_env or {})
        self.expected_exit = False  # set when a test stops or kills it on purpose
        env = {**os.environ, **(extra_env or {})}
        self._log = log_path.open("wb")
        argv = [sys.executable, "-m", "cli", "worker", kind, *args]
        # On a host (tests/support/netns.py) the wrappers exec, so the pid is the worker's.
        self.proc = subprocess.Popen(
            host.command(argv) if host else argv,
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def describe(self, lines: int = 25) -> str:
        """Alive or exit code, and the last ``lines`` log lines (vLLM's config dumps cut short)."""
        code = self.proc.poll()
        state = "running" if code is None else f"exited with {code}"
        tail = [line[:400] for line in self.log().splitlines()[-lines:]]
        return f"--- {self.kind} worker pid {self.proc.pid} ({state}), {self.log_path.name}:\n" + "\n".join(tail)

    def wait_ready(self, timeout: float = 120) -> float:
        """Seconds until the worker said it is ready (benchmarks report them)."""
        t0 = time.monotonic()
        wait_for(lambda: " ready." in self.log() or self.proc.poll() is not None, timeout, what=f"{self.kind} worker")
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.kind} worker exited:\n{self.log()[-4000:]}")
        return time.monotonic() - t0

    def child_pids(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.expected_exit = True
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        self.expected_exit = True
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


def module_gpu_worker(name: str):
    """A module-scoped ``gpu_worker`` fixture: one real GPU worker named ``name`` for the
    module, stopped after it. Use as ``gpu_worker = module_gpu_worker("test-gpu-0")``."""

    @pytest.fixture(scope="module")
    def gpu_worker(start_worker, cpu_worker):
        worker = start_worker("gpu", extra_env={"VIDLORA_WORKER_NAME": name})
        worker.wait_ready(timeout=600)
        yield worker
        # A GPU worker left running would take later modules' analyses off the gpu queue.
        worker.stop()

    return gpu_worker
