"""sample_video end to end: real decodes of the corpus, checked against an independent reference.

Every coded corpus video shows its source frame number in a strip (tests/support/corpus.py), so these
tests check the *content* of each JPEG, not only the timestamp a backend claims.
"""

from __future__ import annotations

import bisect
import re
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.support import fake_decoders
from tests.support.corpus import VFR_SOURCE_FPS, coded_videos, read_frame_code
from tests.support.processes import running
from vidlora.config import Settings
from vidlora.media import decode_server
from vidlora.media import frames as frames_mod
from vidlora.media.decoders import default_backends
from vidlora.media.frames import sample_video
from vidlora.media.probe import BadVideo, probe
from vidlora.media.sampling import SamplingPolicy, plan_timestamps

from .conftest import decoded_frame_times

UNIFORM8 = SamplingPolicy(mode="uniform", num_frames=8)


def check(path: Path, policy: SamplingPolicy, out_dir: Path, backends=None, name: str = ""):
    """Sample, then verify timestamps, frame content, sizes and files."""
    info = probe(path)
    res = sample_video(path, policy, out_dir, info=info, backends=backends)
    ref = decoded_frame_times(path)
    targets = plan_timestamps(info, policy)
    # the frame at or before each target, from the decoded (not demuxed) reference
    want = [ref[max(0, bisect.bisect_right(ref, t + 1e-9) - 1)] for t in targets]
    assert res.timestamps == pytest.approx(want, abs=1e-6)
    assert len(res.files) == len(res.timestamps) == len(targets)
    assert res.width % 32 == 0 and res.height % 32 == 0 and res.width * res.height <= policy.max_pixels
    paths = res.paths(out_dir.parent)
    assert [p.name for p in paths] == [f"{i:05d}.jpg" for i in range(len(paths))]
    for p in paths:
        with Image.open(p) as img:
            assert img.format == "JPEG" and img.size == (res.width, res.height)
    if name in coded_videos():
        fps = VFR_SOURCE_FPS if name == "vfr_mp4" else info.fps
        codes = [read_frame_code(p, info.rotation) for p in paths]
        assert codes == [round(t * fps) for t in res.timestamps], (name, res.backend)
    return res


def test_every_good_video_with_default_backends(good, tmp_path):
    for name, path in good.items():
        res = check(path, UNIFORM8, tmp_path / name / "frames", name=name)
        assert res.backend == default_backends(probe(path))[0], name


@pytest.mark.parametrize("backend", ["decord", "pyav", "ffmpeg"])
def test_each_backend_is_exact_on_h264_and_vfr(good, tmp_path, backend):
    for name in ("h264_mp4", "vfr_mp4", "portrait_mp4"):
        res = check(good[name], SamplingPolicy(mode="fps", fps=4, max_frames=12), tmp_path / name / "f",
                    backends=[backend], name=name)
        assert res.backend == backend


@pytest.mark.parametrize("backend", ["pyav", "ffmpeg"])
@pytest.mark.parametrize("name", ["vp9_webm", "av1_mkv"])
def test_vp9_and_av1_with_pyav_and_ffmpeg(good, tmp_path, backend, name):
    if name == "av1_mkv" and name not in good:  # the corpus makes it only where ffmpeg can encode AV1
        pytest.skip("this ffmpeg has no AV1 encoder (libsvtav1 / libaom-av1): no AV1 clip to decode")
    res = check(good[name], UNIFORM8, tmp_path / name / "f", backends=[backend], name=name)
    assert res.backend == backend


def test_vfr_uses_real_pts_not_average_rate(good, tmp_path):
    path = good["vfr_mp4"]
    info = probe(path)
    policy = SamplingPolicy(mode="fps", fps=3, start_s=0.5, end_s=2.5, max_frames=32)
    res = check(path, policy, tmp_path / "vfr" / "f", name="vfr_mp4")
    assert all(0.4 <= t < 2.5 for t in res.timestamps)
    naive = [round(t * info.fps) / info.fps for t in plan_timestamps(info, policy)]  # round(t*avg_fps)
    assert naive != res.timestamps  # the naive rule would have picked other frames here


