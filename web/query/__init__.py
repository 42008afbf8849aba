from flask import Blueprint

from web.security import require_login

bp = Blueprint("query", __name__, url_prefix="/results")
require_login(bp)

from web.query import views  # noqa: E402,F401
