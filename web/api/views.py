from __future__ import annotations

from flask import abort, current_app, jsonify, request, url_for
from sqlalchemy import func, select
from sqlalchemy.orm import selectinload

from vidlora.lifecycle import AdapterStatus
from vidlora.models import Batch, Result, Review, Scenario
from vidlora.status import batch_view
from web.api import bp
from web.api.auth import api_user
from web.api.openapi import openapi_document
from web.batches.progress import summarise, view_dict
from web.database import get_db
from web.errors import render_error
from web.pagination import MAX_PAGE
from vidlora.results.export import with_provenance
from vidlora.results.query import FilterError, count, facets, parse_filters, result_query
from vidlora.results.rows import iso_utc, row_dict, shown_name
from vidlora.config import get_settings
from vidlora.feedback.compare import compare
from vidlora.feedback.gold import GoldError, gold_results, set_gold
from vidlora.feedback.releases import releases
from vidlora.feedback.measure import EvalError, scenario_agreement, scenario_or_error
from web.review.actions import ReviewError, apply_review
from web.scenarios.health import holders, worker_health
from web.upload.service import UploadError, from_request, start_batch

MAX_PER_PAGE = 500


def _int_arg(name: str, default: int, highest: int) -> int:
    """A paging argument as the OpenAPI document states it: a whole number in 1..highest."""
    raw = request.args.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= highest:
        raise FilterError(f"{name} must be a whole number from 1 to {highest}.")
    return value


def _per_page() -> int:
    return _int_arg("per_page", current_app.config["PAGE_SIZE"], MAX_PER_PAGE)


def _page() -> int:
    return _int_arg("page", 1, MAX_PAGE)


@bp.errorhandler(FilterError)
@bp.errorhandler(ReviewError)
@bp.errorhandler(UploadError)
@bp.errorhandler(GoldError)
def bad_request(exc: ValueError):
    return render_error(400, str(exc))


@bp.get("/openapi.json")
def openapi():
    names = get_db().scalars(select(Scenario.name).where(Scenario.active.is_(True),
                                                         Scenario.adapter_status != AdapterStatus.REFUSED)
                             .order_by(Scenario.name)).all()
    return jsonify(openapi_document(list(names)))


@bp.get("/scenarios")
def scenarios():
    session = get_db()
    held = holders(worker_health(session))
    rows = session.scalars(select(Scenario).order_by(Scenario.name)).all()
    return jsonify(scenarios=[{
        "name": s.name, "title": s.title, "description": s.description, "active": s.active,
        "adapter": shown_name(s.adapter_path), "adapter_version": s.adapter_version,
        "adapter_status": s.adapter_status, "adapter_reason": s.adapter_reason,
        "available": s.adapter_status != AdapterStatus.REFUSED,
        "system_prompt": s.system_prompt, "prompt": s.prompt, "sampling": s.sampling,
        "generation": s.generation, "output_schema": s.output_schema,
        "workers": [w.worker.name for w in held.get(s.name, [])],
    } for s in rows])


@bp.get("/workers")
def workers():
    return jsonify(workers=[w.as_dict() for w in worker_health(get_db())])


@bp.get("/batches")
def batches():
    session = get_db()
    size, page = _per_page(), _page()
    total = session.scalar(select(func.count(Batch.id))) or 0
    rows = session.scalars(select(Batch).order_by(Batch.id.desc()).offset((page - 1) * size).limit(size)).all()
    summaries = summarise(session, list(rows))
    return jsonify(page=page, per_page=size, total=total, batches=[{
        "id": b.id, "name": b.name, "source": b.source, "status": b.status, "reason": b.reason,
        "scenarios": b.scenario_names, "created_by": b.created_by, "created_at": iso_utc(b.created_at),
        "progress": summaries[b.id].as_dict(), "url": url_for("api.batch", batch_id=b.id),
    } for b in rows])


@bp.post("/batches")
def enqueue():
    req = from_request(request.files.getlist("files"), request.form.getlist("scenarios"), request.form.get("name"))
    batch_id = start_batch(req, source="api", created_by=api_user().username)
    return jsonify(batch_id=batch_id, url=url_for("api.batch", batch_id=batch_id),
                   page=url_for("batches.detail", batch_id=batch_id)), 201


@bp.get("/batches/<id:batch_id>")
def batch(batch_id: int):
    view = batch_view(get_db(), batch_id)
    if view is None:
        abort(404, f"There is no batch {batch_id}.")
    return jsonify(view_dict(view))


@bp.get("/results")
def results():
    session = get_db()
    filters = parse_filters(request.args)
    size, page = _per_page(), _page()
    stmt = result_query(session, filters)
    total = count(session, stmt)
    rows = session.execute(with_provenance(stmt).offset((page - 1) * size).limit(size)).all()
    return jsonify(page=page, per_page=size, total=total, filters=filters.as_args(),
                   results=[row_dict(*row) for row in rows])


