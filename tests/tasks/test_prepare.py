"""tasks.prepare: one delivery probes a video once, scans its packets once, samples each
sampling policy its scenarios need once (scenarios sharing a policy share the frames), and
makes every analysis ready; a rejected video rejects its analyses with the probe's reason.

The task runs in this process against the session's real PostgreSQL and Redis."""
from __future__ import annotations

import pytest
from sqlalchemy import select

from tasks.prepare import prepare_video
from vidlora.config import get_settings
from vidlora.db import session_scope
from vidlora.ingest.store import MediaStore
from vidlora.models import Analysis, Batch, FrameSet, Scenario, Video
from tests.support.fault_media import tiny_clips

SCENARIOS = ["artifact_identification", "tomb_structure", "murals_inscriptions"]  # 2 policies


def _register(path, name: str) -> int:
    settings = get_settings()
    stored = MediaStore(settings.media_root).put_file(path, 1 << 30)
    with session_scope() as session:
        batch = Batch(name=name, source="cli", scenario_names=SCENARIOS)
        session.add(batch)
        session.flush()
        video = Video(sha256=stored.sha256, path=stored.path.relative_to(settings.media_root).as_posix(),
                      original_name=path.name, size_bytes=stored.size)
        session.add(video)
        session.flush()
        for scenario in session.scalars(select(Scenario).where(Scenario.name.in_(SCENARIOS))):
            session.add(Analysis(video_id=video.id, scenario_id=scenario.id, batch_id=batch.id))
        return video.id


@pytest.fixture(scope="module")
def clips(corpus_dir):
    return tiny_clips(corpus_dir / "tasks", 2, size="96x64")


def test_one_delivery_probes_once_scans_once_and_samples_each_policy_once(database, broker, clips, monkeypatch):
    import importlib

    from vidlora.media import ffprobe

    scans = []
    real = ffprobe.read_frame_table

    def counted(*args, **kwargs):
        scans.append(args[0])
        return real(*args, **kwargs)

    for module in ("vidlora.media.ffprobe", "vidlora.media.frames", "vidlora.media.probe"):
        monkeypatch.setattr(importlib.import_module(module), "read_frame_table", counted)

    video_id = _register(clips[0], "prepare-once")
    assert prepare_video(video_id) == 3
    assert len(scans) == 1
    with session_scope() as session:
        video = session.get(Video, video_id)
        assert video.status == "ready" and video.width == 96 and video.height == 64
        sets = session.scalars(select(FrameSet).where(FrameSet.video_id == video_id)).all()
        assert len(sets) == 2 and all(fs.status == "done" and fs.files for fs in sets)
        rows = session.scalars(select(Analysis).where(Analysis.video_id == video_id)).all()
        # ready, or already queued: prepare's dispatch message may reach the session's cpu worker
        assert {a.status for a in rows} <= {"ready", "queued"} and {a.frame_set_id for a in rows} == {fs.id for fs in sets}
    # A duplicate message finds nothing left to do: no probe, no scan, no attempt counted.
    assert prepare_video(video_id) == 0 and len(scans) == 1


def test_a_text_file_named_mp4_is_rejected_with_its_reason_and_so_are_its_analyses(database, broker, tmp_path):
    fake = tmp_path / "notes.mp4"
    fake.write_text("field notes, not a video\n" * 20)
    video_id = _register(fake, "prepare-text")
    assert prepare_video(video_id) == 0
    with session_scope() as session:
        video = session.get(Video, video_id)
        assert video.status == "rejected" and "not a video" in video.reason
        rows = session.scalars(select(Analysis).where(Analysis.video_id == video_id)).all()
        assert len(rows) == 3 and all(a.status == "rejected" and a.reason == video.reason for a in rows)


@pytest.fixture(scope="module")
def footage(corpus_dir):
    from tests.support.corpus import footage_videos

    return footage_videos(corpus_dir / "footage")


def test_an_interlaced_partial_recording_is_analysed_and_says_so(database, broker, footage, tmp_path):
    """A DVD VOB (interlaced) and a transport stream cut short: both prepared; the video row
    keeps the field order and the truncation, every frame set says it was deinterlaced."""
    vob = _register(footage["dvd_vob"], "prepare-vob")
    cut = _register(footage["truncated_ts"], "prepare-cut")
    assert prepare_video(vob) == 3 and prepare_video(cut) == 3
    with session_scope() as session:
        video = session.get(Video, vob)
        assert (video.field_order, video.truncated, video.container) == ("tt", False, "mpeg")
        sets = session.scalars(select(FrameSet).where(FrameSet.video_id == vob)).all()
        assert sets and all(fs.deinterlace == "bwdif" and fs.decode_note is None for fs in sets)
        video = session.get(Video, cut)
        assert video.truncated and video.declared_duration_s is None and 1.5 < video.duration_s < 2.5
        sets = session.scalars(select(FrameSet).where(FrameSet.video_id == cut)).all()
        assert sets and all(fs.status == "done" and fs.deinterlace is None for fs in sets)


