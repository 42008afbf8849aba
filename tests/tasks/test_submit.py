"""tasks.submit: files given by path (the CLI's way in) are taken only once they stop
changing. A recording still being written (a growing MKV, an archive still being copied) is
refused with a reason that says so; finished files beside it are parked as always. The real
function, on the session's PostgreSQL and Redis."""
from __future__ import annotations

import os
import shutil
import threading
import time

from sqlalchemy import select

from tasks.submit import submit_paths
from tests.support.corpus import dvd_title_set
from tests.support.fault_media import tiny_clips
from vidlora.config import get_settings
from vidlora.db import session_scope
from vidlora.models import BatchItem, Upload

SCENARIOS = ["artifact_identification"]


def test_a_recording_still_being_written_is_refused_and_a_finished_one_taken(database, broker, corpus_dir, tmp_path):
    clip = tiny_clips(corpus_dir / "tasks-submit", 1, size="64x48")[0]
    finished = tmp_path / "finished.mp4"
    shutil.copyfile(clip, finished)
    hour_ago = time.time() - 3600
    os.utime(finished, (hour_ago, hour_ago))  # untouched for an hour: taken without a wait
    growing = tmp_path / "recording.mkv"
    data = clip.read_bytes()
    growing.write_bytes(data[:1024])
    stop = threading.Event()

    def recorder() -> None:  # a recorder appending a buffer every 50 ms
        at = 1024
        while not stop.is_set():
            with open(growing, "ab") as f:
                f.write(data[at:at + 512] or b"\0" * 512)
            at += 512
            time.sleep(0.05)

    writer = threading.Thread(target=recorder)
    writer.start()
    try:
        started = time.monotonic()
        batch_id, parked = submit_paths([finished, growing], SCENARIOS, "still-being-written")
        waited = time.monotonic() - started
    finally:
        stop.set()
        writer.join()
    assert parked == 1 and waited >= get_settings().ingest_settle_s
    with session_scope() as session:
        items = {i.name: i for i in session.scalars(select(BatchItem).where(BatchItem.batch_id == batch_id))}
        uploads = [u.name for u in session.scalars(select(Upload).where(Upload.batch_id == batch_id))]
    assert uploads == ["finished.mp4"]
    refused = items["recording.mkv"]
    assert refused.status == "rejected" and refused.reason.startswith("still_being_written: the file grew from ")
    assert "Add it again once it is complete" in refused.reason


def test_a_dvd_folder_is_parked_as_its_title_joined(database, broker, corpus_dir, tmp_path):
    """A VIDEO_TS folder given by path: its title's parts become one upload, in part order
    (the whole title's bytes), each part recorded as joined into it."""
    whole, parts, ifo = dvd_title_set(corpus_dir / "dvd-title")
    disc = tmp_path / "disc" / "VIDEO_TS"
    disc.mkdir(parents=True)
    (disc / "VTS_01_0.IFO").write_bytes(ifo)
    for k, data in enumerate(parts, 1):
        (disc / f"VTS_01_{k}.VOB").write_bytes(data)
    hour_ago = time.time() - 3600
    for f in disc.iterdir():
        os.utime(f, (hour_ago, hour_ago))
    batch_id, parked = submit_paths([tmp_path / "disc"], SCENARIOS, "dvd-folder")
    assert parked == 1
    with session_scope() as session:
        uploads = list(session.scalars(select(Upload).where(Upload.batch_id == batch_id)))
        items = {i.name: i for i in session.scalars(select(BatchItem).where(BatchItem.batch_id == batch_id))}
    assert [u.name for u in uploads] == ["disc/VIDEO_TS/VTS_01_1-3.VOB"]
    assert (get_settings().media_root / uploads[0].path).read_bytes() == whole.read_bytes()
    assert items["disc/VIDEO_TS/VTS_01_3.VOB"].reason == \
        "joined: part 3 of 3 of a DVD title, stored joined as disc/VIDEO_TS/VTS_01_1-3.VOB"
