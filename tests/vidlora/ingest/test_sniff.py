"""vidlora.ingest.sniff: a file's first bytes against the type its name claims."""

from vidlora.ingest.kinds import Kind
from vidlora.ingest.sniff import refusal


def test_plainly_other_formats_are_not_videos():
    assert "PDF" in refusal(b"%PDF-1.7\n", Kind.VIDEO)
    assert "web page" in refusal(b"<!DOCTYPE html><html>", Kind.VIDEO)
    assert "program" in refusal(b"\x7fELF\x02\x01", Kind.VIDEO)


def test_video_heads_pass_whatever_their_container():
    for head in (b"\x00\x00\x00\x18ftypmp42", b"\x47\x40\x00\x10", b"\x1aE\xdf\xa3", b"RIFF\x00\x00\x00\x00AVI ",
                 b"\x00\x00\x01\xba", b"\x00\x00\x00\x01\x67", b"YUV4MPEG2 W64", b"DKIF"):
        assert refusal(head, Kind.VIDEO) is None, head


def test_archives_must_look_like_archives():
    assert refusal(b"PK\x03\x04rest", Kind.ARCHIVE) is None
    assert refusal(b"\x1f\x8b\x08", Kind.ARCHIVE) is None
    assert refusal(b"x" * 257 + b"ustar\x0000", Kind.ARCHIVE) is None
    assert "not a .zip" in refusal(b"\x00\x00\x00\x18ftypmp42" + b"\0" * 600, Kind.ARCHIVE)
    assert "not a .zip" in refusal(b"%PDF-1.4", Kind.ARCHIVE)
