from flask import Blueprint

from web.security import require_login

bp = Blueprint("accounts", __name__, url_prefix="/accounts")
require_login(bp)

from web.accounts import views  # noqa: E402,F401  (registers routes)
