"""A warm decode server: one process per sampling thread that has imported the decoders once
and forks a fresh, killable worker for every decode job.

Why: starting ``python`` and importing PyAV, PIL and numpy cost 0.34 CPU-s per decode, more
than decoding the 8 frames a shipped scenario samples (0.14 CPU-s) — about 40 % of the CPU
worker's cost per video (bench/results/cpu_feed.md). A fork of a process that has done the
imports costs a few milliseconds. What a job runs in is unchanged: a process of its own, in its
own session, killed with its whole group (any ffmpeg child too) on timeout; a crash or a hang
in a native decoder takes only that job down.

Protocol (the server's stdin and stdout, one JSON object per line):

    client -> server   {"job": {...}}                one decode job (``decode_worker.run``)
    server -> client   {"pid": N}                    the job's worker, forked, in session N
    server -> client   {"status": S, "result": {...} | null, "stderr": "..."}
                       S: the worker's exit code, or minus the signal that ended it

The worker writes its result to a pipe of its own and its stderr to a file of its own, so
nothing it or a native library prints can reach the protocol. The server exits when its stdin
closes (the sampling process is gone); a worker orphaned that way still has the alarm that
``decode_worker`` arms, and kills its own group.

The server must stay single-threaded, or a fork could copy a lock held by another thread:
OpenBLAS and OpenMP are held to one thread before numpy is imported, and nothing here starts
a thread.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import resource
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

# The job function the server's workers run, as "module:function". Tests point a server at a
# misbehaving decoder (one that hangs, one that returns other frames) to prove the client's side.
ENTRY = "vidlora.media.decode_worker:run"
# Imported once by the server, before any fork: what every job needs.
PRELOAD = ("numpy", "PIL.Image", "av", "vidlora.media.decoders", "vidlora.media.ffprobe")
_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])
# The server answers a job with the worker's pid at once; this bounds how long that may take
# (a fork on a loaded machine), after which the server is taken for dead.
_ANSWER_S = 30.0
_BOOT = "import sys; from vidlora.media.decode_server import main; sys.exit(main())"


# -- the server (runs in its own process) -------------------------------------------------------

def serve(entry: str) -> int:
    module, _, name = entry.partition(":")
    job_fn = getattr(importlib.import_module(module), name)
    for line in sys.stdin:
        job = json.loads(line)["job"]
        result_r, result_w = os.pipe()
        err = tempfile.TemporaryFile()
        pid = os.fork()
        if pid == 0:  # the worker
            os.close(result_r)
            _worker(job_fn, job, result_w, err.fileno())
        os.close(result_w)
        _send({"pid": pid})
        with os.fdopen(result_r, "rb") as r:
            raw = r.read()  # until the worker exits (or is killed): its write end closes then
        _, wait_status = os.waitpid(pid, 0)
        status = os.waitstatus_to_exitcode(wait_status)
        err.seek(0)
        tail = err.read().decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        err.close()
        try:
            result = json.loads(raw) if raw else None
        except ValueError:
            result = None
        _send({"status": status, "result": result, "stderr": tail[0][:300]})
    return 0


def _worker(job_fn, job: dict, result_fd: int, err_fd: int) -> None:
    """The forked worker: its own session, quiet standard streams, the job, then out without
    running anything the server registered to run at exit."""
    code = 0
    try:
        os.setsid()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(err_fd, 1)
        os.dup2(err_fd, 2)
        result = job_fn(job)
        os.write(result_fd, json.dumps(result).encode())
    except BaseException as exc:  # noqa: BLE001 - said on stderr, seen by the client as a crash
        try:
            os.write(2, f"{type(exc).__name__}: {exc}\n".encode())
        finally:
            code = 1
    finally:
        os._exit(code)


def _send(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    entry = args[0] if args else ENTRY
    for name in PRELOAD:
        importlib.import_module(name)
    return serve(entry)


# -- the client (in the sampling process) -------------------------------------------------------

@dataclass
class Outcome:
    """One job's end: the worker's result (None when it gave none), its exit status (minus the
    signal that ended it), the last line of its stderr, and whether the timeout killed it."""
    result: dict | None
    status: int
    stderr: str = ""
    timed_out: bool = False
    seconds: float = 0.0


class ServerGone(RuntimeError):
    """The server died or stopped answering; the next job starts a new one."""


class DecodeServer:
    """The client's handle on one server process (started on first use)."""

    def __init__(self, entry: str = ENTRY):
        self.entry = entry
        self.owner = os.getpid()
        self.thread = threading.current_thread()
        self.proc: subprocess.Popen | None = None
        self._buf = b""

    def start(self) -> None:
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [_PROJECT_ROOT, os.environ.get("PYTHONPATH")]))}
        # Its own session: a signal for the sampling process's group (Ctrl-C, a pool's TERM)
        # leaves it alone; it ends when its stdin closes.
        # -c, not -m: the package's __init__ imports this module, and runpy would run it twice.
        self.proc = subprocess.Popen([sys.executable, "-c", _BOOT, self.entry],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
                                     env=env)
        self._buf = b""

    def run(self, job: dict, timeout: float) -> Outcome:
        """Run ``job`` in a fresh worker; SIGKILL its session after ``timeout`` seconds."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        t0 = time.monotonic()
        try:
            self.proc.stdin.write((json.dumps({"job": job}) + "\n").encode())
            self.proc.stdin.flush()
            pid = int(self._read(_ANSWER_S)["pid"])
        except (OSError, ValueError, KeyError, ServerGone) as exc:
            self.stop()
            raise ServerGone(f"decode server did not take the job: {exc}") from None
        timed_out = False
        try:
            done = self._read(timeout)
        except TimeoutError:
            timed_out = True
            _kill_session(pid)
            try:
                done = self._read(_ANSWER_S)
            except (TimeoutError, ServerGone):
                self.stop()
                done = {"status": -signal.SIGKILL, "result": None, "stderr": ""}
        except ServerGone:
            _kill_session(pid)
            self.stop()
            raise
        return Outcome(result=done.get("result"), status=int(done["status"]), stderr=done.get("stderr", ""),
                       timed_out=timed_out, seconds=time.monotonic() - t0)

    def _read(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise ServerGone("decode server exited")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_local = threading.local()
_started: list[DecodeServer] = []  # this process's servers, stopped at exit


@atexit.register
def _stop_all() -> None:
    for srv in _started:
        if srv.owner == os.getpid():  # a forked child leaves its parent's servers alone
            srv.stop()


def cpu_seconds() -> float:
    """CPU seconds used so far by this process and all it ran to decode: the children it has
    reaped, and its live servers with the workers they have reaped (a stopped server's share
    has moved into this process's reaped children by then)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    total = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    tick = os.sysconf("SC_CLK_TCK")
    for srv in _started:
        proc = srv.proc
        if srv.owner != os.getpid() or proc is None:
            continue
        try:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15]) / tick  # utime stime cutime cstime
    return total


def server(entry: str | None = None) -> DecodeServer:
    """This thread's server (one per thread: jobs on one server run one at a time). A process
    forked from one that had a server starts its own: the pipes are its parent's."""
    entry = entry or ENTRY
    mine = getattr(_local, "server", None)
    if mine is None or mine.owner != os.getpid() or mine.entry != entry:
        if mine is not None and mine.owner == os.getpid():
            mine.stop()
        mine = _local.server = DecodeServer(entry)
        _prune()
        _started.append(mine)
    return mine


def _prune() -> None:
    """Forget servers no thread of this process can use again (replaced, stopped, their thread
    ended, or a parent's copied by fork); stop those of ended threads, so none outlives its use."""
    keep = []
    for srv in _started:
        if srv.owner != os.getpid() or srv.proc is None:
            continue
        if not srv.thread.is_alive():
            srv.stop()
            continue
        keep.append(srv)
    _started[:] = keep


if __name__ == "__main__":
    sys.exit(main())
