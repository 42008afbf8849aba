"""When a worker counts as alive: the one rule dispatch, the reconciler, doctor and the UI use."""

from __future__ import annotations

from datetime import datetime, timedelta

# Missing this many heartbeats in a row means the process is gone or wedged.
STALE_AFTER_BEATS = 3


def alive_since(now: datetime, heartbeat_s: float) -> datetime:
    """A worker whose last heartbeat is older than this is gone (its work may be re-sent)."""
    return now - timedelta(seconds=STALE_AFTER_BEATS * heartbeat_s)
