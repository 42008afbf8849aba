"""API tokens: what a script sends instead of a password (``Authorization: Bearer vl_...``).

A token is ``vl_`` + 8 characters of prefix + ``_`` + 43 of secret (32 random bytes). Only its
SHA-256 is stored: the token has full entropy, so a fast hash cannot be reversed by guessing,
and a lookup is one indexed equality. It is shown once, when created. Its scope limits what it
may do (``read``: GET only; ``review``: also submit batches and reviews); a revoked token, or
one of a deactivated account, is refused at once.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from vidlora.lifecycle import TokenScope, values
from vidlora.models import ApiToken, User, as_utc, utcnow

PREFIX = "vl_"
LAST_USED_GRANULARITY = timedelta(minutes=1)
MAX_NAME_CHARS = 100


class TokenError(ValueError):
    pass


@dataclass(frozen=True)
class NewToken:
    id: int
    token: str  # the only time it exists in clear
    scope: str


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(session: Session, user: User, name: str, scope: str) -> NewToken:
    name = name.strip()
    if not name or len(name) > MAX_NAME_CHARS:
        raise TokenError(f"a token needs a name of 1 to {MAX_NAME_CHARS} characters (what it is for)")
    if scope not in values(TokenScope):
        raise TokenError(f"a token's scope is one of: {', '.join(values(TokenScope))}")
    if not user.is_active:
        raise TokenError(f"user {user.username!r} is deactivated")
    prefix = secrets.token_hex(4)
    token = f"{PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    row = ApiToken(user_id=user.id, name=name, prefix=prefix, token_hash=_digest(token), scope=scope)
    session.add(row)
    session.flush()
    return NewToken(row.id, token, scope)


def token_user(session: Session, token: str) -> tuple[User, ApiToken] | None:
    """The active account and live token this bearer token names, or None."""
    if not token.startswith(PREFIX) or len(token) > 200:
        return None
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == _digest(token)))
    if row is None or row.revoked_at is not None or not row.user.is_active:
        return None
    now = utcnow()
    if row.last_used_at is None or now - as_utc(row.last_used_at) > LAST_USED_GRANULARITY:
        row.last_used_at = now  # not a write per request: "last used" to the minute is enough
    return row.user, row


def user_tokens(session: Session, user_id: int | None = None) -> list[ApiToken]:
    """Tokens, newest first: one user's, or everyone's (admins)."""
    stmt = select(ApiToken).order_by(ApiToken.id.desc())
    if user_id is not None:
        stmt = stmt.where(ApiToken.user_id == user_id)
    return list(session.scalars(stmt))


def revoke_token(session: Session, token_id: int, user_id: int | None = None) -> ApiToken:
    """Revoke a token; with ``user_id``, only one of that user's."""
    row = session.get(ApiToken, token_id)
    if row is None or (user_id is not None and row.user_id != user_id):
        raise TokenError(f"no token {token_id}" + ("" if user_id is None else " of yours"))
    if row.revoked_at is None:
        row.revoked_at = utcnow()
    return row


def revoke_all(session: Session, user_id: int) -> int:
    """Revoke every live token of a user; ``set_active`` (deactivation) and ``set_password``
    (a password change, and so an admin's reset) call it. Returns how many were live."""
    rows = session.scalars(select(ApiToken).where(ApiToken.user_id == user_id, ApiToken.revoked_at.is_(None))).all()
    for row in rows:
        row.revoked_at = utcnow()
    return len(rows)
