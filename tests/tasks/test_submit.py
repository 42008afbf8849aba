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
