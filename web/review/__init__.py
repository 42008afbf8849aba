from flask import Blueprint

from web.security import require_login

bp = Blueprint("review", __name__, url_prefix="/review")
require_login(bp)

from web.review import views  # noqa: E402,F401
