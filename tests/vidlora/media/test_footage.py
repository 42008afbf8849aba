"""Camcorder, broadcast and DVD footage (issue 31): long MPEG-TS, interlaced H.264 in .MTS and
MPEG-2 in .VOB, DV and MJPEG in AVI, two recordings joined with ``cat``, MKV with negative
timestamps, files cut short. Second round (issue 49): open-GOP H.264 remuxed to MP4 and MKV,
XviD and H.264 with B-frames in AVI, MKV/WebM whose audio outlasts or precedes the pictures, a
cut AVI, an AVI whose header declares 100 hours over 3 s of pictures.

Every sampled JPEG is checked three ways: its timestamp is the frame at or before its target,
its frame-code strip names that frame, and its picture matches an independent reference
decode (ffmpeg from the start, no seeking, deinterlaced with bwdif where interlaced) of the same
frame. Long files are sampled by seeking: the ffmpeg backend decodes a few keyframe intervals
per pick, not the whole file.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.support.corpus import (
    DECLARED_HOURS, DROPOUT_AT_S, FOOTAGE_FPS, LONG_TS_FPS, LONG_TS_S, OPEN_GOP_CUT_FRAMES, footage_videos,
    read_frame_code, round2_videos, round3_videos, snapshot,
)
from tests.support.reference import matches_reference, psnr, reference_frames
from vidlora.config import Settings
from vidlora.media import decoders
from vidlora.media.frames import _delivered, sample_video
from vidlora.media.probe import BadVideo, probe, probe_with_table
from vidlora.media.sampling import SamplingPolicy, plan_timestamps

from .conftest import decoded_frame_times

POLICY = SamplingPolicy(mode="uniform", num_frames=8, max_pixels=192 * 160)
WOVEN = {"avchd_mts", "dvd_vob", "dv_avi"}


@pytest.fixture(scope="module")
def footage(corpus_dir):
    return {**footage_videos(corpus_dir / "footage"), **round2_videos(corpus_dir / "footage2")}


def combing(path: Path) -> float:
    """Adjacent-row difference over two-rows-apart difference (luma): higher where two fields
    of a moving scene are woven together (adjacent rows come from different instants)."""
    y = np.asarray(Image.open(path).convert("L"), dtype=np.float64)
    return float(np.abs(np.diff(y, axis=0)).mean() / max(1e-9, np.abs(y[2:] - y[:-2]).mean()))


EXPECTED = {  # name: (container, interlaced, truncated, fps, frames)
    "avchd_mts": ("mpegts", True, False, FOOTAGE_FPS, 75),
    "long_ts": ("mpegts", False, False, LONG_TS_FPS, LONG_TS_S * LONG_TS_FPS),
    "dvd_vob": ("mpeg", True, False, FOOTAGE_FPS, 75),
    "dv_avi": ("avi", True, False, FOOTAGE_FPS, 25),
    "mjpeg_avi": ("avi", False, False, FOOTAGE_FPS, 100),
    "h264_avi": ("avi", False, False, FOOTAGE_FPS, 100),
    "joined_ts": ("mpegts", False, False, FOOTAGE_FPS, 100),
    "negative_mkv": ("matroska", False, False, FOOTAGE_FPS, 100),
    "truncated_mp4": ("mp4", False, True, FOOTAGE_FPS, None),
    "truncated_ts": ("mpegts", False, True, FOOTAGE_FPS, None),
    # issue 49: open GOPs were refused as damaged (the decoder's complaint about the pictures
    # before a sought I-frame counted against it), B-frame AVI came out one frame early, the
    # audio cases were flagged partial, the cut AVI was not, the 100-hour header was refused.
    "open_gop_mp4": ("mp4", False, False, FOOTAGE_FPS, 100),
    "open_gop_mkv": ("matroska", False, False, FOOTAGE_FPS, 100),
    "xvid_avi": ("avi", False, False, FOOTAGE_FPS, 100),
    "h264_bframes_avi": ("avi", False, False, FOOTAGE_FPS, 100),
    "audio_longer_mkv": ("matroska", False, False, FOOTAGE_FPS, 75),
    "audio_first_webm": ("webm", False, False, FOOTAGE_FPS, 75),
    "cut_avi": ("avi", False, True, FOOTAGE_FPS, None),
    "declares_100h_avi": ("avi", False, True, FOOTAGE_FPS, 75),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_footage_is_accepted_and_every_frame_is_the_reference_frame(footage, name, tmp_path):
    container, interlaced, truncated, fps, frames = EXPECTED[name]
    path = footage[name]
    info = probe(path)
    assert (info.container, info.interlaced, info.truncated) == (container, interlaced, truncated), info
    if frames is not None:
        assert info.frame_count == frames and info.duration_s == pytest.approx(frames / fps, abs=1e-6)
    policy = SamplingPolicy(mode="uniform", num_frames=16, max_pixels=POLICY.max_pixels) if name == "long_ts" else POLICY
    res = sample_video(path, policy, tmp_path / "f", info=info)
    # Sought, not decoded from the start (the MKV has no timestamps ffprobe can read: it must be).
    assert res.note is None if name != "negative_mkv" else "no usable timestamps" in res.note, res.note
    assert res.deinterlace == ("bwdif" if interlaced else None)
    targets = plan_timestamps(info, policy)
    assert res.timestamps == pytest.approx([math.floor(t * fps + 1e-6) / fps for t in targets], abs=1e-6)
    step = 2 if interlaced else 1  # a woven frame shows its first field's source frame
    codes = [read_frame_code(p) for p in res.paths(tmp_path)]
    assert codes == [round(t * fps) * step % 256 for t in res.timestamps], (name, res.backend)
    # The reference frame, JPEG-encoded like the sampler's: the same pixels give (nearly) the
    # same JPEG; a neighbouring frame or a combed picture is far off.
    ref = reference_frames(path, (res.width, res.height), interlaced)
    for t, p in zip(res.timestamps, res.paths(tmp_path)):
        got = np.asarray(Image.open(p).convert("RGB"))
        Image.fromarray(ref[round(t * fps)]).save(tmp_path / "ref.jpg", "JPEG", quality=Settings().jpeg_quality)
        # PyAV (the MP4 backend) converts colours and scales with other code than ffmpeg's CLI
        floor = 45 if res.backend == "ffmpeg" else 28
        assert psnr(got, np.asarray(Image.open(tmp_path / "ref.jpg").convert("RGB"))) > floor, (name, t)


def test_interlaced_frames_reach_the_model_whole_not_combed(footage, tmp_path):
    """Full-height frames (192x128 stays 192x128): woven fields comb every moving edge, the
    deinterlaced picture does not."""
    full = dict(mode="uniform", num_frames=4, max_pixels=192 * 128)
    woven = sample_video(footage["avchd_mts"], SamplingPolicy(**full, deinterlace="off"), tmp_path / "off" / "f")
    whole = sample_video(footage["avchd_mts"], SamplingPolicy(**full), tmp_path / "auto" / "f")
    assert (woven.width, woven.height) == (whole.width, whole.height) == (192, 128)
    assert woven.deinterlace is None and whole.deinterlace == "bwdif"
    before = [combing(p) for p in woven.paths(tmp_path / "off")]
    after = [combing(p) for p in whole.paths(tmp_path / "auto")]
    # testsrc2 moves little between fields, so the woven ratio is modest; every woven frame is
    # still well above every deinterlaced one (which match the bwdif reference: test above)
    assert min(before) > max(after) + 0.1, (before, after)


def test_deinterlacing_is_part_of_the_policy_key():
    off = SamplingPolicy(mode="uniform", deinterlace="off")
    assert off.key() != SamplingPolicy(mode="uniform").key() and off.key().endswith("deint=off")
    assert off.describe().endswith("interlaced video not deinterlaced")
    assert SamplingPolicy.from_dict(off.as_dict()) == off
    with pytest.raises(ValueError, match="deinterlace"):
        SamplingPolicy.from_dict({"mode": "uniform", "deinterlace": "yadif-please"})


def test_avi_and_program_stream_timestamps_come_from_packets_not_a_full_decode(footage):
    """H.264 in AVI carries no pts, an MPEG-PS packet can hold two frames' data with one pts:
    where frames are never reordered the packets' dts give the times, equal to a full decode's."""
    for name in ("h264_avi", "dvd_vob"):
        _, table = probe_with_table(footage[name])
        assert not table.synthetic
        assert [round(t, 6) for t in table.times()] == [round(t, 6) for t in decoded_frame_times(footage[name])], name


def test_a_joined_recording_keeps_both_halves(footage, tmp_path):
    info, table = probe_with_table(footage["joined_ts"])
    assert len(table.segments) == 2 and info.duration_s == pytest.approx(4.0)
    # A window inside the second half: frames 62..87, not the first half's frames at the same pts.
    res = sample_video(footage["joined_ts"], SamplingPolicy(mode="uniform", num_frames=4, start_s=2.5, end_s=3.5,
                                                            max_pixels=POLICY.max_pixels), tmp_path / "f",
                       info=info, table=table)
    assert res.timestamps == [2.6, 2.84, 3.12, 3.36]
    assert [read_frame_code(p) for p in res.paths(tmp_path)] == [65, 71, 78, 84]


def test_partial_files_say_how_much_is_missing(footage):
    mp4 = probe(footage["truncated_mp4"])
    assert mp4.declared_duration_s == pytest.approx(4.0) and mp4.duration_s < 0.8 * mp4.declared_duration_s
    ts = probe(footage["truncated_ts"])
    assert ts.truncated and ts.declared_duration_s is None and 1.5 < ts.duration_s < 2.5
    assert not probe(footage["joined_ts"]).truncated


def test_partial_means_video_missing_by_what_the_video_stream_declares(footage):
    """The declared span is the video stream's own: the audio's longer span in a complete MKV
    or WebM is not missing video; a cut AVI is judged by its header's frame count (ffprobe's
    duration there is an estimate from what is left); a header's 100 hours over 3 s of
    pictures is a partial file of 3 s, not one too long to take."""
    for name in ("audio_longer_mkv", "audio_first_webm"):
        info = probe(footage[name])
        assert info.declared_duration_s == pytest.approx(3.0, abs=0.05) and not info.truncated, (name, info)
    cut = probe(footage["cut_avi"])
    assert cut.truncated and cut.declared_duration_s == pytest.approx(4.0) and cut.duration_s < 0.7 * 4.0, cut
    big = probe(footage["declares_100h_avi"])
    assert big.truncated and big.declared_duration_s == DECLARED_HOURS * 3600 and big.duration_s == 3.0, big


def test_a_long_recording_is_sought_not_decoded_through(footage, monkeypatch):
    """16 picks from 20 minutes (1,200 frames, a keyframe every 10): each pass reads from a
    keyframe's byte offset a bounded span, and all passes together decode a small part."""
    info, table = probe_with_table(footage["long_ts"])
    passes: list[tuple[list[str], int]] = []
    real = decoders._ffmpeg_run

    def counted(inputs, want, *args, **kw):
        run = real(inputs, want, *args, **kw)
        passes.append((inputs, len(run.decoded)))
        return run

    monkeypatch.setattr(decoders, "_ffmpeg_run", counted)
    picks = sorted({int(t) for t in plan_timestamps(info, SamplingPolicy(mode="uniform", num_frames=16))})
    notes: list[str] = []
    got = decoders.decode_ffmpeg(footage["long_ts"], table, picks, (64, 32), 1, lambda k, a: None,
                                 container=info.container, notes=notes)
    assert got == [table.pts[i] for i in picks] and notes == []
    assert all(inp[inp.index("-i") + 1].startswith("subfile,,start,") for inp, _ in passes)
    decoded = sum(n for _, n in passes)
    # each pass: from one keyframe before its own to the pick, at most two intervals of 10
    assert decoded <= len(picks) * 21 and decoded < 0.25 * len(table.pts), decoded


