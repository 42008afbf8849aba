"""Shared fixtures: a fresh PostgreSQL database and Redis db per test session, real workers.

The environment is set before any vidlora module reads settings (the Celery app reads them
at import), so every process started here, and the test process itself, agree on where the
database, broker and media store are.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = os.environ.get("VIDLORA_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("VIDLORA_TEST_REDIS", "redis://127.0.0.1:6379")


_RUN_DIR = Path(tempfile.mkdtemp(prefix="vidlora-test-"))
_DB_NAME = f"vidlora_test_{uuid.uuid4().hex[:8]}"


def _claim_redis_db() -> int:
    """A Redis database index of our own: concurrent test sessions on one machine must not
    consume each other's tasks (a worker would get ids from another session's database)."""
    import redis

    if "VIDLORA_TEST_REDIS_DB" in os.environ:
        return int(os.environ["VIDLORA_TEST_REDIS_DB"])
    client = redis.Redis.from_url(f"{REDIS_URL}/0")
    for index in range(1, 16):
        if not client.set(f"vidlora-test:db:{index}", _DB_NAME, nx=True, ex=4 * 3600):
            continue
        # A claim can expire or be deleted while a worker of that session lives on: a stray
        # consumer on the index would take our tasks, so an index anyone is connected to is
        # never ours.
        if any(int(c.get("db", -1)) == index for c in client.client_list()):
            client.delete(f"vidlora-test:db:{index}")
            continue
        return index
    raise RuntimeError("every Redis database index is claimed or in use by another process")


def _release_redis_db(index: int) -> None:
    import redis

    client = redis.Redis.from_url(f"{REDIS_URL}/0")
    if client.get(f"vidlora-test:db:{index}") == _DB_NAME.encode():
        client.delete(f"vidlora-test:db:{index}")


REDIS_DB = -1


def pytest_unconfigure(config):
    if REDIS_DB >= 0:
        _release_redis_db(REDIS_DB)
    # The run's media and var dirs (worker logs and screenshots live in test-artifacts/).
    if not os.environ.get("VIDLORA_TEST_KEEP"):
        shutil.rmtree(_RUN_DIR, ignore_errors=True)


def pytest_configure(config):
    global REDIS_DB
    REDIS_DB = _claim_redis_db()
    os.environ.update({
        "VIDLORA_VAR_DIR": str(_RUN_DIR / "var"),
        "VIDLORA_MEDIA_ROOT": str(_RUN_DIR / "media"),
        "VIDLORA_DATABASE_URL": PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + _DB_NAME,
        "VIDLORA_BROKER_URL": f"{REDIS_URL}/{REDIS_DB}",
        "VIDLORA_SCENARIOS_FILE": str(ROOT / "scenarios.yaml"),
        "VIDLORA_DISPATCH_MAX_WAIT_S": "1.0",
        "VIDLORA_HEARTBEAT_S": "2.0",
    })
    # The tiny model is shared by every engine test and built once per checkout.
    os.environ.setdefault("VIDLORA_TINY_MODEL_DIR", str(ROOT / "var" / "tiny-model"))
    os.environ.setdefault("VIDLORA_MODEL", os.environ["VIDLORA_TINY_MODEL_DIR"] + "/base")
    os.environ.setdefault("VIDLORA_ADAPTER_ROOT", os.environ["VIDLORA_TINY_MODEL_DIR"] + "/adapters")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@pytest.fixture(scope="session")
def database() -> Iterator[str]:
    """A new, migrated PostgreSQL database for this test session, dropped afterwards."""
    from sqlalchemy import create_engine, text

    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{_DB_NAME}"'))
    from vidlora.cli import _sync_scenarios, upgrade_database
    from vidlora.config import reset_settings

    reset_settings()
    upgrade_database()
    _sync_scenarios()
    yield os.environ["VIDLORA_DATABASE_URL"]
    from vidlora.db import reset_engine

    reset_engine()
    with admin.connect() as conn:
        conn.execute(text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d AND pid <> pg_backend_pid()"
        ), {"d": _DB_NAME})
        conn.execute(text(f'DROP DATABASE IF EXISTS "{_DB_NAME}"'))
    admin.dispose()


@pytest.fixture(scope="session")
def broker() -> str:
    import redis

    client = redis.Redis.from_url(f"{REDIS_URL}/{REDIS_DB}")
    client.flushdb()
    return os.environ["VIDLORA_BROKER_URL"]


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


def describe_workers(*workers: "WorkerProcess", lines: int = 25) -> str:
    return "\n".join(w.describe(lines) for w in workers)


class WorkerProcess:
    """A real `vidlora worker ...` subprocess with its log captured to a file."""

    def __init__(self, kind: str, log_path: Path, extra_env: dict[str, str] | None = None, args=()):
        self.kind, self.log_path, self.args = kind, log_path, tuple(args)
        self.extra_env = dict(extra_env or {})
        self.expected_exit = False  # set when a test stops or kills it on purpose
        env = {**os.environ, **(extra_env or {})}
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vidlora.cli", "worker", kind, *args],
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

    def wait_ready(self, timeout: float = 120) -> None:
        wait_for(lambda: " ready." in self.log() or self.proc.poll() is not None, timeout, what=f"{self.kind} worker")
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.kind} worker exited:\n{self.log()[-4000:]}")

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


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Worker logs, screenshots and reports of this test session (kept after the run)."""
    path = ROOT / "test-artifacts" / (time.strftime("%Y%m%d-%H%M%S-") + _DB_NAME[-8:])
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def start_worker(database, broker, artifacts_dir) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(kind: str, *args: str, extra_env: dict[str, str] | None = None) -> WorkerProcess:
        worker = WorkerProcess(kind, artifacts_dir / f"worker-{kind}-{len(started)}.log", extra_env, args)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


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


@pytest.fixture(scope="session")
def cpu_worker(start_worker) -> WorkerProcess:
    worker = start_worker("cpu", "--concurrency", "2")
    worker.wait_ready()
    return worker


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    path = ROOT / "var" / "test-corpus"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture()
def db_session(database):
    """A session whose changes are rolled back at the end: tests see their own writes
    without changing what other tests (and the running workers) see."""
    from sqlalchemy.orm import Session

    from vidlora.db import get_engine

    connection = get_engine().connect()
    transaction = connection.begin()
    session = Session(bind=connection, expire_on_commit=False)
    try:
        yield session
    finally:
        session.close()
        transaction.rollback()
        connection.close()
