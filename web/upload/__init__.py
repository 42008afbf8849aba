from flask import Blueprint

from web.security import require_login

bp = Blueprint("upload", __name__, url_prefix="/upload")
require_login(bp)

from web.upload import views  # noqa: E402,F401
