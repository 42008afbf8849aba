"""vidlora.ingest.kinds: one classification by name for every way in, one reason for
"neither", in words (no server path)."""
from __future__ import annotations

import pytest

from vidlora.config import Settings
from vidlora.ingest.kinds import Kind, accepted_suffixes, kind_of, not_video_reason

EXTS = Settings().video_extensions


@pytest.mark.parametrize("name,kind", [
    ("clip.mp4", Kind.VIDEO), ("CLIP.MKV", Kind.VIDEO), ("dig/2026/tomb.mov", Kind.VIDEO),
    (r"C:\Users\a\mural.webm", Kind.VIDEO), ("finds.zip", Kind.ARCHIVE), ("finds.TAR.GZ", Kind.ARCHIVE),
    ("notes.txt", Kind.OTHER), ("README", Kind.OTHER), ("a.zip.mp4", Kind.VIDEO), ("a.gz", Kind.OTHER),
])
def test_kind_by_name(name, kind):
    assert kind_of(name, EXTS) == kind


def test_the_reason_names_the_type_not_the_path():
    assert not_video_reason("/srv/media/uploads/x/notes.TXT") == (
        "not_video: a .txt file is not a video or an archive of videos")
    assert not_video_reason("README") == "not_video: a file without an extension is not a video or an archive of videos"


def test_what_a_picker_offers_is_what_is_accepted():
    offered = accepted_suffixes(EXTS)
    assert all(kind_of(f"x{s}", EXTS) != Kind.OTHER for s in offered)


@pytest.mark.parametrize("name", [".mp4", "   .mp4", "..mp4", "dig/.mp4", " .tar.gz", "\t.zip"])
def test_a_name_with_nothing_before_its_extension_is_not_a_video(name):
    """Issue 32: the page accepted these, the server refused the whole upload, a zip skipped
    one and analysed another. One rule, the same reason everywhere."""
    assert kind_of(name, EXTS) == Kind.OTHER
    assert not_video_reason(name).startswith("unnamed: a file with no name before its extension")


@pytest.mark.parametrize("name", ["a.mp4", "a .mp4", "my .hidden.mp4", "x..mp4"])
def test_a_name_before_the_extension_is_enough(name):
    assert kind_of(name, EXTS) == Kind.VIDEO
