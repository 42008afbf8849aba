"""The CPU half of the pipeline, through a real Celery worker on real Redis and PostgreSQL:
ingest (folders, archives, hostile archives), probe, frame sampling, rejection of bad input,
and survival of a worker killed mid-task."""

from __future__ import annotations

import io
import os
import shutil
import signal
import tarfile
import zipfile
from pathlib import Path

import pytest
from sqlalchemy import func, select

from tests.support.workers import wait_for
from tests.support.corpus import bad_videos, good_videos

SCENARIOS = ["artifact_identification", "tomb_structure"]


def batch_state(batch_id: int):
    from vidlora.db import session_scope
    from vidlora.status import batch_view

    with session_scope() as session:
        return batch_view(session, batch_id)


def waiting_for_gpu(view) -> bool:
    """CPU work is over: every analysis is final or handed to the GPU side (a GPU worker of
    another test module may be running it already)."""
    return (
        view.status != "ingesting"
        and view.uploads_pending == 0
        and all(a.status in ("queued", "ready", "running", "done", "failed", "rejected")
                for v in view.videos for a in v.analyses)
    )


def submit(paths, scenarios=SCENARIOS, name="test"):
    from tasks.submit import submit_paths

    batch_id, _ = submit_paths([Path(p) for p in paths], scenarios, name)
    return batch_id


@pytest.fixture(scope="module", autouse=True)
def no_gpu_work_left_behind(database, broker):
    """These tests stop at the GPU queue. Their analyses must not be waiting there when a
    later module starts a GPU worker, or that module spends its time budget on them."""
    yield
    from sqlalchemy import update

    from tasks.celery_app import get_app
    from vidlora.db import session_scope
    from vidlora.models import Analysis

    get_app().control.purge()
    with session_scope() as session:
        session.execute(
            update(Analysis).where(Analysis.status.in_(("ready", "queued")))
            .values(status="failed", reason="test teardown: CPU-stage tests do not run the GPU stage")
        )


@pytest.fixture(scope="module")
def good(corpus_dir):
    return good_videos(corpus_dir / "good")


@pytest.fixture(scope="module")
def bad(corpus_dir):
    return bad_videos(corpus_dir / "bad")


def frame_sets_of(video_id: int):
    from vidlora.db import session_scope
    from vidlora.models import FrameSet

    with session_scope() as session:
        return session.scalars(select(FrameSet).where(FrameSet.video_id == video_id)).all()


def test_folder_of_varied_videos_is_probed_and_sampled(cpu_worker, good, tmp_path):
    from vidlora.config import get_settings

    folder = tmp_path / "footage"
    for name, path in good.items():
        (folder / name[:1]).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, folder / name[:1] / path.name)
    (folder / "notes.txt").write_text("field notes")
    batch_id = submit([folder])
    view = wait_for(lambda: (v := batch_state(batch_id)) and waiting_for_gpu(v) and v, 240, what="cpu stage")
    assert len(view.videos) == len(good)
    assert [n for n, _ in view.skipped] == ["footage/n/notes.txt"] or any("notes.txt" in n for n, _ in view.skipped)
    media_root = get_settings().media_root
    for video in view.videos:
        assert video.status == "ready", (video.name, video.reason)
        assert {a.scenario for a in video.analyses} == set(SCENARIOS)
        assert all(a.status in ("queued", "ready") for a in video.analyses), video
        sets = frame_sets_of(video.id)
        # artifact_identification: uniform 8; tomb_structure: fps 2 within [4, 8]
        assert len(sets) == 2
        for fs in sets:
            assert fs.status == "done", fs.reason
            assert fs.width % 32 == 0 and fs.height % 32 == 0
            assert fs.width * fs.height <= fs.policy["max_pixels"]
            assert len(fs.files) == len(fs.timestamps)
            assert 4 <= len(fs.files) <= 8
            assert fs.timestamps == sorted(fs.timestamps)
            assert 0 <= fs.timestamps[0] and fs.timestamps[-1] <= video.duration_s + 1e-6
            for rel in fs.files:
                data = (media_root / rel).read_bytes()
                assert data[:3] == b"\xff\xd8\xff", rel  # JPEG
        if "portrait" in video.name:
            assert all(fs.height > fs.width for fs in sets)


