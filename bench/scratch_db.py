"""A bench's own database on a PostgreSQL server: made fresh, set as ``VIDLORA_DATABASE_URL``
before any vidlora module reads its settings, and dropped after however the bench ends (its
connections closed first: a bench's threads or workers may still hold some)."""
from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def scratch_database(admin_url: str, tag: str = "", keep: bool = False) -> Iterator[str]:
    """Yields the new database's URL; ``keep`` leaves it for a look afterwards (named on stderr)."""
    from sqlalchemy import create_engine, text

    name = f"vidlora_bench_{tag + '_' if tag else ''}{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = admin_url.rsplit("/", 1)[0] + "/" + name
    os.environ["VIDLORA_DATABASE_URL"] = url
    try:
        yield url
    finally:
        if keep:
            print(f"kept database {name}", file=sys.stderr)
        else:
            from vidlora.db import reset_engine

            reset_engine()
            with admin.connect() as conn:
                conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                  "WHERE datname = :d AND pid <> pg_backend_pid()"), {"d": name})
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()