def test_portrait_comes_out_portrait_like_ffmpeg_autorotate(good, tmp_path):
    path = good["portrait_mp4"]
    res = check(path, UNIFORM8, tmp_path / "p" / "f", name="portrait_mp4")
    assert res.height > res.width
    # reference: ffmpeg's own autorotate of the same frame at the same size
    t = res.timestamps[3]
    ref = tmp_path / "ref.png"
    import subprocess
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-ss", f"{t:.6f}", "-i", str(path), "-frames:v", "1",
                    "-vf", f"scale={res.width}:{res.height}", str(ref)], check=True)
    a = np.asarray(Image.open(res.paths(tmp_path / "p")[3]).convert("L"), dtype=float)
    b = np.asarray(Image.open(ref).convert("L"), dtype=float)
    assert np.abs(a - b).mean() < 6


def test_fallback_on_failure_and_on_exactness_mismatch(good, tmp_path):
    # On MPEG-TS decord fails to open and PyAV cannot seek exactly (a Mismatch): ffmpeg wins.
    res = check(good["h264_ts"], UNIFORM8, tmp_path / "ts" / "f", backends=["decord", "pyav", "ffmpeg"],
                name="h264_ts")
    assert res.backend == "ffmpeg"
    with pytest.raises(BadVideo, match=r"^decoding failed: no decoder could read") as exc:
        sample_video(good["h264_ts"], UNIFORM8, tmp_path / "ts2" / "f", backends=["decord", "pyav"])
    # what each backend said is kept for the log, not shown as the reason
    assert re.search(r"decord: .*; pyav: .*ended before pts", exc.value.detail), exc.value.detail
    assert "pyav" not in exc.value.reason
    assert not list((tmp_path / "ts2").glob("**/*.jpg"))  # no partial output left behind


def test_parent_rejects_a_backend_that_returns_neighbouring_frames(good, tmp_path, monkeypatch):
    monkeypatch.setattr(decode_server, "ENTRY", "tests.support.fake_decoders:neighbouring_frames")
    with pytest.raises(BadVideo, match="^decoding failed: ") as exc:
        sample_video(good["h264_mp4"], UNIFORM8, tmp_path / "x" / "f", backends=["pyav"])
    assert "other timestamps than asked for" in exc.value.detail


def test_hung_decoder_is_killed_with_its_children(good, tmp_path, monkeypatch):
    # Probed before the decoder hangs: the probe's first-picture check runs in the same decode
    # server, and would wait out its own default limit on the hung one.
    info = probe(good["h264_mp4"])
    pidfile = tmp_path / "child.pid"
    monkeypatch.setenv(fake_decoders.PIDFILE_ENV, str(pidfile))
    monkeypatch.setattr(decode_server, "ENTRY", "tests.support.fake_decoders:hang")
    settings = Settings(decode_timeout_s=1.5)
    t0 = time.monotonic()
    with pytest.raises(BadVideo) as exc:
        sample_video(good["h264_mp4"], UNIFORM8, tmp_path / "h" / "f", info=info, settings=settings,
                     backends=["pyav"])
    assert str(exc.value).startswith("decoder timed out: ")
    assert time.monotonic() - t0 < 6
    child = int(pidfile.read_text())
    time.sleep(0.2)
    assert not running(child)  # the grandchild died with its process group
    assert not list((tmp_path / "h").glob("**/*.jpg"))



