from __future__ import annotations

from flask import g, jsonify, request
from flask_login import current_user

from web.api import bp
from web.auth.users import LoginUser, SignInThrottled, authenticate
from web.database import get_db

PUBLIC_ENDPOINTS = {"api.openapi"}


def _unauthorized(detail: str):
    # Deliberately no WWW-Authenticate header: see web.security.
    return jsonify(error="Please sign in", detail=detail, status=401), 401


@bp.before_request
def authenticate_request():
    if request.endpoint in PUBLIC_ENDPOINTS:
        return None
    auth = request.authorization
    if auth is not None:
        # With an Authorization header the session cookie is ignored (CSRF is skipped for it).
        if auth.type != "basic":
            return _unauthorized("Only HTTP Basic credentials are accepted.")
        try:
            user = authenticate(get_db(), auth.username or "", auth.password or "")
        except SignInThrottled as exc:
            response = jsonify(error="Too many wrong passwords", detail=str(exc), status=429)
            response.headers["Retry-After"] = str(exc.retry_after_s)
            return response, 429
        if user is None:
            return _unauthorized("Wrong username or password.")
        g.api_user = user
        return None
    if current_user.is_authenticated:
        g.api_user = LoginUser(current_user.id, current_user.username, current_user.session_token)
        return None
    return _unauthorized("Sign in, or send HTTP Basic credentials.")


def api_user() -> LoginUser:
    return g.api_user
