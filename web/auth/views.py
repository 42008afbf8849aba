from __future__ import annotations

from flask import flash, redirect, render_template, request, session, url_for
from flask_login import current_user, login_required, login_user, logout_user

from web.auth import bp
from web.auth.users import authenticate
from web.database import get_db
from web.security import safe_next


@bp.route("/login", methods=["GET", "POST"])
def login():
    next_url = safe_next(request.values.get("next"), url_for("batches.index"))
    if current_user.is_authenticated:
        return redirect(next_url)
    error = None
    if request.method == "POST":
        user = authenticate(get_db(), request.form.get("username", ""), request.form.get("password", ""))
        if user is None:
            error = "That username and password do not match an active account."
        else:
            session.clear()  # a fresh session on sign-in (no fixation)
            login_user(user)
            return redirect(next_url)
    status = 401 if error else 200
    return render_template("auth/login.html", error=error, next_url=next_url), status


@bp.post("/logout")
@login_required
def logout():
    logout_user()
    session.clear()
    flash("You are signed out.", "info")
    return redirect(url_for("auth.login"))
