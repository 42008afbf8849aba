"""Work locks that die with their holder.

Two deliveries of one task can run at once (a duplicate send, a reconciler re-send while
the first is still busy). The work must then run once, and a lock must not outlive a
SIGKILLed holder, or the redelivered task would wait forever. PostgreSQL session advisory
locks have exactly that property (released when the connection drops); the embedded SQLite
set-up, which runs on one host, uses flock on a file, released by the kernel likewise.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import text

from vidlora.config import get_settings
from vidlora.db import get_engine


def _key(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


@contextmanager
def try_lock(name: str) -> Iterator[bool]:
    """Yields True if this process now holds the lock ``name``, False if another does."""
    engine = get_engine()
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": _key(name)}).scalar()
            conn.commit()
            try:
                yield bool(got)
            finally:
                if got:
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _key(name)})
                    conn.commit()
        return
    lock_dir = get_settings().var_dir / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_dir / f"{hashlib.sha256(name.encode()).hexdigest()[:24]}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