def test_muxer_timestamp_warnings_are_not_damage():
    log = "\n".join([
        "Stream mapping:",
        "[Parsed_showinfo_0 @ 0x1] n:   0 pts:100 pts_time:1 iskey:1 type:I",
        "[rawvideo @ 0x55d0] Application provided invalid, non monotonically increasing dts to muxer "
        "in stream 0: 200 >= 100",
        "[Parsed_showinfo_0 @ 0x1] n:   1 pts:40 pts_time:0.4 iskey:0 type:P",
        "[h264 @ 0x77] error while decoding MB 3 4",
        "[Parsed_showinfo_0 @ 0x1] n:   2 pts:80 pts_time:0.8 iskey:0 type:P",
    ])
    _, dirty, decoded = decoders._read_showinfo(log)
    assert decoded == [(100, True), (40, False), (80, False)]
    assert 40 not in dirty and dirty.get(80)


def test_a_windowed_policy_replaces_a_damaged_pick_only_inside_its_window():
    from fractions import Fraction

    from vidlora.media.ffprobe import FrameTable

    table = FrameTable(tuple(range(0, 100, 4)), (True,) + (False,) * 24, Fraction(1, 100), 4)
    # pick 12 was damaged and replaced by frame 9; the window starts at frame 10 (floor 9)
    assert _delivered([table.pts[9]], [12], table, (12,), floor=-1) == [9]
    assert _delivered([table.pts[9]], [12], table, (12,), floor=9) is None
    assert _delivered([table.pts[11]], [12], table, (12,), floor=9) == [11]


