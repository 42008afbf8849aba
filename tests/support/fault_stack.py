"""The fault tests' private stack: their own PostgreSQL cluster and Redis server (which the
tests stop, crash and restart), a media root on a small tmpfs, workers pointed at them with
timings shrunk so recovery happens in seconds, and the fault table the session writes to
``bench/results/faults.md``. The fixtures that start it live in tests/system/faults/conftest.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.env import ROOT
from tests.support.netns import Host
from tests.support.reports import report
from tests.support.workers import WorkerProcess, describe_workers, wait_for

PG_BIN = Path("/usr/lib/postgresql/15/bin")
RESULTS_MD = ROOT / "bench" / "results" / "faults.md"

# Timings for every worker in the stack. Invariants the settings enforce: the visibility timeout
# exceeds the cpu hard limit and the gpu batch deadline; stale-after exceeds the cpu hard limit.
TIMINGS = {
    "VIDLORA_CPU_SOFT_TIME_LIMIT_S": "20",
    "VIDLORA_CPU_TIME_LIMIT_S": "25",
    "VIDLORA_GPU_BATCH_DEADLINE_S": "150",
    "VIDLORA_VISIBILITY_TIMEOUT_S": "160",
    "VIDLORA_STALE_AFTER_S": "30",
    "VIDLORA_RECONCILE_EVERY_S": "3",
    "VIDLORA_HEARTBEAT_S": "1",
    "VIDLORA_DISPATCH_MAX_WAIT_S": "0.5",
    "VIDLORA_MAX_ATTEMPTS": "3",
    "VIDLORA_BATCH_MAX_REQUESTS": "32",
    # The streaming GPU worker holds up to this many analyses in its engine (200 in the kill test);
    # a graceful stop drains for this long, then gives the rest back.
    "VIDLORA_MAX_NUM_SEQS": "256",
    "VIDLORA_GPU_DRAIN_S": "10",
    "VIDLORA_DECODE_TIMEOUT_S": "30",
}

# Test-only scenarios: tiny frames and few tokens, so a 500-video soak fits the CI budget.
SCENARIOS_YAML = """\
scenarios:
  - name: fault_quick
    title: Fault test (quick)
    adapter: artifact_identification
    prompt: Name the objects.
    sampling: {mode: uniform, num_frames: 2, max_pixels: 4096, min_pixels: 1024}
    generation: {max_tokens: 4, temperature: 0.0, seed: 0}
  - name: fault_slow
    title: Fault test (slow enough to be killed mid-batch)
    adapter: tomb_structure
    prompt: Describe the structure in detail.
    sampling: {mode: uniform, num_frames: 4, max_pixels: 4096, min_pixels: 1024}
    generation: {max_tokens: 32, temperature: 0.0, seed: 0}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_postgres(*cmd: str, host: "Host | None" = None) -> subprocess.CompletedProcess:
    # initdb and postgres refuse to run as root.
    argv = ["runuser", "-u", "postgres", "--", *cmd]
    out = subprocess.run(host.command(argv) if host else argv, capture_output=True, text=True, cwd="/")
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out


