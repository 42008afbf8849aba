from flask import Blueprint

bp = Blueprint("auth", __name__, url_prefix="/auth")

from web.auth import views  # noqa: E402,F401  (registers routes)