def test_real_decode_past_a_tiny_timeout_is_killed(good, tmp_path):
    info = probe(good["h264_1080p"])
    # On a loaded machine the frame-table probe inside sampling can hit the tiny limit first;
    # either way the work is killed and the reason says it timed out.
    with pytest.raises(BadVideo, match="^(decoder|probe) timed out: "):
        sample_video(good["h264_1080p"], SamplingPolicy(mode="uniform", num_frames=30), tmp_path / "t" / "f",
                     info=info, settings=Settings(decode_timeout_s=0.3), backends=["ffmpeg", "pyav"])


def test_resampling_replaces_old_frames_and_short_clips_do_not_repeat(good, tmp_path):
    out = tmp_path / "r" / "f"
    sample_video(good["av1_mkv" if "av1_mkv" in good else "h264_mp4"], SamplingPolicy(mode="uniform", num_frames=100), out)
    many = sorted(out.glob("*.jpg"))
    res = sample_video(good["h264_mp4"], SamplingPolicy(mode="uniform", num_frames=3), out)
    assert sorted(p.name for p in out.glob("*.jpg")) == ["00000.jpg", "00001.jpg", "00002.jpg"]
    assert len(many) == probe(good["av1_mkv" if "av1_mkv" in good else "h264_mp4"]).frame_count
    assert res.files == ["f/00000.jpg", "f/00001.jpg", "f/00002.jpg"]


def test_policies_asking_for_the_same_frames_share_one_decode(good, tmp_path, monkeypatch):
    """The shipped scenarios' uniform-8 and fps-2 (max 8) policies pick the same frames of a 20 s
    clip: the second gets copies of the first's JPEGs; a policy with other frames decodes."""
    from vidlora.media.frames import FrameReuse

    decodes = []
    real = frames_mod._run_worker
    monkeypatch.setattr(frames_mod, "_run_worker", lambda job, timeout: decodes.append(job["picks"]) or real(job, timeout))
    path = good["h264_mp4"]
    reuse = FrameReuse()
    d = probe(path).duration_s
    uniform = SamplingPolicy(mode="uniform", num_frames=4)
    same = SamplingPolicy(mode="fps", fps=4 / d, min_frames=4, max_frames=4)
    other = SamplingPolicy(mode="uniform", num_frames=3)
    a = sample_video(path, uniform, tmp_path / "s" / "a", reuse=reuse)
    b = sample_video(path, same, tmp_path / "s" / "b", reuse=reuse)
    c = sample_video(path, other, tmp_path / "s" / "c", reuse=reuse)
    assert len(decodes) == 2 and reuse.hits == 1
    assert b.timestamps == a.timestamps and b.files == [f.replace("a/", "b/") for f in a.files]
    assert [p.read_bytes() for p in b.paths(tmp_path / "s")] == [p.read_bytes() for p in a.paths(tmp_path / "s")]
    assert c.timestamps != a.timestamps and len(c.files) == 3


def test_bad_videos_raise_from_sample_video(bad, good, tmp_path):
    path, reason = bad["truncated_mp4"]
    with pytest.raises(BadVideo, match=reason):
        sample_video(path, UNIFORM8, tmp_path / "b" / "f")
    with pytest.raises(ValueError, match="unknown decoder backend"):
        sample_video(good["h264_mp4"], UNIFORM8, tmp_path / "b" / "f", backends=["opencv"])


def test_ffmpeg_backend_handles_hundreds_of_picks(tmp_path):
    # ffmpeg's expression parser rejects a flat OR of ~100 terms; the backend builds a tree.
    clip = tmp_path / "150.mp4"
    import subprocess
    subprocess.run(["ffmpeg", "-v", "error", "-nostdin", "-f", "lavfi", "-i", "testsrc2=s=96x64:r=30:d=5",
                    "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", str(clip)], check=True)
    res = sample_video(clip, SamplingPolicy(mode="fps", fps=30, max_frames=1000, max_pixels=64 * 96),
                       tmp_path / "o" / "f", backends=["ffmpeg"])
    assert len(res.files) == 150 and res.timestamps == [round(i / 30, 6) for i in range(150)]
