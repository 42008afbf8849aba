"""One SQLAlchemy session per request, closed when the request ends.

Views commit explicitly when they change something; an exception rolls back. The engine is
vidlora's own (``vidlora.db.get_engine``), so the web app and the workers share one
configuration.
"""

from __future__ import annotations

from flask import Flask, g
from sqlalchemy.orm import Session

from vidlora.db import get_engine


def get_db() -> Session:
    if "db" not in g:
        g.db = Session(get_engine(), expire_on_commit=False)
    return g.db


def close_db(exc: BaseException | None = None) -> None:
    session: Session | None = g.pop("db", None)
    if session is not None:
        if exc is not None:
            session.rollback()
        session.close()


def init_app(app: Flask) -> None:
    app.teardown_appcontext(close_db)
