"""What a file is, judged by its name: a video, an archive of videos, or neither.

The one classification every way in uses (folders and files given to the CLI, web uploads,
archive members, the ingest task), with one reason for "neither". Contents are checked later
(an archive by its reader, a video by its probe); this only decides what to try.
"""
from __future__ import annotations

import re
from enum import StrEnum
from pathlib import PurePosixPath

ARCHIVE_SUFFIXES: tuple[str, ...] = (
    ".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz",
)
NOT_VIDEO = "not_video"  # the stable code that starts the reason
UNNAMED_CODE = "unnamed"
# A name that is only an extension (".mp4"), blank before it ("   .mp4"), or hidden (starts
# with a dot: "..mp4"): nobody means to send it as a video. One rule for every way in: the
# upload page reads this pattern (data-unnamed), the server and the archive reader use it.
UNNAMED = re.compile(r"^\s*\.")


class Kind(StrEnum):
    VIDEO = "video"
    ARCHIVE = "archive"
    OTHER = "other"


def is_archive_name(name: str) -> bool:
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def leaf_of(name: str) -> str:
    return name.replace("\\", "/").rsplit("/", 1)[-1]


def kind_of(name: str, video_extensions: tuple[str, ...] | set[str]) -> Kind:
    """``name`` is a file name or a path (either slash); only its last part counts."""
    leaf = leaf_of(name)
    if UNNAMED.match(leaf):
        return Kind.OTHER
    if is_archive_name(leaf):
        return Kind.ARCHIVE
    if PurePosixPath(leaf).suffix.lower() in {e.lower() for e in video_extensions}:
        return Kind.VIDEO
    return Kind.OTHER


def not_video_reason(name: str) -> str:
    """Why a file of kind OTHER is not used, naming its type as the user sees it."""
    if UNNAMED.match(leaf_of(name)):
        return f"{UNNAMED_CODE}: a file with no name before its extension, or a hidden one (starting with a dot)"
    suffix = PurePosixPath(leaf_of(name)).suffix
    what = f"a {suffix.lower()} file" if suffix else "a file without an extension"
    return f"{NOT_VIDEO}: {what} is not a video or an archive of videos"


def accepted_suffixes(video_extensions: tuple[str, ...]) -> tuple[str, ...]:
    """What a file picker should offer and an error should list."""
    return tuple(video_extensions) + ARCHIVE_SUFFIXES


def numbered(name: str, n: int) -> str:
    """``dir/same.mp4`` as its ``n``-th namesake, ``dir/same (2).mp4``: how two files of one
    name in a batch or an archive are both kept."""
    head, slash, leaf = name.replace("\\", "/").rpartition("/")
    stem, dot, suffix = leaf.rpartition(".") if "." in leaf.lstrip(".") else (leaf, "", "")
    return f"{head}{slash}{stem} ({n}){dot}{suffix}"
