from flask import Blueprint

from web.security import require_login

bp = Blueprint("batches", __name__, url_prefix="/batches")
require_login(bp)

from web.batches import views  # noqa: E402,F401
