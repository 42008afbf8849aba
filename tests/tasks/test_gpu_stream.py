"""tasks.gpu_stream.release_abandoned: a GPU worker restarted under its name (a supervisor
restarting the one it lost to SIGKILL) gives back at once what its predecessor held: the
analyses it was running and those whose message it had taken but not yet claimed. Rows of
another worker, and finished ones, are not its to give."""

from __future__ import annotations

import uuid

from sqlalchemy import delete, select


def test_a_restarted_worker_gives_back_what_its_predecessor_held(database, broker):
    from tasks.gpu_stream import release_abandoned
    from vidlora.db import session_scope
    from vidlora.models import Analysis, Scenario, Video, utcnow

    me, other = f"gpu-{uuid.uuid4().hex[:8]}", f"gpu-{uuid.uuid4().hex[:8]}"
    rows, videos = {}, []
    with session_scope() as session:
        scenario = session.scalar(select(Scenario).limit(1))
        for label, status, worker in (("running", "running", me), ("queued", "queued", me),
                                      ("theirs", "queued", other), ("done", "done", me)):
            video = Video(sha256=uuid.uuid4().hex * 2, path=f"videos/{label}.mp4", original_name=f"{label}.mp4",
                          size_bytes=1, status="ready")
            session.add(video)
            session.flush()
            a = Analysis(video_id=video.id, scenario_id=scenario.id, status=status, worker=worker,
                         queued_at=utcnow(), finished_at=utcnow() if status == "done" else None)
            session.add(a)
            session.flush()
            rows[label], videos = a.id, [*videos, video.id]
    try:
        assert release_abandoned(me) == 2
        with session_scope() as session:
            got = {label: (a.status, a.worker) for label, i in rows.items() if (a := session.get(Analysis, i))}
        assert got == {"running": ("ready", None), "queued": ("ready", None),
                       "theirs": ("queued", other), "done": ("done", me)}
    finally:
        with session_scope() as session:
            session.execute(delete(Analysis).where(Analysis.id.in_(rows.values())))
            session.execute(delete(Video).where(Video.id.in_(videos)))
