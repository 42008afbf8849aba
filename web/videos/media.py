"""Files under the media root, found by database paths only, and only inside the root.

Routes take ids; the path comes from the row. Even so a row's path is checked: a stored
path with ``..``, an absolute path, or a symlink leading out of the media root is refused.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path

from vidlora.config import get_settings

VIDEO_TYPES = {
    ".mp4": "video/mp4", ".m4v": "video/mp4", ".mov": "video/quicktime", ".mkv": "video/x-matroska",
    ".webm": "video/webm", ".ogv": "video/ogg", ".avi": "video/x-msvideo", ".mpg": "video/mpeg",
    ".mpeg": "video/mpeg", ".ts": "video/mp2t", ".mts": "video/mp2t", ".wmv": "video/x-ms-wmv",
    ".flv": "video/x-flv", ".3gp": "video/3gpp",
}


def media_file(relative: str | None) -> Path | None:
    """The file a stored relative path names, if it is a regular file inside the media root."""
    if not relative:
        return None
    root_setting = get_settings().media_root
    if root_setting is None:
        return None
    root = Path(root_setting).resolve()
    try:
        path = (root / relative).resolve(strict=True)
    except (OSError, RuntimeError, ValueError):
        return None
    if not path.is_relative_to(root) or not path.is_file():
        return None
    return path


def video_mimetype(path: Path, original_name: str | None = None) -> str:
    for name in (original_name or "", path.name):
        kind = VIDEO_TYPES.get(Path(name).suffix.lower())
        if kind:
            return kind
    return mimetypes.guess_type(path.name)[0] or "application/octet-stream"
