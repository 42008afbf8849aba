from flask import Blueprint

from web.security import require_login

bp = Blueprint("videos", __name__, url_prefix="/videos")
require_login(bp)

from web.videos import views  # noqa: E402,F401
