from __future__ import annotations

from flask import abort, current_app, jsonify, render_template, request
from sqlalchemy import func, select

from vidlora.digits import whole_number
from vidlora.models import Batch, Scenario
from vidlora.status import batch_view
from web.batches import bp
from web.batches.progress import summarise, view_dict
from web.database import get_db
from web.pagination import Page, last_page_at_most, page_number


@bp.get("/")
def index():
    session = get_db()
    size = current_app.config["PAGE_SIZE"]
    total = session.scalar(select(func.count(Batch.id))) or 0
    page = last_page_at_most(page_number(), size, total)
    batches = session.scalars(
        select(Batch).order_by(Batch.id.desc()).offset((page - 1) * size).limit(size)
    ).all()
    names = {n for b in batches for n in b.scenario_names}
    titles = dict(session.execute(select(Scenario.name, Scenario.title).where(Scenario.name.in_(names))).all())
    return render_template(
        "batches/index.html", batches=batches, summaries=summarise(session, list(batches)),
        page=Page(page, size, total), titles=titles,
    )


@bp.get("/progress.json")
def progress():
    """Progress of the batches listed on the page, for its live update."""
    ids = [n for x in request.args.get("ids", "").split(",") if (n := whole_number(x.strip(), most_digits=10)) is not None][:200]
    session = get_db()
    batches = session.scalars(select(Batch).where(Batch.id.in_(ids))).all() if ids else []
    return jsonify({str(k): v.as_dict() for k, v in summarise(session, list(batches)).items()})


@bp.get("/<id:batch_id>")
def detail(batch_id: int):
    session = get_db()
    view = batch_view(session, batch_id)
    if view is None:
        abort(404, f"There is no batch {batch_id}.")
    batch = session.get(Batch, batch_id)
    return render_template("batches/detail.html", view=view, batch=batch)


@bp.get("/<id:batch_id>/status.json")
def status(batch_id: int):
    view = batch_view(get_db(), batch_id)
    if view is None:
        abort(404, f"There is no batch {batch_id}.")
    return jsonify(view_dict(view))
