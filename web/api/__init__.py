"""JSON API under /api/v1, mirroring the pages. Auth: the login session (with the CSRF token
in an X-CSRFToken header for writes), or HTTP Basic with the same user table (no CSRF, no
cookies consulted). The OpenAPI document is public."""

from flask import Blueprint

bp = Blueprint("api", __name__, url_prefix="/api/v1")

from web.api import auth, resumable, views  # noqa: E402,F401
