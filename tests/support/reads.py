"""Counting the statements that read the stored answers: the proof that a kept measure was
not computed again."""

from contextlib import contextmanager

from sqlalchemy import event

from vidlora.db import get_engine


@contextmanager
def answers_read():
    """How many statements read the stored answers (``result.parsed``)."""
    seen: list[str] = []

    def note(conn, cursor, statement, parameters, *args):
        if "result.parsed" in statement:
            seen.append((statement, parameters))

    event.listen(get_engine(), "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(get_engine(), "before_cursor_execute", note)
