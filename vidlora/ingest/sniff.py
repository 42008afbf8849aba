"""The first bytes of an upload against the type its name claims, before any byte is kept.

A resumable upload can run for hours: a file that is plainly not what its name says (a PDF
renamed .mp4, a web page saved as .zip) is refused on its first chunk, not after 20 GB. Only
what is certain is refused: video containers and raw streams are too many to list, so a
"video" is refused only when its head is a well-known other format; the probe judges the rest.
"""

from __future__ import annotations

from vidlora.ingest.kinds import Kind

SNIFF_BYTES = 512 + 8  # a tar header and its "ustar" magic

# Formats people mistake for footage or send by accident, by their leading bytes.
_NOT_VIDEO: tuple[tuple[bytes, str], ...] = (
    (b"%PDF", "a PDF document"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"\x7fELF", "a program (ELF)"),
    (b"MZ", "a Windows program"),
    (b"#!", "a script"),
    (b"<!DOCTYPE", "a web page"),
    (b"<!doctype", "a web page"),
    (b"<html", "a web page"),
    (b"<?xml", "an XML document"),
    (b"{\\rtf", "an RTF document"),
    (b"\xd0\xcf\x11\xe0", "an Office document"),
)
_ARCHIVE_MAGIC = (b"PK\x03\x04", b"PK\x05\x06", b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")


def refusal(head: bytes, kind: Kind) -> str | None:
    """Why these first bytes cannot be a file of ``kind``, or None if they may be."""
    if kind == Kind.ARCHIVE:
        if head.startswith(_ARCHIVE_MAGIC) or head[257:262] == b"ustar":
            return None
        if len(head) < 262 and not head.startswith(_NOT_VIDEO_PREFIXES):
            return None  # too short to tell a tar from anything else; the reader judges it
        return "its content is not a .zip, .tar or compressed tar archive"
    for magic, what in _NOT_VIDEO:
        if head.startswith(magic):
            return f"its content is {what}, not a video"
    return None


_NOT_VIDEO_PREFIXES = tuple(m for m, _ in _NOT_VIDEO)
