"""Fixtures for ingest tests: a store under tmp_path and low-limit Settings."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from vidlora.config import Settings
from vidlora.ingest.store import MediaStore


@pytest.fixture
def make_settings(tmp_path: Path) -> Callable[..., Settings]:
    def make(**overrides: object) -> Settings:
        values: dict[str, object] = dict(
            var_dir=tmp_path / "var",
            max_video_bytes=8 * 1024 * 1024,
            archive_max_members=100,
            archive_max_total_bytes=64 * 1024 * 1024,
            archive_max_ratio=50.0,
        )
        values.update(overrides)
        return Settings(**values)  # type: ignore[arg-type]

    return make


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings()


@pytest.fixture
def store(tmp_path: Path) -> MediaStore:
    return MediaStore(tmp_path / "media")


@pytest.fixture
def indir(tmp_path: Path) -> Path:
    d = tmp_path / "in"
    d.mkdir()
    return d
