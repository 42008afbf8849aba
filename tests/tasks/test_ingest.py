"""tasks.ingest: one delivery unpacks an upload into stored videos (each with its analyses)
and records every other member with its reason; a redelivery records nothing twice; a single
video upload is stored without writing its bytes a second time. The real task, in this
process, on the session's PostgreSQL and Redis."""
from __future__ import annotations

import io
import os
import zipfile

import pytest
from sqlalchemy import func, select

from tasks.ingest import ingest_upload
from tests.support.fault_media import tiny_clips
from vidlora.batches import create_batch, park_file, park_stream
from vidlora.config import get_settings
from vidlora.db import session_scope
from vidlora.models import Analysis, Batch, BatchItem, Upload, Video

SCENARIOS = ["artifact_identification"]


@pytest.fixture(scope="module")
def clips(corpus_dir):
    return tiny_clips(corpus_dir / "tasks-ingest", 3, size="64x48")


def _zip(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members:
            zf.writestr(name, data)
    return buf.getvalue()


def test_an_archive_becomes_videos_and_reasons_and_a_redelivery_adds_nothing(database, broker, clips):
    settings = get_settings()
    data = _zip([("dig/a.mp4", clips[0].read_bytes()), ("dig/b.mp4", clips[1].read_bytes()),
                 ("dig/notes.txt", b"field notes"), ("../escape.mp4", clips[2].read_bytes())])
    with session_scope() as session:
        batch = create_batch(session, "ingest-archive", "cli", SCENARIOS)
        upload = park_stream(session, settings, batch, "dig.zip", io.BytesIO(data), 1 << 30)
        batch_id, upload_id = batch.id, upload.id
    counts = ingest_upload(upload_id)
    assert counts == {"stored": 2, "rejected": 1, "skipped": 1}
    with session_scope() as session:
        items = {i.name: i for i in session.scalars(select(BatchItem).where(BatchItem.batch_id == batch_id))}
        assert items["dig/notes.txt"].status == "skipped" and items["dig/notes.txt"].reason.startswith("not_video")
        assert next(i for n, i in items.items() if "escape" in n).status == "rejected"
        videos = [items["dig/a.mp4"].video_id, items["dig/b.mp4"].video_id]
        assert session.scalar(select(func.count()).select_from(Analysis).where(Analysis.video_id.in_(videos))) == 2
        assert session.get(Upload, upload_id).status == "done" and session.get(Batch, batch_id).status == "ingested"
    assert ingest_upload(upload_id) == {"skipped": 1}  # a duplicate message: nothing recorded twice
    with session_scope() as session:
        assert session.scalar(select(func.count()).select_from(BatchItem).where(BatchItem.batch_id == batch_id)) == 4


def test_a_single_video_is_linked_into_the_store_not_copied(database, broker, clips, monkeypatch):
    settings = get_settings()
    with session_scope() as session:
        batch = create_batch(session, "ingest-single", "cli", SCENARIOS)
        upload = park_file(session, settings, batch, clips[2], "escape-free.mp4")
        upload_id, parked = upload.id, settings.media_root / upload.path
    inode = os.stat(parked).st_ino
    assert ingest_upload(upload_id) == {"stored": 1, "rejected": 0, "skipped": 0}
    with session_scope() as session:
        item = session.scalar(select(BatchItem).where(BatchItem.name == "escape-free.mp4"))
        video = session.get(Video, item.video_id)
        assert os.stat(settings.media_root / video.path).st_ino == inode  # the parked bytes themselves
    assert not parked.exists()  # the parked name is gone once the video is recorded
