"""Analyses RUNNING on a GPU worker, each with its own video and frame set, as a claim leaves
them: what a worker's store path finds when a result comes back (tests and bench.result_store)."""

from __future__ import annotations

from sqlalchemy import select


def running_analyses(n: int, tag: str, scenario: str = "artifact_identification", worker: str | None = None) -> list[int]:
    from vidlora.db import session_scope
    from vidlora.models import Analysis, Batch, FrameSet, Scenario, Video

    ids = []
    with session_scope() as session:
        spec = session.scalar(select(Scenario).where(Scenario.name == scenario))
        batch = Batch(name=tag, source="cli", scenario_names=[spec.name])
        session.add(batch)
        session.flush()
        for i in range(n):
            key = tag if n == 1 else f"{tag}{i:06d}"
            video = Video(sha256=key.ljust(64, "0"), path=f"videos/{key}.mp4", original_name="x.mp4", size_bytes=1,
                          status="ready")
            session.add(video)
            session.flush()
            fs = FrameSet(video_id=video.id, policy_key=key, status="done", files=["a.jpg"])
            session.add(fs)
            session.flush()
            a = Analysis(video_id=video.id, scenario_id=spec.id, batch_id=batch.id, frame_set_id=fs.id)
            session.add(a)
            session.flush()
            for step in ("ready", "queued", "running"):
                a.status = step
            a.worker = worker
            ids.append(a.id)
    return ids
