"""Alembic environment: the URL and metadata come from vidlora itself."""

from __future__ import annotations

from alembic import context

from vidlora.db import make_engine
from vidlora.config import get_settings
from vidlora.models import Base

config = context.config
target_metadata = Base.metadata

# Indexes written by hand in migrations that autogenerate cannot represent (PostgreSQL
# full-text expression index, trigram indexes); `alembic check` must not report them as drift.
MANUAL_INDEXES = {"ix_result_fts", "ix_video_original_name_trgm", "ix_batch_item_name_trgm"}


def include_object(obj, name, type_, reflected, compare_to):
    return not (type_ == "index" and name in MANUAL_INDEXES)


def run_migrations_offline() -> None:
    context.configure(
        url=get_settings().database_url,
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
        include_object=include_object,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    url = config.attributes.get("database_url") or get_settings().database_url
    engine = make_engine(url)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            # SQLite cannot ALTER constraints; batch mode rebuilds the table instead.
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
            include_object=include_object,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
