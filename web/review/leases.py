"""Review leases: a team shares one queue without landing on the same answer.

Opening an answer from the review queue holds it for that reviewer for
``VIDLORA_REVIEW_LEASE_S``; the open page renews the hold while it stays open and lets it go
when it is left (review.js), and an abandoned hold simply runs out. The queue hands every
other reviewer the next answer nobody holds. A lease is a courtesy, not a lock: anyone who
opens a held answer on purpose (a link, the list, the API) may review it; the page says who
has it open, and the review versions keep both reviews safe as before.

One row per result (``review_lease``), taken with a single INSERT ... ON CONFLICT DO UPDATE
that only overwrites an expired lease or the taker's own: two reviewers arriving at once
cannot both hold it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Select, delete, select
from sqlalchemy.orm import Session

from vidlora.config import get_settings
from vidlora.models import ReviewLease, User, as_utc, utcnow


@dataclass(frozen=True)
class Holder:
    """Another reviewer holding a result: who, and until when."""

    username: str
    until: datetime


def _insert(session: Session):
    if session.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert


def take(session: Session, result_id: int, user_id: int) -> Holder | None:
    """Hold ``result_id`` for ``user_id`` (or renew their hold). None when they now hold it;
    the other reviewer's live hold otherwise, which is left as it was."""
    now = utcnow()
    until = now + timedelta(seconds=get_settings().review_lease_s)
    insert = _insert(session)
    stmt = insert(ReviewLease).values(result_id=result_id, user_id=user_id, expires_at=until)
    stmt = stmt.on_conflict_do_update(
        index_elements=[ReviewLease.result_id],
        set_={"user_id": user_id, "expires_at": until},
        where=(ReviewLease.user_id == user_id) | (ReviewLease.expires_at <= now),
    ).returning(ReviewLease.user_id)
    if session.execute(stmt).scalar() == user_id:
        return None
    return holder(session, result_id, user_id)


def holder(session: Session, result_id: int, user_id: int) -> Holder | None:
    """Who else holds ``result_id`` now, if anyone does."""
    row = session.execute(
        select(User.username, ReviewLease.expires_at).join(User, User.id == ReviewLease.user_id)
        .where(ReviewLease.result_id == result_id, ReviewLease.user_id != user_id,
               ReviewLease.expires_at > utcnow())
    ).first()
    return Holder(row.username, as_utc(row.expires_at)) if row else None


def release(session: Session, result_id: int, user_id: int) -> None:
    """Let go of ``result_id`` if ``user_id`` holds it (a reviewer's verdict, or leaving the page)."""
    session.execute(delete(ReviewLease).where(ReviewLease.result_id == result_id, ReviewLease.user_id == user_id))


def release_all(session: Session, user_id: int) -> None:
    """Everything ``user_id`` holds (signing out)."""
    session.execute(delete(ReviewLease).where(ReviewLease.user_id == user_id))


def held_by_others(user_id: int) -> Select:
    """The ids of results another reviewer holds now: what the queue passes over."""
    return select(ReviewLease.result_id).where(ReviewLease.user_id != user_id, ReviewLease.expires_at > utcnow())


def sweep(session: Session) -> int:
    """Delete leases that ran out (they already count for nothing; this keeps the table small)."""
    return session.execute(delete(ReviewLease).where(ReviewLease.expires_at <= utcnow())).rowcount or 0
