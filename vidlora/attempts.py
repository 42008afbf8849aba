"""The attempt cap, kept in the database so a poison message cannot loop forever.

Celery redelivers a task whose worker died (acks late + reject on worker lost); that is what
makes a SIGKILL lose nothing. The same mechanism would loop forever on an input that kills
the worker every time, so every delivery of a task increments ``attempts`` on its row in its
own transaction before any work, and a row past the cap is failed with its reason instead.
Celery's own retries (transient errors such as a database restart) are not deliveries of new
work and do not count.
"""

from __future__ import annotations

from typing import Protocol


class Attempted(Protocol):
    attempts: int
    status: str
    reason: str | None


def begin_attempt(row: Attempted, cap: int, *, counts: bool = True) -> bool:
    """Count this delivery; return False (and fail the row) if the cap is exceeded."""
    if counts:
        row.attempts += 1
    if row.attempts > cap:
        row.status = "failed"  # the one state every attempted row (upload, video, analysis) shares
        row.reason = f"gave up after {cap} attempts (the worker died or the task timed out each time)"
        return False
    return True
