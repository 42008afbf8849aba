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