def test_open_gop_avi_b_frames_and_honest_partial_notices_through_prepare(database, broker, corpus_dir):
    """Issue 49 through the task users' uploads take: an open-GOP MP4 (was refused as damaged),
    XviD with B-frames in AVI (was a frame early), a complete MKV whose audio outlasts the
    pictures (was flagged partial) and an AVI whose header declares 100 hours over 3 s (was
    refused as too long) are all prepared; every stored frame is the frame its time names."""
    from tests.support.corpus import FOOTAGE_FPS, read_frame_code, round2_videos

    clips = round2_videos(corpus_dir / "footage2")
    partial = {"open_gop_mp4": False, "xvid_avi": False, "audio_longer_mkv": False, "declares_100h_avi": True}
    ids = {name: _register(clips[name], f"prepare-{name}") for name in partial}
    for name, video_id in ids.items():
        assert prepare_video(video_id) == 3, name
    root = get_settings().media_root
    with session_scope() as session:
        for name, video_id in ids.items():
            video = session.get(Video, video_id)
            assert (video.status, video.reason, video.truncated) == ("ready", None, partial[name]), name
            sets = session.scalars(select(FrameSet).where(FrameSet.video_id == video_id)).all()
            assert len(sets) == 2 and all(fs.status == "done" and fs.decode_note is None for fs in sets), name
            for fs in sets:
                codes = [read_frame_code(root / f) for f in fs.files]
                assert codes == [round(t * FOOTAGE_FPS) for t in fs.timestamps], (name, fs.timestamps)


def test_drop_outs_cut_open_gops_and_recordings_still_being_written_through_prepare(database, broker, corpus_dir,
                                                                                    tmp_path):
    """Issue 62 through the task: a transport stream with a drop-out (its frame sets keep only
    clean frames, each at its own time, and say where the file is damaged; was: a concealed
    picture stored, or "decoding failed ... Re-encode it"), an open-GOP recording cut with
    -c copy (was refused as damaged), an MKV whose audio starts 5 s ahead (was flagged
    partial), and an MKV copied while still being written (was analysed as complete)."""
    import numpy as np
    from PIL import Image

    from tests.support.corpus import DROPOUT_AT_S, OPEN_GOP_CUT_FRAMES, read_frame_code, round3_videos, snapshot
    from tests.support.reference import psnr, reference_frames

    clips = round3_videos(corpus_dir / "footage3")
    growing = snapshot(clips["live_mkv"], tmp_path / "recording.mkv", 0.45)
    cases = {"dropout_ts": (clips["dropout_ts"], False, 0), "open_gop_cut_mkv": (clips["open_gop_cut_mkv"], False,
             OPEN_GOP_CUT_FRAMES), "audio_5s_first_mkv": (clips["audio_5s_first_mkv"], False, 0),
             "growing_mkv": (growing, True, 0)}
    ids = {name: _register(path, f"prepare-{name}") for name, (path, _, _) in cases.items()}
    for name, video_id in ids.items():
        assert prepare_video(video_id) == 3, name
    root = get_settings().media_root
    with session_scope() as session:
        for name, video_id in ids.items():
            video = session.get(Video, video_id)
            assert (video.status, video.reason, video.truncated) == ("ready", None, cases[name][1]), name
            sets = session.scalars(select(FrameSet).where(FrameSet.video_id == video_id)).all()
            assert len(sets) == 2 and all(fs.status == "done" for fs in sets), name
            for fs in sets:
                codes = [read_frame_code(root / f) for f in fs.files]
                assert codes == [cases[name][2] + round(t * 25) for t in fs.timestamps], (name, fs.timestamps)
                if name != "dropout_ts":
                    assert fs.decode_note is None, (name, fs.decode_note)
                    continue
                assert max(fs.timestamps) < DROPOUT_AT_S and "the file is damaged at" in fs.decode_note
                size = Image.open(root / fs.files[0]).size
                ref = reference_frames(clips["dropout_src_ts"], size, False)
                for t, f in zip(fs.timestamps, fs.files):
                    Image.fromarray(ref[round(t * 25)]).save(tmp_path / "ref.jpg", "JPEG", quality=get_settings().jpeg_quality)
                    got = np.asarray(Image.open(root / f).convert("RGB"))
                    assert psnr(got, np.asarray(Image.open(tmp_path / "ref.jpg").convert("RGB"))) > 40, (t, f)
