"""Frames the model sees are the frames the video shows (issue 13), on the shapes real files
have: a first packet an edit list discards, non-square pixels, raw elementary streams with no
timestamps, a program stream cut mid-GOP. Each is accepted, and every stored JPEG is checked
by its *content* (the frame-code strip) against the frame at its stated timestamp, and by its
shape against the shown picture."""
from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.support.corpus import DAMAGE_CODECS, damaged_videos, fidelity_videos, read_frame_code
from vidlora.media.ffprobe import _table
from vidlora.media.frames import sample_video
from vidlora.media.probe import BadVideo, plain_words, probe
from vidlora.media.sampling import SamplingPolicy

POLICY = SamplingPolicy(mode="uniform", num_frames=6, max_pixels=64 * 64 * 12)
FPS = 25
SOURCE_FRAMES = 3 * FPS
SHOWN_FROM = 13  # edit_list_mp4 is cut at 0.5 s: frame 13 (0.52 s) is the first it shows


@pytest.fixture(scope="module")
def corpus(corpus_dir):
    return fidelity_videos(corpus_dir / "fidelity")


@pytest.mark.parametrize("name", ["edit_list_mp4", "sar_mp4", "mpeg2_es_mpv", "h264_es", "ps_cut_mpg"])
def test_accepted_and_every_frame_is_the_one_at_its_timestamp(corpus, name, tmp_path):
    path = corpus[name]
    info = probe(path)
    res = sample_video(path, POLICY, tmp_path / "f", info=info)
    assert len(res.files) == len(res.timestamps) == POLICY.num_frames
    codes = [read_frame_code(tmp_path / "f" / Path(f).name) for f in res.files]
    if name == "ps_cut_mpg":  # the first third is gone: codes continue from where the cut landed
        first = codes[0] - round(res.timestamps[0] * FPS)
        assert first > 0
    elif name == "edit_list_mp4":  # shown from the first source frame at or after 0.5 s
        first = SHOWN_FROM
    else:
        first = 0
    assert codes == [first + round(t * FPS) for t in res.timestamps], (name, res.backend, res.timestamps)


def test_the_edit_list_file_keeps_every_shown_frame(corpus):
    info = probe(corpus["edit_list_mp4"])
    assert info.frame_count == SOURCE_FRAMES - SHOWN_FROM  # was: rejected, "no frame decodes"


def test_raw_elementary_streams_keep_their_first_and_last_frame(corpus):
    for name in ("mpeg2_es_mpv", "h264_es"):
        info = probe(corpus[name])
        assert info.frame_count == SOURCE_FRAMES, name  # the timestamp-less fallback dropped one
        assert info.duration_s == pytest.approx(SOURCE_FRAMES / FPS, abs=1e-6), name


def test_non_square_pixels_are_shown_at_their_display_shape(corpus, tmp_path):
    info = probe(corpus["sar_mp4"])
    assert (info.width, info.height) == (193, 144)  # 176 * 128 / 117 (H.264 stores it as 93:85)
    assert float(Fraction(info.sample_aspect.replace(":", "/"))) == pytest.approx(128 / 117, rel=1e-3)
    res = sample_video(corpus["sar_mp4"], POLICY, tmp_path / "f", info=info)
    w, h = Image.open(tmp_path / "f" / Path(res.files[0]).name).size
    assert (w, h) == (res.width, res.height)
    # the shown aspect (1.34), not the stored one (1.22), within one 32-px grid step
    assert abs(w - h * 193 / 144) < 32 and abs(w / h - 193 / 144) < abs(w / h - 176 / 144)


def test_sampling_the_same_file_twice_gives_the_same_bytes(corpus, tmp_path):
    runs = [sample_video(corpus["edit_list_mp4"], POLICY, tmp_path / f"run{k}" / "f") for k in range(2)]
    a = [(tmp_path / "run0" / "f" / Path(f).name).read_bytes() for f in runs[0].files]
    b = [(tmp_path / "run1" / "f" / Path(f).name).read_bytes() for f in runs[1].files]
    assert a == b and runs[0].timestamps == runs[1].timestamps