@bp.get("/results/facets")
def result_facets():
    """Per controlled-vocabulary field of the scenario, the count of matching results per value."""
    session = get_db()
    filters = parse_filters(request.args)
    if not filters.scenario:
        raise FilterError("Facets are per scenario: give scenario=NAME.")
    return jsonify(filters=filters.as_args(), total=count(session, result_query(session, filters)), facets=[{
        "field": f.field.path, "kind": f.field.kind, "array": f.field.array,
        "values": [{"value": v.value, "count": v.count, "where": v.condition} for v in f.values],
    } for f in facets(session, filters)])


def _result_json(result: Result) -> dict:
    analysis = result.analysis
    data = row_dict(analysis, result, analysis.video, analysis.scenario)
    data["reviews"] = [{
        "id": r.id, "action": r.action, "user": r.user.username if r.user else None,
        "text": r.text, "note": r.note, "created_at": iso_utc(r.created_at),
    } for r in result.reviews]
    return data


def _result_or_404(result_id: int) -> Result:
    result = get_db().get(Result, result_id, options=[selectinload(Result.reviews).selectinload(Review.user)])
    if result is None:
        abort(404, f"There is no result {result_id}.")
    return result


@bp.get("/results/<id:result_id>")
def result(result_id: int):
    return jsonify(_result_json(_result_or_404(result_id)))


@bp.post("/results/<id:result_id>/review")
def review(result_id: int):
    session = get_db()
    result = _result_or_404(result_id)
    body = request.get_json(silent=True) if request.is_json else request.form
    if not isinstance(body, dict) and not hasattr(body, "get"):
        raise ReviewError("Send a JSON object with action, and text or note where needed.")
    unknown = sorted(set(body) - {"action", "text", "note", "fields"})
    if unknown:
        raise ReviewError(f"Unknown field(s): {', '.join(unknown)}; send action, and text, fields or note.")
    text, note = body.get("text"), body.get("note")
    if (text is not None and not isinstance(text, str)) or (note is not None and not isinstance(note, str)):
        raise ReviewError("text and note must be strings.")
    fields = body.get("fields") if request.is_json else None
    if fields is not None and not isinstance(fields, dict):
        raise ReviewError("fields must be an object: the corrected answer, valid against the scenario's schema.")
    apply_review(session, result, str(body.get("action") or ""), api_user().id, text, note, fields=fields)
    session.commit()
    return jsonify(_result_json(result))


@bp.post("/results/<id:result_id>/gold")
def gold(result_id: int):
    session = get_db()
    result = _result_or_404(result_id)
    body = request.get_json(silent=True) if request.is_json else None
    if not isinstance(body, dict) or set(body) != {"gold"} or not isinstance(body["gold"], bool):
        raise GoldError('Send a JSON object {"gold": true} or {"gold": false}.')
    set_gold(result, body["gold"], api_user().id)
    session.commit()
    return jsonify(_result_json(result))


def _scenario_or_404(name: str) -> Scenario:
    try:
        return scenario_or_error(get_db(), name)
    except EvalError as exc:
        abort(404, str(exc))


@bp.get("/scenarios/<name>/agreement")
def agreement(name: str):
    session = get_db()
    scenario = _scenario_or_404(name)
    reports = scenario_agreement(session, scenario, request.args.get("version") or None,
                                 get_settings().eval_number_tolerance)
    return jsonify(scenario=scenario.name, versions=[r.as_dict() for r in reports])


@bp.get("/scenarios/<name>/gold")
def gold_set(name: str):
    session = get_db()
    scenario = _scenario_or_404(name)
    return jsonify(scenario=scenario.name, gold=[row_dict(r.analysis, r, r.analysis.video, scenario)
                                                 for r in gold_results(session, scenario.id)])


@bp.get("/scenarios/<name>/versions")
def versions(name: str):
    """The scenario's registered adapter versions; each that answered the gold set with its
    comparison to the stored answers (what `vidlora eval --compare` prints)."""
    session = get_db()
    scenario = _scenario_or_404(name)
    tolerance = get_settings().eval_number_tolerance
    return jsonify(scenario=scenario.name, serving=scenario.adapter_version, versions=[{
        "version": r.version, "status": r.status, "adapter": shown_name(r.path), "note": r.note,
        "created_at": iso_utc(r.created_at), "promoted_at": iso_utc(r.promoted_at),
        "gold_run_at": iso_utc(r.gold_run_at),
        "comparison": compare(session, scenario, r, tolerance) if r.gold_run_at else None,
    } for r in releases(session, scenario)])
