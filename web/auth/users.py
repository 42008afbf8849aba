"""Reviewer accounts in the app_user table: werkzeug password hashes, Flask-Login glue.

A session cookie names the user *and* the user's current session token: signing out or
changing the password replaces the token, so every copy of an older cookie stops working.
Wrong passwords (the sign-in form and HTTP Basic alike) are throttled per source address and
per account and address, never per account alone: ``web.auth.throttle``.
"""

from __future__ import annotations

import secrets

from flask_login import UserMixin
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from werkzeug.security import check_password_hash, generate_password_hash

from vidlora.lifecycle import Role, values
from vidlora.models import User
from vidlora.visible import INVISIBLE
from web.auth.throttle import get_throttle
from web.extensions import login_manager

MIN_PASSWORD_CHARS = 8
# Compared against when the user does not exist, so a wrong name costs as long as a wrong
# password and response times do not reveal which usernames exist.
_DUMMY_HASH = generate_password_hash("not-a-real-password")


class UserError(ValueError):
    pass


class LoginUser(UserMixin):
    """What the session knows about a user: plain values, never a live ORM row. ``scope`` is
    set when an API token signed the request in (it limits what the request may do)."""

    def __init__(self, user_id: int, username: str, session_token: str = "", role: str = Role.REVIEWER,
                 scope: str | None = None):
        self.id = user_id
        self.username = username
        self.session_token = session_token
        self.role = role
        self.scope = scope

    @classmethod
    def of(cls, user: User, scope: str | None = None) -> "LoginUser":
        return cls(user.id, user.username, user.session_token, user.role, scope)

    @property
    def is_admin(self) -> bool:
        return self.role == Role.ADMIN

    def get_id(self) -> str:
        return f"{self.id}:{self.session_token}"


def create_user(session: Session, username: str, password: str, role: str = Role.REVIEWER) -> User:
    username = username.strip()
    if not username or len(username) > 64:
        raise UserError("a username needs 1 to 64 characters")
    if INVISIBLE.search(username) or not username.isprintable():
        # "\u202Enimda" reads "admin", "ad\u200bmin" is a twin of it: names show what they are.
        raise UserError("a username may not contain invisible, control or direction-changing characters")
    if len(password) < MIN_PASSWORD_CHARS:
        raise UserError(f"a password needs at least {MIN_PASSWORD_CHARS} characters")
    if session.scalar(select(User.id).where(User.username == username)) is not None:
        raise UserError(f"user {username!r} already exists")
    if role not in values(Role):
        raise UserError(f"a role is one of: {', '.join(values(Role))}")
    user = User(username=username, password_hash=generate_password_hash(password), is_active=True, role=role)
    session.add(user)
    session.flush()
    return user


def get_user(session: Session, username: str) -> User:
    user = session.scalar(select(User).where(User.username == username.strip()))
    if user is None:
        raise UserError(f"no user {username!r}")
    return user


def list_users(session: Session) -> list[User]:
    return list(session.scalars(select(User).order_by(User.username)))


def set_password(session: Session, username: str, password: str) -> int:
    """A new password: every signed-in session and every API token of the account ends with
    the old one (a token minted from a stolen session must not outlive the owner's fix).
    Returns how many tokens were revoked; the owner creates new ones."""
    from web.auth.tokens import revoke_all

    if len(password) < MIN_PASSWORD_CHARS:
        raise UserError(f"a password needs at least {MIN_PASSWORD_CHARS} characters")
    user = get_user(session, username)
    user.password_hash = generate_password_hash(password)
    user.session_token = secrets.token_hex(16)  # signed-in sessions end with the old password
    get_throttle().forget_account(user.username)  # a locked-out owner's new password works everywhere
    return revoke_all(session, user.id)


def reset_password(session: Session, username: str) -> str:
    """A new random password for someone who lost theirs (shown once to the admin, who passes
    it on); the account's sessions and API tokens end, and its lockout is lifted."""
    password = secrets.token_urlsafe(12)
    set_password(session, username, password)
    return password


def _last_admin(session: Session, user: User) -> bool:
    others = session.scalar(select(func.count(User.id)).where(
        User.role == Role.ADMIN, User.is_active.is_(True), User.id != user.id)) or 0
    return user.role == Role.ADMIN and user.is_active and others == 0


def set_active(session: Session, username: str, active: bool) -> User:
    """Deactivate (sessions end, API tokens are revoked: reactivating does not revive them) or
    reactivate an account. The last active admin cannot be deactivated."""
    from web.auth.tokens import revoke_all

    user = get_user(session, username)
    if not active and _last_admin(session, user):
        raise UserError(f"{user.username} is the last active admin: make someone else admin first")
    user.is_active = active
    if not active:
        user.session_token = secrets.token_hex(16)
        revoke_all(session, user.id)
    return user


def set_role(session: Session, username: str, role: str) -> User:
    if role not in values(Role):
        raise UserError(f"a role is one of: {', '.join(values(Role))}")
    user = get_user(session, username)
    if role != Role.ADMIN and _last_admin(session, user):
        raise UserError(f"{user.username} is the last active admin: make someone else admin first")
    user.role = role
    return user


def end_sessions(session: Session, user_id: int) -> None:
    """Sign a user out everywhere: every cookie naming the old token stops working."""
    user = session.get(User, user_id)
    if user is not None:
        user.session_token = secrets.token_hex(16)


def authenticate(session: Session, username: str, password: str, address: str) -> LoginUser | None:
    """The user these credentials name, or None; raises SignInThrottled while ``address`` (the
    client's) must wait. A name nobody has, a wrong password and a deactivated account take
    the same path (one password hash, one count) and get the same answer."""
    throttle = get_throttle()
    throttle.check(username, address)
    user = session.scalar(select(User).where(User.username == username.strip()))
    matches = check_password_hash(user.password_hash if user is not None else _DUMMY_HASH, password)
    if user is None or not matches or not user.is_active:
        throttle.failed(username, address)
        return None
    throttle.succeeded(username, address)
    return LoginUser.of(user)


@login_manager.user_loader
def load_user(cookie_id: str) -> LoginUser | None:
    from web.database import get_db

    user_id, _, token = cookie_id.partition(":")
    try:
        user = get_db().get(User, int(user_id))
    except ValueError:
        return None
    if user is None or not user.is_active:  # a deactivated account loses its sessions at once
        return None
    if not token or not secrets.compare_digest(token, user.session_token):
        return None  # signed out, or the password changed, since this cookie was issued
    return LoginUser.of(user)


@login_manager.unauthorized_handler
def unauthorized():
    from flask import flash, jsonify, redirect, request, url_for

    from web.errors import wants_json

    if request.blueprint == "api" or wants_json():
        # No WWW-Authenticate header: browsers must never cache Basic credentials for us.
        return jsonify(error="Please sign in", detail="Sign in, or send an API token (Authorization: Bearer).",
                       status=401), 401
    flash(login_manager.login_message, login_manager.login_message_category)
    target = request.full_path if request.query_string else request.path
    return redirect(url_for("auth.login", next=target))
