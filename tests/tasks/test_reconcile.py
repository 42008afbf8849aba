"""tasks.reconcile: what the periodic sweep re-sends, and that it re-sends each row once per
stale period rather than once per sweep. Runs on the real test database, in a transaction
that is rolled back (other sessions' rows may be seen; assertions are about this test's own)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from tasks.reconcile import claim_orphans
from vidlora.models import Analysis, Batch, Scenario, Upload, Video, utcnow

STALE_S = 60.0
HEARTBEAT_S = 2.0


def _upload(db_session, age_s: float) -> Upload:
    batch = Batch(name="reconcile", source="cli", scenario_names=[])
    db_session.add(batch)
    db_session.flush()
    then = utcnow() - timedelta(seconds=age_s)
    upload = Upload(batch_id=batch.id, name="a.mp4", path="uploads/a.mp4", size_bytes=1,
                    created_at=then, updated_at=then)
    db_session.add(upload)
    db_session.flush()
    return upload


def test_a_stale_pending_upload_is_resent_once_per_stale_period(db_session):
    upload = _upload(db_session, age_s=STALE_S * 2)
    fresh = _upload(db_session, age_s=1)
    first = claim_orphans(db_session, STALE_S, HEARTBEAT_S, resend_inputs=True)
    assert upload.id in first["uploads"] and fresh.id not in first["uploads"]
    # The next sweep, moments later, leaves it alone: one duplicate message per period at most.
    second = claim_orphans(db_session, STALE_S, HEARTBEAT_S, resend_inputs=True)
    assert upload.id not in second["uploads"]
    db_session.refresh(upload)
    assert upload.status == "pending"


def test_inputs_wait_while_the_cpu_queue_has_a_backlog(db_session):
    upload = _upload(db_session, age_s=STALE_S * 2)
    assert upload.id not in claim_orphans(db_session, STALE_S, HEARTBEAT_S, resend_inputs=False)["uploads"]
    # ...and are still there for the sweep after the queue drained.
    assert upload.id in claim_orphans(db_session, STALE_S, HEARTBEAT_S, resend_inputs=True)["uploads"]


def test_a_stale_queued_analysis_goes_back_to_ready(db_session):
    scenario = db_session.scalar(select(Scenario).limit(1))
    video = Video(sha256="d" * 64, path="videos/d.mp4", original_name="d.mp4", size_bytes=1, status="ready")
    db_session.add(video)
    db_session.flush()
    lost = Analysis(video_id=video.id, scenario_id=scenario.id, status="queued",
                    queued_at=utcnow() - timedelta(seconds=STALE_S * 2), worker="gone-gpu")
    db_session.add(lost)
    db_session.flush()
    orphans = claim_orphans(db_session, STALE_S, HEARTBEAT_S, resend_inputs=False)
    assert lost.id in orphans["analyses"]
    db_session.refresh(lost)
    assert (lost.status, lost.worker) == ("ready", None) and lost.ready_at is not None


def test_a_batch_left_ingesting_with_every_upload_settled_is_finished(db_session):
    stuck = _upload(db_session, age_s=STALE_S * 2)
    stuck.status, stuck.updated_at = "done", utcnow() - timedelta(seconds=STALE_S * 2)  # settled long ago
    settling = _upload(db_session, age_s=1)  # its ingest may be finishing the batch right now
    settling.status = "done"
    waiting = _upload(db_session, age_s=STALE_S * 2)  # still pending: not this sweep's business
    db_session.flush()
    orphans = claim_orphans(db_session, STALE_S, HEARTBEAT_S, resend_inputs=False)
    assert stuck.batch_id in orphans["batches"]
    assert settling.batch_id not in orphans["batches"] and waiting.batch_id not in orphans["batches"]
    statuses = {b.id: b.status for b in db_session.scalars(select(Batch).where(
        Batch.id.in_([stuck.batch_id, settling.batch_id, waiting.batch_id])))}
    assert statuses == {stuck.batch_id: "ingested", settling.batch_id: "ingesting", waiting.batch_id: "ingesting"}
