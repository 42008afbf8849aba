"""decode_server: one warm process per sampling thread, a fresh killable worker per job.

The real decode through it is covered by test_frames (every backend, the hang and the
exactness check run through this server); here, what a job may do to the server: crash,
print, keep state, burn CPU, or outlive the server.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.support.processes import running
from vidlora.media import decode_server
from vidlora.media.decode_server import DecodeServer, ServerGone


@pytest.fixture
def srv():
    s = DecodeServer("tests.support.fake_decoders:remember")
    yield s
    s.stop()


def test_each_job_runs_in_a_fresh_worker_of_its_own_session(srv):
    first = srv.run({}, timeout=30)
    second = srv.run({}, timeout=30)
    assert first.status == second.status == 0 and not first.timed_out
    # A fork of the server per job: module state never carries over, and each worker leads
    # its own session (the group the client kills on timeout).
    assert first.result["calls"] == second.result["calls"] == 1
    assert first.result["pid"] != second.result["pid"] != srv.proc.pid
    assert first.result["pgid"] == first.result["pid"]


def test_a_crashing_worker_is_reported_and_the_server_goes_on():
    s = DecodeServer("tests.support.fake_decoders:crash")
    try:
        out = s.run({}, timeout=30)
        assert out.status == -signal.SIGSEGV and out.result is None and out.stderr == "about to crash"
        pid = s.proc.pid
        assert s.run({}, timeout=30).status == -signal.SIGSEGV and s.proc.pid == pid  # same server
    finally:
        s.stop()


def test_what_a_worker_prints_never_reaches_the_protocol():
    s = DecodeServer("tests.support.fake_decoders:chatty")
    try:
        for marker in ("a", "b"):
            out = s.run({"marker": marker}, timeout=30)
            assert out.status == 0 and out.result["marker"] == marker, out
            assert out.stderr == "a warning on stderr"
    finally:
        s.stop()


def test_a_job_past_its_timeout_is_killed_and_the_server_serves_the_next(tmp_path, monkeypatch):
    pidfile = tmp_path / "child.pid"
    monkeypatch.setenv("VIDLORA_TEST_PIDFILE", str(pidfile))
    s = DecodeServer("tests.support.fake_decoders:hang")
    try:
        t0 = time.monotonic()
        out = s.run({}, timeout=1.0)
        assert out.timed_out and out.status == -signal.SIGKILL and time.monotonic() - t0 < 10
        child = int(pidfile.read_text())
        time.sleep(0.2)
        assert not running(child)  # the worker's child went with its session
        pid = s.proc.pid
        out = s.run({}, timeout=1.0)
        assert out.timed_out and s.proc.pid == pid
    finally:
        s.stop()


def test_a_server_that_died_is_replaced_on_the_next_job(srv):
    assert srv.run({}, timeout=30).status == 0
    old = srv.proc.pid
    os.kill(old, signal.SIGKILL)
    srv.proc.wait()
    out = srv.run({}, timeout=30)
    assert out.status == 0 and srv.proc.pid != old


def test_a_server_dying_mid_job_fails_that_job_only(tmp_path, monkeypatch):
    monkeypatch.setenv("VIDLORA_TEST_PIDFILE", str(tmp_path / "child.pid"))
    s = DecodeServer("tests.support.fake_decoders:hang")
    try:
        s.start()
        server_pid = s.proc.pid
        killer = _kill_later(server_pid, 1.0)
        with pytest.raises(ServerGone):
            s.run({}, timeout=30)
        killer.join()
        assert s.proc is None
        time.sleep(0.2)
        assert not running(int((tmp_path / "child.pid").read_text()))  # the orphaned job was killed
    finally:
        s.stop()


def test_cpu_seconds_count_the_workers_of_a_live_server(monkeypatch):
    monkeypatch.setattr(decode_server, "ENTRY", "tests.support.fake_decoders:burn")
    s = decode_server.server()
    s.run({"cpu_s": 0.01}, timeout=30)  # started: its imports are not this job's
    before = decode_server.cpu_seconds()
    assert s.run({"cpu_s": 0.4}, timeout=30).status == 0
    used = decode_server.cpu_seconds() - before
    assert 0.35 < used < 1.5, used
    s.stop()  # its share moves into this process's reaped children: nothing lost, nothing twice
    assert decode_server.cpu_seconds() - before == pytest.approx(used, abs=0.2)


def test_one_server_per_thread_and_per_process(monkeypatch):
    import threading

    monkeypatch.setattr(decode_server, "ENTRY", "tests.support.fake_decoders:remember")

    mine = decode_server.server()
    assert decode_server.server() is mine
    other: list = []
    t = threading.Thread(target=lambda: other.append(decode_server.server()))
    t.start()
    t.join()
    assert other[0] is not mine
    ended = other[0]
    ended.run({}, timeout=30)
    # The next server started in this process stops the one whose thread has ended.
    t = threading.Thread(target=lambda: other.append(decode_server.server()))
    t.start()
    t.join()
    assert ended.proc is None and ended not in decode_server._started
    other[1].stop()


def test_a_server_ends_when_its_sampling_process_is_killed(tmp_path):
    """A CPU worker child SIGKILLed (OOM, a pool's hard timeout) leaves no server behind."""
    import subprocess
    import sys

    code = ("import os, signal; from vidlora.media import decode_server; "
            "s = decode_server.DecodeServer('tests.support.fake_decoders:remember'); s.run({}, timeout=30); "
            "print(s.proc.pid, flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    server_pid = int(out.split()[0])
    deadline = time.monotonic() + 10
    while running(server_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(server_pid)


def _kill_later(pid: int, delay: float):
    import threading

    t = threading.Thread(target=lambda: (time.sleep(delay), os.kill(pid, signal.SIGKILL)))
    t.start()
    return t