def test_a_last_packet_with_an_odd_duration_does_not_shorten_the_video():
    tb = Fraction(1, 30000)
    rows = [(i * 1001, i == 0, 1001) for i in range(9)] + [(9 * 1001, False, 1)]
    assert _table(rows, tb, 1001).duration_s == pytest.approx(10 * 1001 / 30000)
    rows[-1] = (9 * 1001, False, 0)
    assert _table(rows, tb, 0).duration_s == pytest.approx(10 * 1001 / 30000)


def test_a_variable_rate_video_ending_on_a_slow_stretch_keeps_its_last_frame_whole():
    """10 frames 1/30 s apart, then 5 frames 1/6 s apart, the last with no duration: the last
    frame lasts like its neighbours (1/6 s), not the median spacing (1/30 s)."""
    tb = Fraction(1, 30000)
    rows = [(i * 1000, i == 0, 1000) for i in range(10)] + [(10000 + k * 5000, False, 5000) for k in range(5)]
    rows[-1] = (rows[-1][0], False, None)
    assert _table(rows, tb, 1000).duration_s == pytest.approx((30000 + 5000) / 30000)


def test_reasons_name_the_problem_not_a_server_path(tmp_path):
    where = tmp_path / "srv" / "media" / "videos" / "ab"
    where.mkdir(parents=True)
    junk = where / "abcdef.mp4"
    junk.write_bytes(bytes(np.random.default_rng(1).integers(0, 256, 5000, dtype=np.uint8)))
    with pytest.raises(BadVideo) as exc:
        probe(junk)
    assert str(tmp_path) not in exc.value.reason and "abcdef" not in exc.value.reason
    said = plain_words(f"{junk}: Device or resource busy while reading a very long header " * 4, junk)
    assert str(junk) not in said and said.endswith("...") and len(said) <= 123
    assert said[:-3].split()[-1] in ("a", "very", "long", "header", "busy", "while", "reading", "resource", "or")


@pytest.fixture(scope="module")
def damaged(corpus_dir):
    return damaged_videos(corpus_dir / "damaged")


def _psnr(a: Path, b: Path) -> float:
    x = np.asarray(Image.open(a).convert("RGB"), dtype=np.float64)
    y = np.asarray(Image.open(b).convert("RGB"), dtype=np.float64)
    mse = float(((x - y) ** 2).mean())
    return 99.0 if mse == 0 else 10 * np.log10(255 ** 2 / mse)


@pytest.mark.parametrize("name", sorted(DAMAGE_CODECS))
def test_a_damaged_stream_is_rejected_or_shows_only_clean_frames(damaged, name, tmp_path):
    """Bit flips in each codec: the video is rejected as damaged with a reason, or every stored
    frame is a clean picture of the right frame: the same as the undamaged original's frame at
    that timestamp (PSNR against it), never a smear stored as a normal sample."""
    clean, bad = damaged[name]
    policy = SamplingPolicy(mode="uniform", num_frames=8, max_pixels=64 * 64 * 12)
    try:
        info = probe(bad)
        res = sample_video(bad, policy, tmp_path / "bad" / "f", info=info)
    except BadVideo as exc:
        assert re.match(r"damaged video: \d+ of 8 sampled frames (decode only with errors|fall where the file "
                        r"is damaged)", exc.reason), exc.reason
        assert str(bad.parent) not in exc.reason
        return
    ref_info = probe(clean)
    for k, (t, f) in enumerate(zip(res.timestamps, res.files)):
        one = SamplingPolicy(mode="uniform", num_frames=1, max_pixels=policy.max_pixels, start_s=t,
                             end_s=min(ref_info.duration_s, t + 1 / FPS))
        ref = sample_video(clean, one, tmp_path / f"ref{k}" / "f", info=ref_info)
        assert ref.timestamps == [t], (name, t, ref.timestamps)
        got = tmp_path / "bad" / "f" / Path(f).name
        assert read_frame_code(got) == round(t * FPS), (name, t)
        assert _psnr(got, tmp_path / f"ref{k}" / "f" / Path(ref.files[0]).name) > 30, (name, t, res.backend)
