"""Reasons a video is refused: one vocabulary (vidlora/media/reasons.py), each a sentence that
says what is wrong and what to do, the same on every run, never a decoder's log line."""

from __future__ import annotations

import os
import re

import pytest

from tests.support.corpus import damaged_videos, footage_videos
from vidlora.media import reasons
from vidlora.media.frames import sample_video
from vidlora.media.probe import BadVideo, probe
from vidlora.media.sampling import SamplingPolicy

LOG_LINE = re.compile(r"@ 0x|mmco|NAL|Last message repeated|\(\w+: ")
ACTIONS = ("Upload", "Re-encode", "Convert", "Try again", "Scale", "Cut", "Change")


def sentences_ok(reason: str) -> bool:
    return (len(reason) < 160 and "\n" not in reason and reason.endswith(".") and not LOG_LINE.search(reason)
            and any(verb in reason for verb in ACTIONS))


def test_every_fixed_reason_is_an_actionable_sentence():
    fixed = [v for k, v in vars(reasons).items() if k.isupper() and isinstance(v, str) and k not in ("REUPLOAD", "REENCODE")]
    made = [reasons.image("webp"), reasons.unsupported_fourcc("VLRX"), reasons.undecodable("av1"),
            reasons.declared_but_unreadable(150, 5.0), reasons.too_large(9000, 9000, 8192 * 8192),
            reasons.absurd_aspect(20000, 20, 200), reasons.too_long(30000, 21600),
            reasons.damaged(3, 8, [1.2, 2.4, 3.6]), reasons.window_after_end(6, 5),
            reasons.damaged_stretch(8, 8, [1.2, 1.6, 3.0, 7.5, 9.0, 12.25]),
            reasons.damaged_in_places([1.2, 1.6, 3.0, 7.5, 9.0, 12.25])]
    assert len(fixed) >= 15
    for reason in fixed + made:
        assert sentences_ok(reason), reason


def test_each_bad_file_gets_a_sentence_and_the_same_one_twice(bad):
    for name, (path, _) in bad.items():
        said = []
        for _ in range(2):
            with pytest.raises(BadVideo) as exc:
                probe(path)
            said.append(exc.value.reason)
        assert said[0] == said[1] and sentences_ok(said[0]), (name, said)


def test_an_mp4_whose_header_promises_frames_it_does_not_hold_says_so(corpus_dir, tmp_path):
    full = footage_videos(corpus_dir / "footage")["truncated_mp4"]
    data = full.read_bytes()
    cut = tmp_path / "card.mp4"
    cut.write_bytes(data[: data.index(b"mdat") + 64])  # the index survives, the pictures do not
    with pytest.raises(BadVideo) as exc:
        probe(cut)
    assert exc.value.reason.startswith("truncated or damaged video: the header declares 100 frames"), exc.value.reason


def test_a_garbage_header_is_not_called_zero_duration(tmp_path):
    junk = tmp_path / "clip.mkv"
    junk.write_bytes(b"\x1a\x45\xdf\xa3" + os.urandom(3000))  # Matroska magic, then noise
    with pytest.raises(BadVideo) as exc:
        probe(junk)
    assert "zero duration" not in exc.value.reason and sentences_ok(exc.value.reason), exc.value.reason


def test_the_damage_count_is_the_same_on_every_run(corpus_dir, tmp_path):
    _, bad = damaged_videos(corpus_dir / "damaged")["mpeg4_avi"]
    policy = SamplingPolicy(mode="uniform", num_frames=8, max_pixels=64 * 64 * 12)
    said = []
    for k in range(2):
        try:
            sample_video(bad, policy, tmp_path / f"r{k}" / "f")
            said.append("accepted")
        except BadVideo as exc:
            said.append(exc.reason)
    assert said[0] == said[1], said
    assert said[0] == "accepted" or (said[0].startswith("damaged video: ") and sentences_ok(said[0])), said



def test_an_h264_file_is_never_told_to_become_h264(good, tmp_path):
    """An H.264 MP4 whose pictures are gone (its media data zeroed, its index intact) is called
    damaged, not "unsupported codec ... re-encode it to H.264"; the same holds for the
    sampling failure's sentence."""
    data = bytearray(good["h264_mp4"].read_bytes())
    start, end = data.index(b"mdat") + 4, data.index(b"moov") - 4
    assert start < end  # ffmpeg writes the index after the media data
    data[start:end] = bytes(end - start)
    blank = tmp_path / "blank.mp4"
    blank.write_bytes(bytes(data))
    with pytest.raises(BadVideo) as exc:
        probe(blank)
    said = exc.value.reason
    assert said.startswith("undecodable video (h264): ") and "H.264" not in said and sentences_ok(said), said
    assert "H.264" not in reasons.decoding_failed("h264") and sentences_ok(reasons.decoding_failed("h264"))
    assert reasons.undecodable("vlrx").startswith("unsupported codec or undecodable video (vlrx)")
