"""trigram indexes for the search box's name match

The Results page's search finds a video by any part of its file name, or of the batch or
archive member it came in (``ILIKE '%word%'``). Without an index that reads every video's name:
seconds at 100k videos (issue 58). A pg_trgm GIN index answers such a substring match from the
index. PostgreSQL only (pg_trgm is a trusted extension: the database's owner may create it);
the embedded SQLite demo keeps its plain scan, and so does a server where the extension is
not installed or this role may not create it (a warning says so: search still works, slower).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07 15:00:00
"""
from __future__ import annotations

import logging

from alembic import op
from sqlalchemy.exc import DBAPIError

log = logging.getLogger("vidlora.migrations")


revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None

# Written by hand (autogenerate cannot represent an operator class): migrations/env.py lists
# them in MANUAL_INDEXES so `alembic check` does not call them drift.
INDEXES = {
    "ix_video_original_name_trgm": ("video", "original_name"),
    "ix_batch_item_name_trgm": ("batch_item", "name"),
}


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    try:
        with bind.begin_nested():  # a refusal must not abort the upgrade's transaction
            bind.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    except DBAPIError as exc:
        log.warning("pg_trgm unavailable (%s): the search box's name match reads every name. To index it, "
                    "a superuser runs CREATE EXTENSION pg_trgm, then %s", str(exc.orig).strip().splitlines()[0],
                    "; ".join(_create(name, table, column) for name, (table, column) in INDEXES.items()))
        return
    for name, (table, column) in INDEXES.items():
        op.execute(_create(name, table, column))


def _create(name: str, table: str, column: str) -> str:
    return f"CREATE INDEX {name} ON {table} USING gin ({column} gin_trgm_ops)"


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name in INDEXES:
        op.execute(f"DROP INDEX IF EXISTS {name}")
    # The extension stays: another schema object may use it, and it costs nothing unused.
