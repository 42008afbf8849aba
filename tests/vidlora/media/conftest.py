"""Fixtures for the media tests: the generated corpus (cached) and an ffprobe reference."""

from __future__ import annotations

import json
import subprocess
from fractions import Fraction
from pathlib import Path

import pytest

from tests.support.corpus import bad_videos, good_videos


@pytest.fixture(scope="session")
def good(corpus_dir: Path) -> dict[str, Path]:
    return good_videos(corpus_dir / "good")


@pytest.fixture(scope="session")
def bad(corpus_dir: Path) -> dict[str, tuple[Path, str]]:
    return bad_videos(corpus_dir / "bad")


def decoded_frame_times(path: Path) -> list[float]:
    """Independent reference: pts of every *decoded* frame (ffprobe -show_frames), seconds since
    the first one. The code under test reads packets instead, so this checks it too."""
    out = json.loads(subprocess.run(
        ["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries",
         "stream=time_base:frame=best_effort_timestamp", "-of", "json", str(path)],
        capture_output=True, text=True, check=True).stdout)
    tb = Fraction(out["streams"][0]["time_base"])
    pts = sorted(f["best_effort_timestamp"] for f in out["frames"])
    return [float((p - pts[0]) * tb) for p in pts]
