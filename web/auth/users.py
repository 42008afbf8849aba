"""Reviewer accounts in the app_user table: werkzeug password hashes, Flask-Login glue.

A session cookie names the user *and* the user's current session token: signing out or
changing the password replaces the token, so every copy of an older cookie stops working.
Wrong passwords are counted per account (the sign-in form and HTTP Basic alike): after
``FREE_FAILURES`` in a row each further try must wait twice as long as the last, up to
``MAX_WAIT_S``; a right password resets the count.
"""

from __future__ import annotations

import math
import secrets
from datetime import timedelta

from flask_login import UserMixin
from sqlalchemy import select
from sqlalchemy.orm import Session
from werkzeug.security import check_password_hash, generate_password_hash

from vidlora.models import User, utcnow
from web.extensions import login_manager

MIN_PASSWORD_CHARS = 8
FREE_FAILURES = 5
MAX_WAIT_S = 900
# Compared against when the user does not exist, so a wrong name costs as long as a wrong
# password and response times do not reveal which usernames exist.
_DUMMY_HASH = generate_password_hash("not-a-real-password")


class UserError(ValueError):
    pass


class SignInThrottled(Exception):
    def __init__(self, retry_after_s: int):
        super().__init__(f"Too many wrong passwords for this account: try again in {retry_after_s} s.")
        self.retry_after_s = retry_after_s


class LoginUser(UserMixin):
    """What the session knows about a user: plain values, never a live ORM row."""

    def __init__(self, user_id: int, username: str, session_token: str = ""):
        self.id = user_id
        self.username = username
        self.session_token = session_token

    def get_id(self) -> str:
        return f"{self.id}:{self.session_token}"


def create_user(session: Session, username: str, password: str) -> User:
    username = username.strip()
    if not username or len(username) > 64:
        raise UserError("a username needs 1 to 64 characters")
    if len(password) < MIN_PASSWORD_CHARS:
        raise UserError(f"a password needs at least {MIN_PASSWORD_CHARS} characters")
    if session.scalar(select(User.id).where(User.username == username)) is not None:
        raise UserError(f"user {username!r} already exists")
    user = User(username=username, password_hash=generate_password_hash(password), is_active=True)
    session.add(user)
    session.flush()
    return user


def set_password(session: Session, username: str, password: str) -> None:
    if len(password) < MIN_PASSWORD_CHARS:
        raise UserError(f"a password needs at least {MIN_PASSWORD_CHARS} characters")
    user = session.scalar(select(User).where(User.username == username))
    if user is None:
        raise UserError(f"no user {username!r}")
    user.password_hash = generate_password_hash(password)
    user.session_token = secrets.token_hex(16)  # signed-in sessions end with the old password
    user.failed_logins, user.locked_until = 0, None


def end_sessions(session: Session, user_id: int) -> None:
    """Sign a user out everywhere: every cookie naming the old token stops working."""
    user = session.get(User, user_id)
    if user is not None:
        user.session_token = secrets.token_hex(16)


def authenticate(session: Session, username: str, password: str) -> LoginUser | None:
    """The user these credentials name, or None; raises SignInThrottled while the account
    must wait. Commits the failure count (the caller's request will not)."""
    user = session.scalar(select(User).where(User.username == username.strip()))
    if user is None:
        check_password_hash(_DUMMY_HASH, password)
        return None
    now = utcnow()
    if user.locked_until is not None and user.locked_until > now:
        raise SignInThrottled(math.ceil((user.locked_until - now).total_seconds()))
    if not check_password_hash(user.password_hash, password) or not user.is_active:
        user.failed_logins = (user.failed_logins or 0) + 1
        if user.failed_logins >= FREE_FAILURES:
            wait = min(MAX_WAIT_S, 2 ** (user.failed_logins - FREE_FAILURES))
            user.locked_until = now + timedelta(seconds=wait)
        session.commit()
        return None
    if user.failed_logins or user.locked_until is not None:
        user.failed_logins, user.locked_until = 0, None
        session.commit()
    return LoginUser(user.id, user.username, user.session_token)


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
    return LoginUser(user.id, user.username, user.session_token)


@login_manager.unauthorized_handler
def unauthorized():
    from flask import flash, jsonify, redirect, request, url_for

    from web.errors import wants_json

    if request.blueprint == "api" or wants_json():
        # No WWW-Authenticate header: browsers must never cache Basic credentials for us.
        return jsonify(error="Please sign in", detail="Sign in, or send HTTP Basic credentials.",
                       status=401), 401
    flash(login_manager.login_message, login_manager.login_message_category)
    target = request.full_path if request.query_string else request.path
    return redirect(url_for("auth.login", next=target))
