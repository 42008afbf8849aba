from flask import Blueprint

from web.security import require_login

bp = Blueprint("scenarios", __name__, url_prefix="/scenarios")
require_login(bp)

from web.scenarios import views  # noqa: E402,F401
