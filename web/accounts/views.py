"""Your API tokens (every user), and the accounts page (admins): list, deactivate or
reactivate, reset a password, change a role. A new token or password is shown once, in the
response to the POST that made it (never in a flash message: those live in the cookie)."""

from __future__ import annotations

from functools import wraps

from flask import abort, flash, redirect, render_template, request, url_for
from flask_login import current_user

from vidlora.lifecycle import Role, TokenScope, values
from vidlora.models import User
from web.accounts import bp
from web.auth.tokens import TokenError, create_token, revoke_token, user_tokens
from web.auth.users import UserError, list_users, reset_password, set_active, set_role
from web.database import get_db


def admin_only(view):
    @wraps(view)
    def wrapper(*args, **kwargs):
        if not current_user.is_admin:
            abort(403, "Only an admin may manage accounts.")
        return view(*args, **kwargs)
    return wrapper


def _no_store(response_and_status):
    body, status = response_and_status
    return body, status, {"Cache-Control": "no-store"}


@bp.get("/tokens")
def tokens():
    return _tokens_page()


def _tokens_page(new=None, error: str | None = None, status: int = 200):
    return _no_store((render_template(
        "accounts/tokens.html", tokens=user_tokens(get_db(), current_user.id), new=new, error=error,
        scopes=values(TokenScope)), status))


@bp.post("/tokens")
def create():
    db = get_db()
    try:
        new = create_token(db, db.get(User, current_user.id), request.form.get("name", ""),
                           request.form.get("scope", ""))
    except TokenError as exc:
        db.rollback()
        return _tokens_page(error=str(exc), status=400)
    db.commit()
    return _tokens_page(new=new)


@bp.post("/tokens/<id:token_id>/revoke")
def revoke(token_id: int):
    db = get_db()
    try:
        row = revoke_token(db, token_id, None if current_user.is_admin else current_user.id)
    except TokenError as exc:
        abort(404, str(exc))
    db.commit()
    flash(f"Token “{row.name}” revoked: scripts using it are refused from now on.", "success")
    return redirect(url_for("accounts.users" if request.form.get("from") == "users" else "accounts.tokens"), code=303)


@bp.get("/users")
@admin_only
def users():
    return _users_page()


def _users_page(shown_password: tuple[str, str] | None = None, error: str | None = None, status: int = 200):
    db = get_db()
    return _no_store((render_template(
        "accounts/users.html", users=list_users(db), tokens=user_tokens(db), roles=values(Role),
        shown_password=shown_password, error=error), status))


@bp.post("/users/<id:user_id>")
@admin_only
def act(user_id: int):
    db = get_db()
    user = db.get(User, user_id)
    if user is None:
        abort(404, f"There is no user {user_id}.")
    action = request.form.get("action", "")
    shown = None
    try:
        if action == "deactivate":
            set_active(db, user.username, False)
            message = f"{user.username} is deactivated: signed out everywhere, API tokens revoked."
        elif action == "activate":
            set_active(db, user.username, True)
            message = f"{user.username} can sign in again (old API tokens stay revoked)."
        elif action == "reset":
            shown = (user.username, reset_password(db, user.username))
            message = None
        elif action == "role":
            set_role(db, user.username, request.form.get("role", ""))
            message = f"{user.username} is now {user.role}."
        else:
            raise UserError("unknown action")
    except UserError as exc:
        db.rollback()
        return _users_page(error=str(exc), status=400)
    db.commit()
    if shown is not None:
        return _users_page(shown_password=shown)
    flash(message, "success")
    return redirect(url_for("accounts.users"), code=303)
