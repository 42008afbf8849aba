"""tasks.gpu_worker: a GPU worker whose engine fails its start-up checks (or its LoRA kernel
self-check) refuses to start, and says why where `vidlora status --workers`, `vidlora doctor`
and the Scenarios page look. The host is scripted here (a narrow fake: the checks themselves
and the host's reaction run on the real engine in tests/workers/test_engine_host.py)."""

from __future__ import annotations

import uuid

import pytest

from engine_patch.selfcheck import SelfCheckError
from engine_patch.startup_checks import StartupCheckError

WHY = ("this engine must not serve: mixed-adapter decode: the no-adapter request batched with "
       "['no adapter', 'a', 'b', 'no adapter']: greedy tokens differ from the request alone at token 3")


class RefusingHost:
    """Fails where the real host fails: the kernel check in ``start``, or ``startup_checks``."""

    fail_in: str = "startup_checks"
    registered: list[str] = []

    def __init__(self, settings):
        self.canary = None

    def start(self):
        if self.fail_in == "start":
            raise SelfCheckError("LoRA torch kernels on cpu disagree with the fp32 reference: 128 tok: non-finite")

    def register_adapter(self, name, path):
        self.registered.append(name)

    def startup_checks(self):
        # What EngineHost._refuse records before it raises.
        self.canary = {"ok": False, "step": "startup_checks", "reason": f"start-up checks: {WHY[28:]}",
                       "detail": f"start-up checks: {WHY[28:]}"}
        raise StartupCheckError(WHY)

    def last_canary(self):
        return self.canary


@pytest.mark.parametrize("fail_in", ["startup_checks", "start"])
def test_a_worker_that_fails_its_start_up_checks_refuses_to_start_and_says_why(database, monkeypatch, capsys,
                                                                                fail_in):
    from cli.doctor import _workers_and_adapters
    from cli.main import _print_workers
    from tasks import gpu_worker
    from vidlora.config import get_settings, reset_settings
    from vidlora.db import session_scope
    from vidlora.lifecycle import WorkerStatus
    from vidlora.models import Worker
    from web.template_helpers import canary_summary

    name = f"refuses-{uuid.uuid4().hex[:6]}"
    monkeypatch.setenv("VIDLORA_WORKER_NAME", name)
    monkeypatch.setenv("VIDLORA_STARTUP_CHECKS", "true")  # tests/conftest.py turns them off for real workers
    reset_settings()
    monkeypatch.setattr(RefusingHost, "fail_in", fail_in)
    monkeypatch.setattr(RefusingHost, "registered", [])
    monkeypatch.setattr("workers.engine_host.EngineHost", RefusingHost)
    consumed = []
    monkeypatch.setattr(gpu_worker, "run_worker", lambda argv: consumed.append(argv) or 0)
    try:
        assert gpu_worker.run() == gpu_worker.EXIT_STARTUP_REFUSED == 78
        assert not consumed  # never reached the queue
        if fail_in == "startup_checks":
            assert RefusingHost.registered  # the checks run after every adapter is registered
        with session_scope() as session:
            row = session.query(Worker).filter(Worker.name == name).one()
            assert row.status == WorkerStatus.STOPPED
            canary = dict(row.last_canary)
        expected = ("start-up checks: mixed-adapter decode: the no-adapter request batched with" if fail_in == "startup_checks"
                    else "start-up checks: LoRA torch kernels on cpu disagree with the fp32 reference")
        assert canary["ok"] is False and canary["step"] == "startup_checks" and canary["reason"].startswith(expected)
        text, kind = canary_summary(canary)  # the Scenarios page's worker table
        assert kind == "bad" and text == f"failed: {canary['reason']}"
        [check] = [c for c in _workers_and_adapters(get_settings()) if c.name == f"worker {name}"]
        assert not check.ok and check.detail.startswith(f"refused to start: {expected}")
        _print_workers(False)
        out = capsys.readouterr().out
        assert f"{name}" in out and "stopped" in out and expected in out
    finally:
        with session_scope() as session:
            session.query(Worker).filter(Worker.name == name).delete()
        reset_settings()
