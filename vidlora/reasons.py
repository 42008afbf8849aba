"""Why a file or an analysis came to nothing, in a reviewer's words.

Reasons are stored as ``code: detail`` (``vidlora.ingest.archive``'s stable codes, the file-
name rule's, the ingest task's): scripts match the code, people read this sentence. A reason
without a known code is shown as it is.
"""

from __future__ import annotations

from vidlora.ingest.archive import ARCHIVE_LABEL

WORDS = {
    "not_video": "Not a video",
    "unnamed": "No name before its extension, or a hidden file",
    "hidden": "A hidden file (its name starts with a dot), left out",
    "macos_metadata": "Mac OS bookkeeping, not a video, left out",
    "unsafe_path": "Its name points outside the archive, so it was not unpacked",
    "symlink": "A link to another file, not followed",
    "hardlink": "A link to another file, not followed",
    "special_file": "Not a regular file",
    "unsupported": "A kind of archive entry that cannot be unpacked",
    "too_large": "Larger than the limit for one video",
    "total_too_large": "The archive unpacks to more than the limit; the rest was not read",
    "ratio_exceeded": "Unpacks to far more than its packed size (a possible zip bomb), not unpacked",
    "too_many_members": "The archive has more entries than the limit; the rest was not read",
    "nested_archive": "An archive inside the archive",
    "encrypted": "Password-protected, cannot be read",
    "corrupt": "Damaged, or not what its name says",
    "duplicate": "The same video as one already received (analysed once)",
    "renamed": "Another file had the same name, so this one was renamed",
    "unreadable": "Could not be read",
}
# Details people need to act on; for the others the sentence says it all.
KEEP_DETAIL = {"not_video", "too_large", "total_too_large", "too_many_members", "nested_archive", "corrupt",
               "unreadable"}


def _one(part: str) -> str:
    code, sep, detail = part.partition(":")
    code = code.strip()
    if not sep or code not in WORDS:
        return part.strip()
    detail = detail.strip()
    if code == "corrupt":  # "BadZipFile: File is not a zip file": the exception's name is not for people
        detail = detail.partition(": ")[2] or detail
    if code == "not_video":
        return detail[:1].upper() + detail[1:] + "." if detail else WORDS[code] + "."
    return WORDS[code] + (f" ({detail})" if detail and code in KEEP_DETAIL else "") + "."


def in_words(reason: str | None) -> str:
    """``reason`` as sentences (several codes are joined by "; ")."""
    if not reason:
        return ""
    return " ".join(_one(part) for part in reason.split("; "))


def member_name(name: str) -> str:
    """The pseudo-member a whole-archive outcome is recorded under, named for people."""
    return "the archive as a whole" if name == ARCHIVE_LABEL else name