def test_archive_is_ingested_and_duplicates_are_not_analysed_twice(cpu_worker, good, tmp_path):
    from vidlora.db import session_scope
    from vidlora.models import Analysis, Video

    names = sorted(good)[:3]
    archive = tmp_path / "dig.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in names:
            tar.add(good[name], arcname=f"site/{good[name].name}")
            tar.add(good[name], arcname=f"copy/{good[name].name}")  # same bytes, other name
    first = submit([archive])
    view = wait_for(lambda: (v := batch_state(first)) and waiting_for_gpu(v) and v, 240, what="archive")
    assert len(view.videos) == len(names)
    with session_scope() as session:
        before = session.scalar(select(func.count()).select_from(Analysis))
        videos_before = session.scalar(select(func.count()).select_from(Video))
    again = submit([archive], name="re-upload")
    wait_for(lambda: (v := batch_state(again)) and waiting_for_gpu(v), 120, what="re-upload")
    with session_scope() as session:
        assert session.scalar(select(func.count()).select_from(Analysis)) == before
        assert session.scalar(select(func.count()).select_from(Video)) == videos_before


def test_bad_inputs_are_rejected_with_their_reason_and_good_ones_finish(cpu_worker, good, bad, tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    for name, (path, _reason) in bad.items():
        shutil.copy(path, folder / f"{name}{path.suffix}")
    good_name = sorted(good)[0]
    shutil.copy(good[good_name], folder / f"good_{good[good_name].name}")
    batch_id = submit([folder])
    view = wait_for(lambda: (v := batch_state(batch_id)) and waiting_for_gpu(v) and v, 240, what="bad corpus")
    by_name = {Path(v.name).stem: v for v in view.videos}
    for name, (_path, reason) in bad.items():
        video = by_name[name]
        assert video.status == "rejected", (name, video.status, video.reason)
        assert reason.lower() in (video.reason or "").lower(), (name, video.reason)
        assert all(a.status == "rejected" and a.reason for a in video.analyses)
    good_video = by_name[f"good_{Path(good[good_name].name).stem}"]
    assert good_video.status == "ready"


def test_hostile_archive_members_are_rejected_and_good_members_kept(cpu_worker, good, tmp_path):
    payload = good[sorted(good)[0]].read_bytes()
    archive = tmp_path / "hostile.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("ok/clip.mp4", payload)
        zf.writestr("../escape.mp4", payload)
        zf.writestr("/abs/path.mp4", payload)
        zf.writestr("readme.txt", "not a video")
        inner = io.BytesIO()
        with zipfile.ZipFile(inner, "w") as nested:
            nested.writestr("inner.mp4", payload)
        zf.writestr("nested.zip", inner.getvalue())
    batch_id = submit([archive], scenarios=["artifact_identification"])
    view = wait_for(lambda: (v := batch_state(batch_id)) and waiting_for_gpu(v) and v, 120, what="hostile")
    rejected = dict(view.rejected)
    assert set(rejected) >= {"../escape.mp4", "/abs/path.mp4", "nested.zip"}
    assert all(reason for reason in rejected.values())
    assert [n for n, _ in view.skipped] == ["readme.txt"]
    assert [v.status for v in view.videos] == ["ready"]
    assert not (tmp_path.parent / "escape.mp4").exists()


def _long_gop_clip(path: Path) -> Path:
    """20 s of 1080p with one keyframe: every seek decodes from the start, so sampling
    takes seconds and the worker can be killed while it is busy."""
    import subprocess

    if not path.exists():
        subprocess.run([
            "ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=size=1920x1080:rate=30:duration=20",
            "-c:v", "libx264", "-preset", "ultrafast", "-g", "600", "-pix_fmt", "yuv420p", str(path),
        ], check=True, timeout=300)
    return path


def test_cpu_worker_killed_mid_task_still_prepares_each_video_exactly_once(cpu_worker, corpus_dir):
    from vidlora.db import session_scope
    from vidlora.models import FrameSet, Video

    clip = _long_gop_clip(corpus_dir / "long_gop_1080p.mp4")
    batch_id = submit([clip], scenarios=["artifact_identification"], name="kill")

    def probing_video():
        with session_scope() as session:
            return session.scalar(select(Video.id).where(Video.original_name == clip.name, Video.status == "probing"))

    video_id = wait_for(probing_video, 120, interval=0.05, what="prepare to start")
    children = cpu_worker.child_pids()
    assert children, "prefork worker has no child to kill"
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    view = wait_for(lambda: (v := batch_state(batch_id)) and waiting_for_gpu(v) and v, 300, what="redelivery")
    video = next(v for v in view.videos if v.id == video_id)
    assert video.status == "ready", video.reason
    with session_scope() as session:
        sets = session.scalars(select(FrameSet).where(FrameSet.video_id == video_id)).all()
        attempts = session.get(Video, video_id).attempts
    assert attempts == 2, "the kill must have interrupted the first delivery, and only one more ran"
    assert len(sets) == 1 and sets[0].status == "done" and len(sets[0].files) == 8
    assert len(video.analyses) == 1 and video.analyses[0].status in ("queued", "ready")
