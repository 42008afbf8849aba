from __future__ import annotations

from flask import jsonify, redirect, render_template, request, url_for
from flask_login import current_user
from sqlalchemy import select

from vidlora.config import get_settings
from vidlora.ingest.kinds import UNNAMED
from vidlora.models import Scenario
from web.database import get_db
from web.errors import wants_json
from web.upload import bp
from web.upload.service import UploadError, allowed_suffixes, from_request, start_batch


def _page(error: str | None = None, status: int = 200, chosen: list[str] | None = None, name: str = ""):
    settings = get_settings()
    scenarios = get_db().scalars(select(Scenario).where(Scenario.active).order_by(Scenario.title)).all()
    return render_template(
        "upload/index.html", scenarios=scenarios, error=error, chosen=set(chosen or []), name=name,
        accept=",".join(allowed_suffixes()), max_bytes=settings.resumable_max_bytes, unnamed=UNNAMED.pattern,
        chunk_bytes=settings.resumable_chunk_bytes,
    ), status


@bp.get("/")
def index():
    return _page()


@bp.post("/")
def submit():
    req = from_request(request.files.getlist("files"), request.form.getlist("scenarios"), request.form.get("name"),
                       request.form.getlist("uploads"))
    try:
        batch_id = start_batch(req, source="web", created_by=current_user.username, user_id=current_user.id)
    except UploadError as exc:
        if wants_json():
            return jsonify(error="Upload not accepted", detail=str(exc), status=400), 400
        return _page(str(exc), 400, req.scenarios, req.name)
    url = url_for("batches.detail", batch_id=batch_id)
    if wants_json():
        return jsonify(batch_id=batch_id, url=url), 201
    return redirect(url, code=303)
