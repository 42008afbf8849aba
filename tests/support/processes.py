"""Process checks the tests share."""

from __future__ import annotations

from pathlib import Path


def running(pid: int) -> bool:
    """Running (a zombie waiting for an init that reaps slowly counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")
