"""probe() on the generated corpus: facts for good files, a clear reason for each bad one."""

from __future__ import annotations

import json
import subprocess

import pytest

from vidlora.config import Settings
from vidlora.media.probe import BadVideo, ProbeInfo, probe

from .conftest import decoded_frame_times


def test_good_videos_are_probed(good):
    expected = {  # name: (container, codec, display w, h, rotation, fps)
        "h264_mp4": ("mp4", "h264", 320, 240, 0, 30),
        "vp9_webm": ("webm", "vp9", 320, 240, 0, 25),
        "mjpeg_avi": ("avi", "mjpeg", 320, 240, 0, 25),
        "h264_ts": ("mpegts", "h264", 320, 240, 0, 25),
        "h264_1080p": ("mp4", "h264", 1920, 1080, 0, 30),
        "portrait_mp4": ("mp4", "h264", 240, 320, 270, 30),
        "vfr_mp4": ("mp4", "h264", 320, 240, 0, 18),
        # stored 333x199 by ffmpeg's scale from 332x198, with SAR 22187:22142 keeping the shape:
        # shown 334 wide (333 * 22187 / 22142 = 333.7)
        "odd_size_mp4": ("mp4", "h264", 334, 199, 0, 24),
        "av1_mkv": ("matroska", "av1", 320, 240, 0, 24),
    }
    for name, path in good.items():
        info = probe(path)
        assert isinstance(info, ProbeInfo)
        assert (info.container, info.codec, info.width, info.height, info.rotation) == expected[name][:5], name
        assert info.fps == pytest.approx(expected[name][5], rel=0.01), name
        # frame_count comes from packets; it must equal what a full decode yields
        times = decoded_frame_times(path)
        assert info.frame_count == len(times), name
        assert info.duration_s == pytest.approx(times[-1] + 1 / 30 if name == "vfr_mp4" else len(times) / info.fps,
                                                abs=0.01), name
        assert info.as_dict()["has_video"] is True
        json.dumps(info.as_dict())


def test_portrait_is_portrait_after_rotation(good):
    info = probe(good["portrait_mp4"])
    assert info.height > info.width
    out = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries",
                          "stream=width,height", "-of", "csv=p=0", str(good["portrait_mp4"])],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out.startswith("320,240")  # stored landscape; only the display matrix makes it portrait


def test_each_bad_video_is_rejected_with_its_reason(bad):
    for name, (path, reason) in bad.items():
        with pytest.raises(BadVideo) as exc:
            probe(path)
        assert reason in str(exc.value), (name, str(exc.value))
        assert exc.value.reason == str(exc.value)
        assert len(exc.value.reason) < 160 and "\n" not in exc.value.reason


def test_limits_come_from_settings(good):
    with pytest.raises(BadVideo, match="too long"):
        probe(good["h264_mp4"], Settings(max_duration_s=1.0))
    with pytest.raises(BadVideo, match="resolution too large"):
        probe(good["h264_1080p"], Settings(max_video_pixels=1280 * 720))


def test_missing_file(tmp_path):
    with pytest.raises(BadVideo, match="file not found"):
        probe(tmp_path / "nope.mp4")


def test_the_probe_decides_every_corpus_video_as_its_separate_tool_runs_did(good, bad, corpus_dir, monkeypatch):
    """Two savings in the probe, proven together on every video of every corpus (good, bad,
    footage, fidelity, damaged): the header and the packets come from one ffprobe (one process
    start instead of two), and the first picture is decoded in a warm decode server's worker
    instead of a fresh ffmpeg (about 0.2 of a 1080p clip's 0.5 CPU-s together). Each video gets
    the same facts and frame table, or the same reason, as with the separate ffprobe reads and
    ffmpeg's decode check: what the probe falls back to, and what it ran before."""
    import importlib

    from tests.support.corpus import damaged_videos, fidelity_videos, footage_videos
    from vidlora.media import ffprobe
    from vidlora.media.probe import probe_with_table

    videos = {**good, **{f"bad/{n}": p for n, (p, _) in bad.items()},
              **{f"footage/{n}": p for n, p in footage_videos(corpus_dir / "footage").items()},
              **{f"fidelity/{n}": p for n, p in fidelity_videos(corpus_dir / "fidelity").items()},
              **{f"damaged/{n}/{k}": p for n, pair in damaged_videos(corpus_dir / "damaged").items()
                 for k, p in zip(("clean", "damaged"), pair)}}

    def outcome(path):
        try:
            return probe_with_table(path)
        except BadVideo as exc:
            return exc.reason

    merged = {name: outcome(path) for name, path in videos.items()}
    forced = []

    def one_read_fails(args, timeout, take):
        assert any(a.startswith("packet=stream_index") for a in args)
        forced.append(args[-1])
        raise ffprobe.ProbeError("forced: read the header and the packets apart")

    in_server = []

    def no_server(path, timeout):
        in_server.append(path)
        return False

    monkeypatch.setattr(ffprobe, "stream_tool", one_read_fails)
    monkeypatch.setattr(importlib.import_module("vidlora.media.probe"), "_first_picture_in_server", no_server)
    apart = {name: outcome(path) for name, path in videos.items()}
    assert len(forced) >= 35 and len(in_server) >= 30 and sum(isinstance(o, tuple) for o in merged.values()) >= 30
    monkeypatch.undo()
    for name in videos:
        assert merged[name] == apart[name], name
