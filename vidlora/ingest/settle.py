"""Is a file still being written? Its size or modification time changes while we watch.

A recorder writing MKV, fragmented MP4 or MPEG-TS, or a copy still arriving on a share, leaves
a file that reads as a shorter recording: taken then, it is analysed as if complete (or, for a
plain MP4 whose index comes last, refused as damaged). Files given by path are watched for
``settings.ingest_settle_s`` before they are parked; one untouched for that long already is
taken at once, so a folder of finished recordings costs no wait at all.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

STILL_WRITTEN = "still_being_written"  # the stable code that starts the reason


def _mark(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def changing(paths: list[Path], settle_s: float) -> dict[Path, str]:
    """The paths whose size or modification time changed within ``settle_s`` (one wait for
    all of them), each with the reason to record."""
    before = {p: _mark(p) for p in paths}
    now = time.time_ns()
    young = [p for p, m in before.items() if m is not None and now - m[1] < settle_s * 1e9]
    if not young or settle_s <= 0:
        return {}
    time.sleep(settle_s)
    out: dict[Path, str] = {}
    for p in young:
        after = _mark(p)
        if after != before[p]:
            out[p] = still_written(before[p][0], after[0] if after else None, settle_s)
    return out


def still_written(size_before: int, size_after: int | None, settle_s: float) -> str:
    grew = (f"grew from {size_before:,} to {size_after:,} bytes" if size_after is not None and size_after != size_before
            else "was modified")
    return (f"{STILL_WRITTEN}: the file {grew} within {settle_s:g} s, so it is still being written "
            "(a recording in progress, or a copy not finished); taking it now would analyse only "
            "part of it. Add it again once it is complete.")
