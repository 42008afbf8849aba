"""tasks.ingest: one delivery unpacks an upload into stored videos (each with its analyses)
and records every other member with its reason; a redelivery records nothing twice; a single
video upload is stored without writing its bytes a second time. The real task, in this
process, on the session's PostgreSQL and Redis."""
from __future__ import annotations

import io
import os

import pytest
from sqlalchemy import func, select

from tasks.ingest import ingest_upload
from tests.support.archives import tar_bytes, zip_bytes
from tests.support.corpus import DVD_TITLE_S, dvd_title_set
from tests.support.fault_media import tiny_clips
from vidlora.batches import create_batch, park_file, park_stream
from vidlora.config import get_settings
from vidlora.db import session_scope
from vidlora.models import Analysis, Batch, BatchItem, Upload, Video

SCENARIOS = ["artifact_identification"]


@pytest.fixture(scope="module")
def clips(corpus_dir):
    return tiny_clips(corpus_dir / "tasks-ingest", 3, size="64x48")


def test_an_archive_becomes_videos_and_reasons_and_a_redelivery_adds_nothing(database, broker, clips):
    settings = get_settings()
    data = zip_bytes([("dig/a.mp4", clips[0].read_bytes()), ("dig/b.mp4", clips[1].read_bytes()),
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


def test_two_uploads_finishing_at_once_finish_their_batch(database):
    """Seen in a CI run: both uploads of a batch marked done in concurrent transactions, each
    saw the other as pending, and the batch stayed 'ingesting' for ever."""
    import threading

    from vidlora.batches import finish_batch_if_done
    from vidlora.db import session_scope
    from vidlora.models import Batch, Upload

    with session_scope() as session:
        batch = Batch(name="race", source="web", scenario_names=["tomb_structure"], status="ingesting")
        session.add(batch)
        session.flush()
        uploads = [Upload(batch_id=batch.id, name=f"{i}.mp4", path=f"uploads/race-{i}", size_bytes=1, status="pending")
                   for i in range(2)]
        session.add_all(uploads)
        session.flush()
        batch_id, upload_ids = batch.id, [u.id for u in uploads]
    both_flushed = threading.Barrier(2)
    errors = []

    def finish(upload_id: int) -> None:
        try:
            with session_scope() as session:
                session.get(Upload, upload_id).status = "done"
                session.flush()
                both_flushed.wait(timeout=30)  # both updates in flight, neither committed
                finish_batch_if_done(session, batch_id)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=finish, args=(uid,)) for uid in upload_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    with session_scope() as session:
        assert session.get(Batch, batch_id).status == "ingested"


def test_members_of_one_name_are_all_kept_renamed_and_said_so(database, broker, clips):
    """Issue 32: two different files named same.mp4 in a zip gave "1 done, of 1": the other was
    gone without a reason. So were two uploads of one name in a batch."""
    import warnings

    settings = get_settings()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zipfile warns about the duplicate name: the point
        data = zip_bytes([("dig/same.mp4", clips[0].read_bytes()), ("dig/same.mp4", clips[1].read_bytes())])
    with session_scope() as session:
        batch = create_batch(session, "same-names", "web", SCENARIOS)
        archive = park_stream(session, settings, batch, "dig.zip", io.BytesIO(data), 1 << 30)
        first = park_stream(session, settings, batch, "same.mp4", io.BytesIO(clips[2].read_bytes()), 1 << 30)
        second = park_stream(session, settings, batch, "same.mp4", io.BytesIO(clips[1].read_bytes()), 1 << 30)
        batch_id, uploads = batch.id, [archive.id, first.id, second.id]
    for upload_id in uploads:
        ingest_upload(upload_id)
    for upload_id in uploads:
        ingest_upload(upload_id)  # redelivered: nothing recorded twice, nothing renamed again

    with session_scope() as session:
        items = {i.name: i for i in session.scalars(select(BatchItem).where(BatchItem.batch_id == batch_id))}
        assert sorted(items) == ["dig/same (2).mp4", "dig/same.mp4", "same (2).mp4", "same.mp4"]
        assert all(i.status == "stored" for i in items.values())
        assert "renamed" not in (items["dig/same.mp4"].reason or "") and "renamed" not in (items["same.mp4"].reason or "")
        assert "renamed: another member of the archive is also named dig/same.mp4" in items["dig/same (2).mp4"].reason
        assert "renamed: another file of this batch is also named same.mp4" in items["same (2).mp4"].reason
        assert items["same (2).mp4"].video_id == items["dig/same (2).mp4"].video_id  # the same bytes, one video
        assert len({i.video_id for i in items.values()}) == 3


def test_a_dvd_title_in_parts_is_one_video_with_one_clock(database, broker, corpus_dir, tmp_path):
    """VTS_01_1..3.VOB in a zip (the parts listed out of order, the IFO and menu beside them):
    one stored video, the parts joined in order, so its clock runs on across the seams and no
    picture is lost there; every sampled frame is the whole title's frame at its time. Was:
    three videos, each clock from 0, the pictures at each seam analysed nowhere."""
    from tests.support.reference import matches_reference, reference_frames
    from vidlora.media.frames import sample_video
    from vidlora.media.probe import probe
    from vidlora.media.sampling import SamplingPolicy

    whole, parts, ifo = dvd_title_set(corpus_dir / "dvd-title")
    settings = get_settings()
    members = {"VIDEO_TS/VTS_01_0.IFO": ifo, "VIDEO_TS/VTS_01_2.VOB": parts[1],
               "VIDEO_TS/VTS_01_1.VOB": parts[0], "VIDEO_TS/VTS_01_3.VOB": parts[2]}
    with session_scope() as session:
        batch = create_batch(session, "dvd-title", "cli", SCENARIOS)
        upload = park_stream(session, settings, batch, "disc.zip", io.BytesIO(zip_bytes(members.items())), 1 << 30)
        batch_id, upload_id = batch.id, upload.id
    assert ingest_upload(upload_id) == {"stored": 1, "rejected": 0, "skipped": 4}
    with session_scope() as session:
        items = {i.name: i for i in session.scalars(select(BatchItem).where(BatchItem.batch_id == batch_id))}
        title = items["VIDEO_TS/VTS_01_1-3.VOB"]
        assert title.status == "stored" and title.reason is None
        assert items["VIDEO_TS/VTS_01_2.VOB"].reason == \
            "joined: part 2 of 3 of a DVD title, stored joined as VIDEO_TS/VTS_01_1-3.VOB"
        stored = settings.media_root / session.get(Video, title.video_id).path
    assert stored.read_bytes() == whole.read_bytes()
    info = probe(stored)
    assert info.frame_count == DVD_TITLE_S * 25 and not info.truncated, info
    # 12 samples: two of them in the GOPs the cuts fall in
    res = sample_video(stored, SamplingPolicy(mode="uniform", num_frames=12, max_pixels=192 * 160), tmp_path / "f",
                       info=info)
    assert res.note is None and len(set(res.timestamps)) == 12
    matches_reference(res, tmp_path, reference_frames(whole, (res.width, res.height), False))


def test_a_dvd_title_in_a_tar_is_joined_whatever_order_the_parts_come_in(database, broker, corpus_dir):
    """A tar is read once, front to back, and `tar` writes a folder in directory order: the
    parts come out of order with other members between them. They are joined in part order,
    byte for byte the title; a part cut short is said, by the IFO the tar carries. Was: three
    videos, each clock from 0."""
    whole, parts, ifo = dvd_title_set(corpus_dir / "dvd-title")
    settings = get_settings()
    kept = []
    for label, third in (("whole", parts[2]), ("cut", parts[2][: len(parts[2]) // 2 // 2048 * 2048])):
        members = [("VIDEO_TS/VTS_01_3.VOB", third), ("VIDEO_TS/VTS_01_0.IFO", ifo),
                   ("VIDEO_TS/VTS_01_1.VOB", parts[0]), ("VIDEO_TS/notes.txt", b"disc 4 of 9"),
                   ("VIDEO_TS/VTS_01_2.VOB", parts[1])]
        with session_scope() as session:
            batch = create_batch(session, f"dvd-tar-{label}", "cli", SCENARIOS)
            upload = park_stream(session, settings, batch, "disc.tar.gz",
                                 io.BytesIO(tar_bytes(members, "w:gz")), 1 << 30)
            batch_id, upload_id = batch.id, upload.id
        assert ingest_upload(upload_id) == {"stored": 1, "rejected": 0, "skipped": 5}
        with session_scope() as session:
            items = {i.name: i for i in session.scalars(select(BatchItem).where(BatchItem.batch_id == batch_id))}
            title = items["VIDEO_TS/VTS_01_1-3.VOB"]
            assert items["VIDEO_TS/VTS_01_3.VOB"].reason == \
                "joined: part 3 of 3 of a DVD title, stored joined as VIDEO_TS/VTS_01_1-3.VOB"
            kept.append((title.status, title.reason, settings.media_root / session.get(Video, title.video_id).path))
    (status, reason, stored), (cut_status, cut_reason, cut_stored) = kept
    assert status == "stored" and reason in (None, "duplicate: content already stored")  # the zip test's title
    assert stored.read_bytes() == whole.read_bytes()
    assert cut_status == "stored" and cut_reason.startswith("incomplete_title: the title set's IFO declares")
    assert cut_stored.read_bytes() == parts[0] + parts[1] + parts[2][: len(parts[2]) // 2 // 2048 * 2048]


def test_a_dvd_title_missing_a_part_is_joined_and_says_so(database, broker, corpus_dir):
    _, parts, ifo = dvd_title_set(corpus_dir / "dvd-title")
    settings = get_settings()
    members = {"VTS_02_0.IFO": ifo, "VTS_02_1.VOB": parts[0], "VTS_02_3.VOB": parts[2]}
    with session_scope() as session:
        batch = create_batch(session, "dvd-title-gap", "cli", SCENARIOS)
        upload = park_stream(session, settings, batch, "disc.zip", io.BytesIO(zip_bytes(members.items())), 1 << 30)
        batch_id, upload_id = batch.id, upload.id
    assert ingest_upload(upload_id) == {"stored": 1, "rejected": 0, "skipped": 3}
    with session_scope() as session:
        title = session.scalar(select(BatchItem).where(BatchItem.batch_id == batch_id,
                                                       BatchItem.name == "VTS_02_1-3.VOB"))
    assert title.status == "stored" and title.reason == \
        "incomplete_title: VTS_02_2.VOB of this DVD title is missing; the parts were joined without it"