class PrivatePostgres:
    """A PostgreSQL cluster of our own. By default on loopback at a free port; given a
    ``host`` (tests/support/netns.py), it runs there and listens on that host's address."""

    def __init__(self, root: Path, host: "Host | None" = None) -> None:
        self.root, self.host = root, host
        self.address = host.address if host else "127.0.0.1"
        self.data = root / "pgdata"
        self.sock = root / "pgsock"
        self.log = root / "postgres.log"
        self.port = 5432 if host else free_port()  # a host of its own has every port free
        self.root.chmod(0o755)
        for d in (self.sock, self.data):
            d.mkdir(mode=0o700)
            shutil.chown(d, "postgres", "postgres")
        self.log.touch()
        shutil.chown(self.log, "postgres", "postgres")
        _as_postgres(str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                     "--no-sync", "-E", "UTF8")
        if host:
            # Clients on the host's own network (the other hosts), as a private LAN deployment allows.
            with (self.data / "pg_hba.conf").open("a") as hba:
                hba.write("host all all samenet trust\n")

    def start(self) -> None:
        # fsync off: a "restart" here is a process crash, not a power cut, and the OS keeps what
        # was written. synchronous_commit must stay on: off, a commit is acknowledged before its
        # WAL leaves PostgreSQL's own memory, so a crash silently drops transactions the workers
        # were told had committed (seen: 2 of 40 videos vanished with their analyses). No
        # production set-up may run with it off either (docs/deploy.md).
        opts = (f"-p {self.port} -k {self.sock} -c listen_addresses={self.address} -c fsync=off "
                "-c synchronous_commit=on -c full_page_writes=off -c max_connections=300")
        _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w",
                     "-t", "60", "start", host=self.host)

    def stop(self, mode: str = "fast") -> None:
        _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop",
                     host=self.host)

    def createdb(self, name: str) -> None:
        _as_postgres(str(PG_BIN / "createdb"), "-h", str(self.sock), "-p", str(self.port), name, host=self.host)

    def url(self, db: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@{self.address}:{self.port}/{db}"


class PrivateRedis:
    """A redis-server of our own, on loopback or on a ``host``'s address (as PrivatePostgres)."""

    def __init__(self, root: Path, host: "Host | None" = None) -> None:
        self.dir = root / "redis"
        self.dir.mkdir()
        self.host = host
        self.address = host.address if host else "127.0.0.1"
        self.port = 6379 if host else free_port()
        self.proc: subprocess.Popen | None = None
        self.persistent = True

    def start(self, persistent: bool | None = None) -> None:
        if persistent is not None:
            self.persistent = persistent
        args = ["redis-server", "--port", str(self.port), "--bind", self.address, "--save", "",
                "--dir", str(self.dir), "--appendonly", "yes" if self.persistent else "no",
                "--appendfsync", "always", "--protected-mode", "no"]
        if not self.persistent:
            # Nothing may survive the restart: drop an AOF an earlier persistent run left.
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir.mkdir()
        log = (self.dir.parent / "redis.log").open("ab")
        self.proc = subprocess.Popen(self.host.command(args) if self.host else args, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        import redis

        client = redis.Redis(host=self.address, port=self.port)
        wait_for(lambda: _pings(client), 30, 0.1, "private redis")

    def kill(self) -> None:
        """SIGKILL: a crash. With the AOF (fsync always) every write survives; without it all is lost."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    @property
    def url(self) -> str:
        return f"redis://{self.address}:{self.port}/0"


def stop_services(pg: PrivatePostgres | None, redis_: PrivateRedis | None) -> None:
    """A session's teardown: kill Redis, shut PostgreSQL down at once (either may be absent,
    or already stopped by a test)."""
    if redis_ is not None:
        redis_.kill()
    if pg is not None:
        try:
            pg.stop("immediate")
        except RuntimeError:
            pass


def _pings(client) -> bool:
    try:
        return bool(client.ping())
    except Exception:
        return False


@dataclass
class FaultRow:
    fault: str
    videos: int
    results: int
    lost: int
    duplicated: int
    stuck: int
    seconds: float
    note: str = ""




@dataclass
class Stack:
    root: Path
    pg: PrivatePostgres
    redis: PrivateRedis
    media_root: Path
    tmpfs: bool
    env: dict[str, str]
    workers: dict[str, WorkerProcess] = field(default_factory=dict)
    restarts: list[str] = field(default_factory=list)
    # On the stack, not a module global: one list per session, whoever imports this module.
    rows: list[FaultRow] = field(default_factory=list)
    _restarts_reported: int = 0
    _n: int = 0
    _engine: object | None = None
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _stop: threading.Event = field(default_factory=threading.Event)

    # -- database ---------------------------------------------------------------------
    @property
    def engine(self):
        from sqlalchemy import create_engine

        if self._engine is None:
            self._engine = create_engine(self.env["VIDLORA_DATABASE_URL"], pool_pre_ping=True)
        return self._engine

    @contextmanager
    def session(self):
        from sqlalchemy.orm import Session

        with Session(self.engine, expire_on_commit=False) as session:
            yield session
            session.commit()

    def audit(self, batch_ids: list[int]):
        from vidlora.audit import audit

        with self.session() as session:
            return audit(session, batch_ids)

    # -- processes ----------------------------------------------------------------------
    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT, env={**os.environ, **self.env},
                              capture_output=True, text=True, timeout=timeout)

    def submit(self, paths: list[Path], scenarios: list[str], name: str) -> int:
        args = ["enqueue", *map(str, paths), "--name", name]
        for s in scenarios:
            args += ["-s", s]
        out = self.cli(*args)
        assert out.returncode == 0, out.stdout + out.stderr
        # "batch N: k file(s) queued for ingest"
        return int(out.stdout.split("batch ", 1)[1].split(":", 1)[0])

    def start_worker(self, role: str, kind: str, *args: str, extra_env: dict[str, str] | None = None,
                     wait: bool = True, timeout: float = 300) -> WorkerProcess:
        with self._lock:
            self._n += 1
            log = self.root / "logs" / f"{self._n:02d}-{role}.log"
            log.parent.mkdir(exist_ok=True)
            worker = WorkerProcess(kind, log, {**self.env, **(extra_env or {})}, args)
            old = self.workers.get(role)
            if old is not None:
                old.stop()
            self.workers[role] = worker
        if wait:
            worker.wait_ready(timeout)
        return worker

    # -- supervision ----------------------------------------------------------------------
    # Deployments run workers under a supervisor (compose: restart unless-stopped). A worker
    # may exit on its own under these faults (Celery gives up on an "unrecoverable" broker
    # error during a Redis restart), and the guarantees are about what a supervised
    # deployment loses, so the stack restarts such a worker the same way and says so.
    def supervise(self, period_s: float = 1.0) -> None:
        while not self._stop.wait(period_s):
            with self._lock:
                for role, worker in list(self.workers.items()):
                    if worker.proc.poll() is None or worker.expected_exit:
                        continue
                    self.restarts.append(f"{role} exited with {worker.proc.returncode}: "
                                         f"{_last_error(worker.log())}")
                    worker.stop()
                    self.start_worker(role, worker.kind, *worker.args, extra_env=worker.extra_env, wait=False)

    def start_gpu(self, wait: bool = True) -> WorkerProcess:
        # A restarted GPU worker gets a new name, as one with the default name (host-pid) would.
        return self.start_worker("gpu", "gpu", extra_env={"VIDLORA_WORKER_NAME": f"faults-gpu-{self._n + 1}"},
                                 wait=wait, timeout=600)

    def start_cpu(self, role: str = "cpu", beat: bool = True, concurrency: int = 2, wait: bool = True) -> WorkerProcess:
        args = ["--concurrency", str(concurrency)] + (["--beat"] if beat else [])
        return self.start_worker(role, "cpu", *args, wait=wait)

    def pause(self, role: str) -> None:
        os.killpg(self.workers[role].proc.pid, signal.SIGSTOP)

    def resume(self, role: str) -> None:
        os.killpg(self.workers[role].proc.pid, signal.SIGCONT)

    def describe(self) -> str:
        """Every worker's state and log tail, for a failing test's message."""
        return describe_workers(*self.workers.values())

    def stop_all(self) -> None:
        self._stop.set()
        for worker in self.workers.values():
            try:
                os.killpg(worker.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            worker.stop()


def _last_error(log: str) -> str:
    lines = [line for line in log.splitlines() if "CRITICAL" in line or "Unrecoverable" in line]
    return (lines[-1] if lines else (log.splitlines() or ["(empty log)"])[-1])[:300]


def mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def record(stack: Stack, fault: str, batch_ids: list[int], seconds: float, note: str = "") -> FaultRow:
    """Audit the batches, add the table row, and require nothing lost, duplicated or stuck."""
    from sqlalchemy import func, select

    from vidlora.models import Analysis, BatchItem, Result

    report = stack.audit(batch_ids)
    with stack.session() as session:
        videos = session.scalar(select(func.count(func.distinct(BatchItem.video_id)))
                                .where(BatchItem.batch_id.in_(batch_ids), BatchItem.video_id.is_not(None)))
        results = session.scalar(select(func.count()).select_from(Result).join(Analysis)
                                 .where(Analysis.batch_id.in_(batch_ids)))
    c = report.counts
    with stack._lock:
        restarted, stack._restarts_reported = stack.restarts[stack._restarts_reported:], len(stack.restarts)
    if restarted:
        note += f"; {len(restarted)} worker exit(s) restarted by the supervisor ({restarted[0][:120]})"
    row = FaultRow(fault, videos, results, c["lost_videos"],
                   c["duplicated_analyses"] + c["duplicated_results"],
                   c["stuck_analyses"] + c["stuck_videos"], round(seconds, 1), note)
    stack.rows.append(row)
    print(f"\n[faults] {row}")
    assert (row.lost, row.duplicated, row.stuck) == (0, 0, 0), report
    return row


def write_table(rows: list[FaultRow], total_s: float) -> None:
    if not rows:
        return
    lines = [
        "# Fault tests",
        "",
        "Command: `.venv/bin/python -m pytest tests/system/faults -m faults -q -s` "
        f"(private PostgreSQL 15 + Redis, tmpfs media root; {os.cpu_count()} CPU cores, shared with other work)",
        "",
        "| fault | videos | results | lost | duplicated | stuck | seconds | note |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(f"| {r.fault} | {r.videos} | {r.results} | {r.lost} | {r.duplicated} | {r.stuck} | "
                     f"{r.seconds} | {r.note} |")
    lines += ["", '"videos" counts distinct videos recorded for the batches; "results" counts stored results; '
              "lost / duplicated / stuck come from `vidlora audit` and must be 0.",
              "", f"Session wall time including service and worker start-up: {total_s:.0f} s", ""]
    text = "\n".join(lines)
    report("fault tests", text)
    RESULTS_MD.parent.mkdir(parents=True, exist_ok=True)
    RESULTS_MD.write_text(text)
