"""Database engine and sessions.

One engine per process, created lazily from settings. Workers fork (Celery prefork), so the
engine is disposed in the child before first use: a pooled connection must never be shared
across a fork.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from vidlora.config import get_settings

_engine: Engine | None = None
_engine_pid: int | None = None
_sessionmaker: sessionmaker[Session] | None = None


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    # WAL lets the web app read while workers write; busy_timeout turns lock contention
    # between worker processes into waiting instead of "database is locked" errors.
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5)


def get_engine() -> Engine:
    global _engine, _engine_pid, _sessionmaker
    if _engine is None or _engine_pid != os.getpid():
        if _engine is not None:
            _engine.dispose(close=False)  # inherited from the parent: drop, do not close
        _engine = make_engine(get_settings().database_url)
        _engine_pid = os.getpid()
        _sessionmaker = sessionmaker(_engine, expire_on_commit=False)
    return _engine


def reset_engine() -> None:
    global _engine, _sessionmaker
    if _engine is not None:
        _engine.dispose()
    _engine = None
    _sessionmaker = None


@contextmanager
def session_scope() -> Iterator[Session]:
    """A unit of work: commit on success, roll back on any exception."""
    get_engine()
    assert _sessionmaker is not None
    session = _sessionmaker()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


@contextmanager
def snapshot_scope() -> Iterator[Session]:
    """A read-only session that sees the database at one moment, however long it is read:
    an export streamed for minutes while reviewers work must not pair a row read before a
    review with that review's history read after it. PostgreSQL: a REPEATABLE READ READ
    ONLY transaction (its snapshot is taken at the first query and held to the end; read
    only, so it can never fail to serialize). SQLite (the embedded demo): one deferred
    transaction, which WAL holds at the moment of its first read."""
    engine = get_engine()
    with engine.connect() as connection:
        if engine.dialect.name == "postgresql":
            connection = connection.execution_options(isolation_level="REPEATABLE READ")
            connection.exec_driver_sql("SET TRANSACTION READ ONLY")
        else:
            connection.exec_driver_sql("BEGIN")
        session = Session(bind=connection, expire_on_commit=False)
        try:
            yield session
        finally:
            session.close()
            connection.rollback()


def is_postgres() -> bool:
    return get_engine().dialect.name == "postgresql"


def upgrade() -> None:
    """Apply every migration (alembic upgrade head) to the configured database."""
    from alembic import command
    from alembic.config import Config

    from vidlora.config import PROJECT_ROOT

    command.upgrade(Config(str(PROJECT_ROOT / "alembic.ini")), "head")
