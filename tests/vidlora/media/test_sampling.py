"""Pure planning: policies, keys, timestamps, target sizes (no decoding)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from vidlora.media.probe import BadVideo, ProbeInfo
from vidlora.media.sampling import SamplingPolicy, plan_timestamps, target_size


def info(duration: float = 10.0, fps: float = 30.0, frames: int | None = None) -> ProbeInfo:
    return ProbeInfo(container="mp4", codec="h264", width=640, height=360, rotation=0, fps=fps,
                     duration_s=duration, frame_count=frames if frames is not None else round(duration * fps),
                     bit_rate=None)


@pytest.mark.parametrize("w,h", [(1920, 1080), (1080, 1920), (333, 199), (32, 32), (1, 1), (20000, 20),
                                 (20, 20000), (7680, 4320), (640, 360), (100, 3000), (4096, 33)])
@pytest.mark.parametrize("max_px,min_px", [(448 * 448, 64 * 64), (32 * 32, 32 * 32), (1280 * 720, 256 * 256),
                                           (200_000, 1)])
def test_target_size_multiple_of_32_within_budget_and_keeps_aspect(w, h, max_px, min_px):
    tw, th = target_size(w, h, max_px, min_px)
    assert tw % 32 == 0 and th % 32 == 0 and tw >= 32 and th >= 32
    assert tw * th <= max_px
    if 1 / 8 <= w / h <= 8 and max_px >= 64 * 64 * 4:  # not pinned at 32: aspect within rounding
        assert abs((tw / th) / (w / h) - 1) < 0.2
    if (tw, th) == (32, 32) or tw * th >= min_px:
        pass
    else:  # only elongated shapes may miss min_pixels, and only because max_pixels wins
        assert max(tw, th) / min(tw, th) > 4


def test_target_size_keeps_the_aspect_within_one_grid_step_and_the_budget():
    """Property check over many shapes and budgets: multiples of 32, within the budget, the
    aspect off by less than one 32-px step on one side (unless a side is pinned at 32 by the
    budget), and at or above min_pixels whenever a size that keeps the aspect reaches it."""
    import random

    rng = random.Random(13)
    for _ in range(3000):
        w, h = rng.randint(16, 4000), rng.randint(16, 4000)
        max_px = rng.choice([32 * 32 * 4, 50176, 200_704, 921_600]) + rng.randint(0, 5000)
        min_px = rng.randint(1, max_px)
        tw, th = target_size(w, h, max_px, min_px)
        assert tw % 32 == 0 and th % 32 == 0 and tw * th <= max_px, (w, h, max_px, min_px, tw, th)
        # min_pixels is missed only where no size within one step of the aspect reaches it
        bigger = [(x, y) for y in range(32, max_px // 32 + 1, 32) for x in (y * w / h // 32 * 32, -(-y * w / h // 32) * 32)
                  if x >= 32 and abs(x - y * w / h) < 32 and min_px <= x * y <= max_px]
        assert tw * th >= min_px or not bigger, (w, h, max_px, min_px, tw, th, bigger[:3])
        if min(tw, th) > 32:  # one side is the grid width nearest the other side times the aspect
            assert abs(tw - th * w / h) < 32 or abs(th - tw * h / w) < 32, (w, h, max_px, min_px, tw, th)


def test_target_size_fixes_the_field_cases():
    assert target_size(720, 528, 50176, 4096) == (256, 192)  # was 256x160: 17% squashed
    assert target_size(176, 144, 50176, 4096) == (192, 160)  # was 192x128: 23% off


def test_target_size_examples():
    assert target_size(1920, 1080, 448 * 448, 64 * 64) == (576, 320)
    assert target_size(1080, 1920, 448 * 448, 64 * 64) == (320, 576)  # portrait stays portrait
    assert target_size(320, 240, 448 * 448, 64 * 64) == (352, 256)  # 1.375 for 1.333 (320x256: 1.25)
    assert target_size(40, 30, 448 * 448, 256 * 256) == (320, 224)  # upscaled to min_pixels
    with pytest.raises(ValueError):
        target_size(100, 100, 100, 1)


def test_uniform_plan_is_segment_centres_within_window():
    ts = plan_timestamps(info(10), SamplingPolicy(mode="uniform", num_frames=4))
    assert ts == [1.25, 3.75, 6.25, 8.75]
    ts = plan_timestamps(info(10), SamplingPolicy(mode="uniform", num_frames=4, start_s=2, end_s=6))
    assert ts == [2.5, 3.5, 4.5, 5.5]


def test_fps_plan_clamps_to_min_and_max_frames():
    p = SamplingPolicy(mode="fps", fps=2.0, min_frames=4, max_frames=32)
    ts = plan_timestamps(info(10), p)
    assert len(ts) == 20 and ts[0] == 0.25 and ts[1] == 0.75  # middle of each 1/fps window
    assert len(plan_timestamps(info(1), p)) == 4
    assert len(plan_timestamps(info(100), p)) == 32
    assert len(plan_timestamps(info(10), dataclasses.replace(p, end_s=3.0))) == 6


def test_plan_never_asks_for_more_frames_than_exist():
    ts = plan_timestamps(info(1.0, fps=5), SamplingPolicy(mode="uniform", num_frames=16))
    assert len(ts) == 5
    assert len(plan_timestamps(info(0.04, fps=25, frames=1), SamplingPolicy(mode="uniform"))) == 1


def test_window_after_the_end_is_a_bad_video():
    with pytest.raises(BadVideo, match="after the video ends"):
        plan_timestamps(info(5), SamplingPolicy(mode="uniform", start_s=6))


def test_end_beyond_duration_is_clamped():
    ts = plan_timestamps(info(4), SamplingPolicy(mode="uniform", num_frames=2, end_s=100))
    assert ts == [1.0, 3.0]


def test_from_dict_validates_with_clear_errors():
    assert SamplingPolicy.from_dict({"mode": "fps", "fps": 1, "start_s": 0}).fps == 1.0
    bad = [
        ({"mode": "sometimes"}, "mode"),
        ({}, "mode"),
        ({"mode": "uniform", "frames": 3}, "unknown sampling keys"),
        ({"mode": "uniform", "num_frames": 0}, "num_frames"),
        ({"mode": "uniform", "num_frames": "8"}, "integer"),
        ({"mode": "uniform", "num_frames": True}, "integer"),
        ({"mode": "fps", "fps": 0}, "fps"),
        ({"mode": "fps", "fps": float("nan")}, "fps"),
        ({"mode": "fps", "min_frames": 9, "max_frames": 8}, "min_frames"),
        ({"mode": "uniform", "start_s": 5, "end_s": 5}, "end_s"),
        ({"mode": "uniform", "start_s": -1}, "start_s"),
        ({"mode": "uniform", "max_pixels": 500}, "max_pixels"),
        ({"mode": "uniform", "min_pixels": 10**9}, "min_pixels"),
    ]
    for d, words in bad:
        with pytest.raises(ValueError, match=words):
            SamplingPolicy.from_dict(d)
    with pytest.raises(ValueError):
        SamplingPolicy.from_dict(["uniform"])


def test_key_is_canonical_and_only_depends_on_what_matters():
    a = SamplingPolicy.from_dict({"mode": "uniform", "num_frames": 8, "fps": 3})
    b = SamplingPolicy.from_dict({"mode": "uniform", "num_frames": 8, "start_s": 0.0})
    assert a.key() == b.key() == "v3;mode=uniform;n=8;start=0;end=;px=4096-200704;deint=auto"
    c = SamplingPolicy.from_dict({"mode": "fps", "fps": 2})
    d = SamplingPolicy.from_dict({"mode": "fps", "fps": 2.0, "num_frames": 99})
    assert c.key() == d.key() == "v3;mode=fps;fps=2;min=4;max=32;start=0;end=;px=4096-200704;deint=auto"
    variants = [SamplingPolicy(mode="fps", fps=f, max_frames=m, end_s=e)
                for f, m, e in itertools.product([1.0, 2.5], [8, 16], [None, 3.0])]
    assert len({v.key() for v in variants}) == len(variants)
    assert len(a.key_hash()) == 16 and a.key_hash() == b.key_hash()
    assert SamplingPolicy.from_dict(a.as_dict()) == a


def test_a_policy_describes_only_what_its_mode_uses():
    assert SamplingPolicy(mode="uniform", num_frames=1, max_pixels=4096).describe() == \
        "1 frame spread evenly over the video, at most 4,096 pixels each"
    assert SamplingPolicy(mode="fps", fps=0.5, min_frames=2, max_frames=6, start_s=3, max_pixels=4096).describe() == \
        "0.5 frames a second, 2 to 6 frames, from 3 s to the end, at most 4,096 pixels each"
