from __future__ import annotations

from flask import flash, redirect, render_template, request, session, url_for
from flask_login import current_user, login_required, login_user, logout_user

from web.auth import bp
from web.auth.throttle import SignInThrottled
from web.auth.users import authenticate, end_sessions
from web.database import get_db
from web.review.leases import release_all
from web.security import safe_next


@bp.route("/login", methods=["GET", "POST"])
def login():
    next_url = safe_next(request.values.get("next"), url_for("batches.index"))
    if current_user.is_authenticated:
        return redirect(next_url)
    error, status = None, 200
    if request.method == "POST":
        try:
            user = authenticate(get_db(), request.form.get("username", ""), request.form.get("password", ""),
                                request.remote_addr or "")
        except SignInThrottled as exc:
            error, status, user = str(exc), 429, None
        else:
            if user is None:
                error, status = "That username and password do not match an active account.", 401
        if user is not None:
            session.clear()  # a fresh session on sign-in (no fixation)
            login_user(user)
            return redirect(next_url)
    return render_template("auth/login.html", error=error, next_url=next_url), status


@bp.post("/logout")
@login_required
def logout():
    db = get_db()
    end_sessions(db, current_user.id)
    release_all(db, current_user.id)  # what they held in the review queue is free for the team
    db.commit()
    logout_user()
    session.clear()
    flash("You are signed out.", "info")
    return redirect(url_for("auth.login"))
