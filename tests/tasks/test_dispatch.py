"""tasks.dispatch: ready analyses are claimed once, grouped by adapter into engine batches,
and each batch goes to the GPU queue as one message of ids; a refused adapter's analyses fail
at once with its reason. Runs the real task in this process on the session's PostgreSQL and
Redis (the messages are read back from Redis, then removed)."""
from __future__ import annotations

import json

import pytest
import redis
from sqlalchemy import select, update

from tasks.celery_app import GPU_QUEUE
from tests.support.workers import wait_for
from tasks.dispatch import dispatch_ready
from vidlora.db import session_scope
from vidlora.models import Analysis, Batch, FrameSet, Scenario, Video, utcnow

SCENARIOS = ("artifact_identification", "tomb_structure")


def _ready_analyses(n_videos: int, tag: str) -> list[int]:
    ids = []
    with session_scope() as session:
        session.execute(update(Analysis).where(Analysis.status == "ready").values(status="failed",
                                                                                  reason="test isolation"))
        batch = Batch(name=tag, source="cli", scenario_names=list(SCENARIOS))
        session.add(batch)
        session.flush()
        scenarios = session.scalars(select(Scenario).where(Scenario.name.in_(SCENARIOS))).all()
        for v in range(n_videos):
            video = Video(sha256=f"{tag}-{v}".ljust(64, "0"), path=f"videos/{tag}{v}.mp4", original_name=f"{v}.mp4",
                          size_bytes=1, status="ready")
            session.add(video)
            session.flush()
            fs = FrameSet(video_id=video.id, policy_key=f"{tag}-{v}", status="done", files=["a.jpg"] * 4,
                          width=224, height=224)
            session.add(fs)
            session.flush()
            for s in scenarios:
                a = Analysis(video_id=video.id, scenario_id=s.id, batch_id=batch.id, frame_set_id=fs.id)
                session.add(a)
                session.flush()
                a.status = "ready"
                a.ready_at = utcnow()
                ids.append(a.id)
    return ids


def _scenario(analysis_id: int) -> str:
    with session_scope() as session:
        return session.scalar(select(Scenario.name).join(Analysis, Analysis.scenario_id == Scenario.id)
                              .where(Analysis.id == analysis_id))


@pytest.fixture()
def gpu_queue(broker):
    client = redis.Redis.from_url(broker)
    client.delete(GPU_QUEUE)
    yield client
    client.delete(GPU_QUEUE)


def _messages(client) -> list[list[int]]:
    bodies = [json.loads(raw) for raw in client.lrange(GPU_QUEUE, 0, -1)]
    import base64

    return [json.loads(base64.b64decode(b["body"]))[0][0] for b in bodies]


def _dispatched(client, ids: list[int]) -> list[list[int]] | None:
    """Dispatch until every one of ``ids`` is in a message (a partial engine batch may wait up
    to dispatch_max_wait_s for more of its adapter; the session's cpu worker may dispatch too)."""
    dispatch_ready()
    mine = [[i for i in b if i in ids] for b in _messages(client)]
    mine = [b for b in mine if b]
    return mine if sorted(i for b in mine for i in b) == sorted(ids) else None


def test_ready_analyses_go_out_once_grouped_by_adapter(database, gpu_queue):
    ids = _ready_analyses(3, "dispatch-group")
    batches = wait_for(lambda: _dispatched(gpu_queue, ids), 20, 0.5, "the analyses dispatched")
    assert len(batches) == 2  # one engine batch per adapter (3 videos each, under the batch caps)
    with session_scope() as session:
        rows = session.scalars(select(Analysis).where(Analysis.id.in_(ids))).all()
        assert {a.status for a in rows} == {"queued"} and all(a.queued_at for a in rows)
        by_batch = [{next(a.scenario_id for a in rows if a.id == i) for i in b} for b in batches]
        assert all(len(s) == 1 for s in by_batch)  # never two adapters in one engine batch
    dispatch_ready()
    again = [i for b in _messages(gpu_queue) for i in b if i in ids]
    assert sorted(again) == sorted(ids)  # claimed: never sent twice


def test_a_refused_adapter_fails_its_analyses_with_the_reason_and_sends_nothing(database, gpu_queue):
    ids = _ready_analyses(2, "dispatch-refused")
    with session_scope() as session:
        tomb = session.scalar(select(Scenario).where(Scenario.name == "tomb_structure"))
        before = (tomb.adapter_status, tomb.adapter_reason)
        tomb.adapter_status, tomb.adapter_reason = "refused", "module in_proj_qkv: rank 512 over max_lora_rank 64"
    try:
        wait_for(lambda: _dispatched(gpu_queue, [i for i in ids if _scenario(i) != "tomb_structure"]),
                 20, 0.5, "the served adapter's analyses dispatched")
        with session_scope() as session:
            rows = session.execute(select(Analysis, Scenario.name).join(Scenario).where(Analysis.id.in_(ids))).all()
            refused = [a for a, name in rows if name == "tomb_structure"]
            assert refused and all(a.status == "failed" and a.reason.startswith("adapter refused: module in_proj_qkv")
                                   for a in refused)
            assert all(a.status == "queued" for a, name in rows if name != "tomb_structure")
        sent = [i for b in _messages(gpu_queue) for i in b if i in ids]
        assert sorted(sent) == sorted(a.id for a, name in rows if name != "tomb_structure")
    finally:
        with session_scope() as session:
            tomb = session.scalar(select(Scenario).where(Scenario.name == "tomb_structure"))
            tomb.adapter_status, tomb.adapter_reason = before