# -- third round (issue 62): drop-outs, cut open GOPs, files still being written -------------


@pytest.fixture(scope="module")
def round3(corpus_dir):
    return round3_videos(corpus_dir / "footage3")


@pytest.mark.parametrize("frames, pixels", [(8, 192 * 160), (16, 192 * 160), (8, 176 * 144)])
def test_a_drop_out_inside_a_gop_is_never_stored_as_a_picture(round3, frames, pixels, tmp_path):
    """A transport stream that lost packets at 2.8 s, inside a GOP that runs to its end: the
    decoder conceals every picture from there on. Each sample that falls there is the nearest
    clean frame, at its own time, and the frame set says so; every stored picture is the
    undamaged recording's frame at that time (was: the pick at 3.75 s the concealment, or the
    video refused "decoding failed ... Re-encode it")."""
    path = round3["dropout_ts"]
    info = probe(path)
    res = sample_video(path, SamplingPolicy(mode="uniform", num_frames=frames, max_pixels=pixels), tmp_path / "f",
                       info=info)
    assert len(res.timestamps) == frames and res.timestamps == sorted(res.timestamps)
    assert max(res.timestamps) < DROPOUT_AT_S, res.timestamps
    assert res.note and "damaged at 2.7" in res.note and "replaced by the nearest clean frame" in res.note, res.note
    # The clean recording the drop-out came from, decoded from the start: the same frames.
    matches_reference(res, tmp_path, reference_frames(round3["dropout_src_ts"], (res.width, res.height), False))


