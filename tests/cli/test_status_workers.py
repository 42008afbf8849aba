"""`vidlora status --workers`: each GPU worker's engine as an operator reads it (issue 35)."""

from __future__ import annotations

import json

from tests.support.cli import vidlora
from vidlora.db import session_scope
from vidlora.models import Worker, utcnow

STREAM = {"mode": "stream", "capacity": 256, "held": 15, "in_flight": {"tomb_structure": 7, "artifact_identification": 5},
          "admitted": 120, "delivered": 105, "mean_admission_wait_s": 0.42, "tokens_per_s": 1234.5, "storing": 2}


def test_status_workers_shows_the_engine_in_words_and_json(database):
    with session_scope() as session:
        session.query(Worker).filter(Worker.name == "gpu-status-cli").delete()
        session.add(Worker(name="gpu-status-cli", queue="gpu.gpu-status-cli", status="ready", stream=STREAM,
                           heartbeat_at=utcnow()))
    out = vidlora("status", "--workers")
    assert out.returncode == 0, out.stderr
    [line] = [ln for ln in out.stdout.splitlines() if ln.startswith("gpu-status-cli")]
    assert "ok" in line
    assert ("12 in flight of 256 (artifact_identification 5, tomb_structure 7); 3 more waiting; "
            "admitted after 0.4 s on average; 1,234 output tokens/s; 2 finished, being stored") in line
    rows = json.loads(vidlora("status", "--workers", "--json").stdout)["workers"]
    assert [w["stream"] for w in rows if w["name"] == "gpu-status-cli"] == [STREAM]


def test_analyses_admitted_but_queued_inside_the_engine_are_said_apart():
    # An engine whose cache runs fewer than were admitted: vLLM keeps the rest waiting inside
    # it, where no other worker can take them (issue 45); the words say so.
    from vidlora.status import stream_words

    queued = dict(STREAM, in_flight={"tomb_structure": 12}, held=12, engine_running=8, engine_waiting=4)
    assert stream_words(queued).startswith(
        "12 in flight of 256 (tomb_structure 12); 8 running in the engine, 4 queued inside it; nothing waiting")
    assert "queued inside" not in stream_words(dict(STREAM, engine_running=12, engine_waiting=0))
