"""Shared fixtures: a fresh PostgreSQL database and Redis db per test session, real workers.

The environment is set before any vidlora module reads settings (the Celery app reads them
at import), so every process started here, and the test process itself, agree on where the
database, broker and media store are.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.env import PG_ADMIN_URL, REDIS_URL, ROOT
from tests.support.workers import WorkerProcess, free_port


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


def pytest_terminal_summary(terminalreporter):
    from tests.support.reports import REPORTS

    for title, text in REPORTS:
        terminalreporter.section(title)
        terminalreporter.write_line(text)


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
    # Every GPU worker start would run them (~20 engine runs each on the CPU); they and the
    # worker's refusal are tested in tests/workers/test_engine_host.py, tests/tasks/test_gpu_worker.py.
    os.environ.setdefault("VIDLORA_STARTUP_CHECKS", "false")
    # Each app the tests build would score its scenarios in a thread of its own, beside the
    # tests that count those reads; tests/web/scenarios/test_warm.py turns it on.
    os.environ.setdefault("VIDLORA_WARM_MEASURES_ON_START", "false")


@pytest.fixture(scope="session")
def database() -> Iterator[str]:
    """A new, migrated PostgreSQL database for this test session, dropped afterwards."""
    from sqlalchemy import create_engine, text

    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{_DB_NAME}"'))
    from vidlora import db, scenarios
    from vidlora.config import reset_settings

    reset_settings()
    db.upgrade()
    scenarios.sync()
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
        # Every worker serves its metrics, as in production: tests scrape what it counted.
        port = free_port()
        worker = WorkerProcess(kind, artifacts_dir / f"worker-{kind}-{len(started)}.log",
                               {"VIDLORA_METRICS_PORT": str(port), **(extra_env or {})}, args)
        worker.metrics_url = f"http://127.0.0.1:{port}/metrics"
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


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