def test_a_window_inside_a_drop_out_is_refused_saying_where_the_file_is_damaged(round3, tmp_path):
    path = round3["dropout_ts"]
    with pytest.raises(BadVideo) as exc:
        sample_video(path, SamplingPolicy(mode="uniform", num_frames=4, start_s=3.0, end_s=3.9,
                                          max_pixels=192 * 160), tmp_path / "f")
    # says where the file is damaged (was: "... decode only with errors ... (at 3.12 s)", no stretch)
    assert exc.value.reason == ("damaged video: 4 of 4 sampled frames fall where the file is damaged "
                                "(2.8-3.96 s) and have no clean frame nearby. Upload an undamaged copy."), exc.value.reason


@pytest.mark.parametrize("name", ["open_gop_cut_mp4", "open_gop_cut_mkv", "open_gop_cut_ts", "open_gop_cut_avchd"])
def test_an_open_gop_recording_cut_with_stream_copy_is_read_from_its_start(round3, name, tmp_path):
    """The cut file starts at an I-frame whose leading pictures went with the GOP before it;
    the decoder says so once ("mmco: unref short failure") and shows every frame whole, as
    ffmpeg does. Was: "damaged video: 3 of 8 sampled frames decode only with errors". A
    transport stream keeps those leading pictures' packets (no edit list hides them): they are
    no frames of the video (was: counted, every time one frame late on the interlaced cut)."""
    path = round3[name]
    info = probe(path)
    assert info.frame_count == 75 and not info.truncated, info
    for frames in (8, 16):
        res = sample_video(path, SamplingPolicy(mode="uniform", num_frames=frames, max_pixels=POLICY.max_pixels),
                           tmp_path / str(frames) / "f", info=info)
        assert res.note is None and len(res.timestamps) == frames
        ref = reference_frames(path, (res.width, res.height), info.interlaced)
        step = 2 if info.interlaced else 1  # a woven frame shows its first field's source frame
        matches_reference(res, tmp_path / str(frames), ref, first_code=OPEN_GOP_CUT_FRAMES * step, step=step)


def test_audio_five_seconds_ahead_of_the_video_is_not_a_partial_file(round3, tmp_path):
    info = probe(round3["audio_5s_first_mkv"])
    assert not info.truncated and info.declared_duration_s == pytest.approx(3.0, abs=0.05), info
    res = sample_video(round3["audio_5s_first_mkv"], POLICY, tmp_path / "f", info=info)
    matches_reference(res, tmp_path, reference_frames(round3["audio_5s_first_mkv"], (res.width, res.height), False))


@pytest.mark.parametrize("name", ["live_mkv", "live_fmp4", "live_ts"])
def test_a_copy_of_a_recording_still_being_written_is_a_partial_file(round3, name, tmp_path):
    """A snapshot of a recording in progress (45 % of it, cut where a write buffer ends):
    flagged partial, declaring nothing it does not hold, and what it holds is sampled right.
    Was: the MKV and fragmented MP4 analysed as complete recordings."""
    src = round3[name]
    path = snapshot(src, tmp_path / f"part{src.suffix}", 0.45)
    info = probe(path)
    assert info.truncated and info.declared_duration_s is None and 1.0 < info.duration_s < 2.2, info
    res = sample_video(path, POLICY, tmp_path / "f", info=info)
    matches_reference(res, tmp_path, reference_frames(path, (res.width, res.height), False))
    assert not probe(src).truncated  # the finished recording is whole


def test_a_plain_mp4_still_being_written_is_refused_saying_so(round3, tmp_path):
    whole = round3["open_gop_cut_mp4"]  # index at the end, as a recorder writes it
    path = snapshot(whole, tmp_path / "part.mp4", 0.5)
    with pytest.raises(BadVideo) as exc:
        probe(path)
    assert "still being written" in exc.value.reason, exc.value.reason
