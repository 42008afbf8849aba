"""Reviewer accounts in the app_user table: werkzeug password hashes, Flask-Login glue."""

from __future__ import annotations

from flask_login import UserMixin
from sqlalchemy import select
from sqlalchemy.orm import Session
from werkzeug.security import check_password_hash, generate_password_hash

from vidlora.models import User
from web.extensions import login_manager

MIN_PASSWORD_CHARS = 8
# Compared against when the user does not exist, so a wrong name costs as long as a wrong
# password and response times do not reveal which usernames exist.
_DUMMY_HASH = generate_password_hash("not-a-real-password")


class UserError(ValueError):
    pass


class LoginUser(UserMixin):
    """What the session knows about a user: plain values, never a live ORM row."""

    def __init__(self, user_id: int, username: str):
        self.id = user_id
        self.username = username


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


def authenticate(session: Session, username: str, password: str) -> LoginUser | None:
    user = session.scalar(select(User).where(User.username == username.strip()))
    if user is None:
        check_password_hash(_DUMMY_HASH, password)
        return None
    if not check_password_hash(user.password_hash, password) or not user.is_active:
        return None
    return LoginUser(user.id, user.username)


@login_manager.user_loader
def load_user(user_id: str) -> LoginUser | None:
    from web.database import get_db

    try:
        user = get_db().get(User, int(user_id))
    except ValueError:
        return None
    if user is None or not user.is_active:  # a deactivated account loses its sessions at once
        return None
    return LoginUser(user.id, user.username)


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
