"""Request-level safety: CSRF on every state-changing request, response headers, login gates.

CSRF is checked here rather than by CSRFProtect's default hook so that one narrow case can
skip it: an API request that authenticates with an ``Authorization: Basic`` header. Such a
request carries no ambient credential a hostile page could borrow (the app never sends a
``WWW-Authenticate`` challenge, so browsers never cache Basic credentials for it), and the
API ignores the session cookie whenever that header is present.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from flask import Blueprint, Flask, request
from flask_login import current_user

from web.extensions import csrf, login_manager

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})

# No inline script or style anywhere: model output that escaped escaping still could not run.
CSP = (
    "default-src 'self'; img-src 'self' data:; media-src 'self'; style-src 'self'; "
    "script-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; "
    "frame-ancestors 'none'"
)


def uses_header_credentials() -> bool:
    """Credentials in the Authorization header (a token or Basic): a browser never adds them
    to a cross-site request on its own, so such a request needs no CSRF token."""
    auth = request.authorization
    return auth is not None and auth.type in ("basic", "bearer")


def _csrf_guard() -> None:
    if request.method in SAFE_METHODS or request.routing_exception is not None:
        return  # no view runs for a 404/405: let it answer as such, with its Allow header
    if request.blueprint == "api" and uses_header_credentials():
        return
    csrf.protect()  # raises CSRFError (403) when the token is missing or wrong


def _headers(response):
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    response.headers.setdefault("Content-Security-Policy", CSP)
    return response


def require_login(bp: Blueprint) -> None:
    """Every view of ``bp`` needs a signed-in user (one gate, so no view can forget it)."""

    @bp.before_request
    def _gate():
        if not current_user.is_authenticated:
            return login_manager.unauthorized()
        return None


def safe_next(target: str | None, default: str) -> str:
    """A redirect target from the request, only if it stays on this site."""
    if not target:
        return default
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return default
    return target


def init_app(app: Flask) -> None:
    app.before_request(_csrf_guard)
    app.after_request(_headers)
