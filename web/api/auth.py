"""Who is calling the API: an API token (``Authorization: Bearer vl_...``, what scripts should
use), HTTP Basic (kept for old scripts; throttled like the sign-in form), or the browser's
session cookie. A token's scope limits the methods it may use."""

from __future__ import annotations

from flask import g, jsonify, request
from flask_login import current_user

from vidlora.lifecycle import TokenScope
from web.api import bp
from web.auth.tokens import token_user
from web.auth.throttle import SignInThrottled
from web.auth.users import LoginUser, authenticate
from web.database import get_db

PUBLIC_ENDPOINTS = {"api.openapi"}
# tus discovery (OPTIONS on the upload endpoints) answers anyone, as tus clients expect.
PUBLIC_DISCOVERY = {"api.tus_collection", "api.tus_upload"}
READ_METHODS = {"GET", "HEAD", "OPTIONS"}


def _refused(status: int, error: str, detail: str):
    # Deliberately no WWW-Authenticate header on 401: see web.security.
    return jsonify(error=error, detail=detail, status=status), status


def _unauthorized(detail: str):
    return _refused(401, "Please sign in", detail)


def _bearer(token: str):
    db = get_db()
    found = token_user(db, token)
    if found is None:
        return _unauthorized("This API token is unknown, revoked, or its account is deactivated.")
    user, row = found
    db.commit()  # last_used_at (at most once a minute), whatever the request does next
    if row.scope == TokenScope.READ and request.method not in READ_METHODS:
        return _refused(403, "Not allowed with this token", "This token may only read; create one with "
                        "scope 'review' to submit batches or reviews.")
    g.api_user = LoginUser.of(user, scope=row.scope)
    return None


@bp.before_request
def authenticate_request():
    if request.endpoint in PUBLIC_ENDPOINTS or (request.method == "OPTIONS" and request.endpoint in PUBLIC_DISCOVERY):
        return None
    auth = request.authorization
    if auth is not None:
        # With an Authorization header the session cookie is ignored (CSRF is skipped for it).
        if auth.type == "bearer":
            return _bearer(auth.token or "")
        if auth.type != "basic":
            return _unauthorized("Send an API token (Authorization: Bearer) or HTTP Basic credentials.")
        try:
            user = authenticate(get_db(), auth.username or "", auth.password or "", request.remote_addr or "")
        except SignInThrottled as exc:
            response = jsonify(error="Too many wrong passwords", detail=str(exc), status=429)  # same for every name
            response.headers["Retry-After"] = str(exc.retry_after_s)
            return response, 429
        if user is None:
            return _unauthorized("Wrong username or password.")
        g.api_user = user
        return None
    if current_user.is_authenticated:
        g.api_user = current_user._get_current_object()
        return None
    return _unauthorized("Sign in, or send an API token (Authorization: Bearer).")


def api_user() -> LoginUser:
    return g.api_user
