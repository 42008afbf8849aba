"""Request-level safety: CSRF on every state-changing request, response headers, login gates.

CSRF is checked here rather than by CSRFProtect's default hook so that one narrow case can
skip it: an API request that authenticates with an ``Authorization: Basic`` header. Such a
request carries no ambient credential a hostile page could borrow (the app never sends a
``WWW-Authenticate`` challenge, so browsers never cache Basic credentials for it), and the
API ignores the session cookie whenever that header is present.

The same-origin check is ours too (Flask-WTF's compares the Referer with ``Host`` port for
port): a TLS proxy on port 8443 with nginx's usual ``proxy_set_header Host $host`` passes the
host without its port, while the browser's Origin names it, so every form post, sign-in
included, was refused. The origin is compared with the address the browser used: the
forwarded host and port where the proxies send them (``VIDLORA_PROXY_HOPS``), and where a
proxy dropped the port, the host alone. The token (bound to the session, unreadable from
another origin) is what stops a forged post; the origin check is a second wall.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from flask import Blueprint, Flask, current_app, request
from flask_login import current_user
from flask_wtf.csrf import CSRFError

from web.extensions import csrf, login_manager

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
DEFAULT_PORTS = {"http": 80, "https": 443}

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
    _same_origin()


def _address(url: str) -> tuple[str, str, int | None, bool]:
    """Scheme, host, port (the scheme's own when none is named), and whether one was named."""
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        port = parts.port
    except ValueError:  # a port that is no port, a broken IPv6 address: no page of this site
        return "", "", -1, True
    return scheme, (parts.hostname or "").lower(), port or DEFAULT_PORTS.get(scheme), port is not None


def _same_origin() -> None:
    """Over HTTPS, the post came from a page of this site: its Origin (or, without one, its
    Referer) names the scheme, host and port this request reached. (Over plain HTTP, as
    Flask-WTF did, the token alone: a proxy that rewrites Host may stand in front.)"""
    if not request.is_secure:
        return
    sent = request.headers.get("Origin") or request.referrer
    if not sent or sent == "null":  # every browser sends one or the other on a same-origin HTTPS post
        raise CSRFError("the request names no page it came from (no Origin or Referer header)")
    scheme, host, port, _ = _address(sent)
    _, here_host, here_port, named = _address(f"{request.scheme}://{request.host}")
    # A proxy that forwards the host without a port ($host) leaves the port unknown: the host decides.
    port_unknown = not named and current_app.config.get("PROXY_HOPS", 0) > 0
    if scheme != request.scheme or host != here_host or (port != here_port and not port_unknown):
        raise CSRFError(f"the page it came from ({scheme}://{host}:{port}) is not this site as the request "
                        f"reached it ({request.scheme}://{request.host})")


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
