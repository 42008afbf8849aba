from __future__ import annotations

import json

from flask import abort, current_app, jsonify, request, url_for
from sqlalchemy import func, select
from sqlalchemy.orm import selectinload

from vidlora.config import get_settings
from vidlora.feedback.gate import check
from vidlora.feedback.gold import GoldError, gold_results, set_gold
from vidlora.feedback.measure import EvalError, scenario_agreement, scenario_or_error
from vidlora.feedback.releases import releases
from vidlora.lifecycle import AdapterStatus
from vidlora.models import Batch, Result, Review, Scenario
from vidlora.results.export import provenance_rows, with_provenance
from vidlora.results.fields import changes, final_value
from vidlora.digits import whole_number
from vidlora.results.query import (CONFIDENCE_BANDS, FilterError, band_counts, bounded_count, facets,
                                   page_of, parse_filters, result_query)
from vidlora.results.rows import iso_utc, row_dict, shown_name
from vidlora.status import batch_view
from web import json_input
from web.api import bp
from web.api.auth import api_user
from web.api.conditional import FutureVersion, IfMatchError, if_match_version
from web.api.merge_patch import MEDIA_TYPE as MERGE_PATCH, merge_patch
from web.api.openapi import openapi_document
from web.batches.progress import summarise, view_dict
from web.database import get_db
from web.errors import render_error
from web.pagination import MAX_PAGE
from web.query.downloads import download
from web.review.actions import (
    ReviewError,
    StaleReview,
    VersionMissing,
    apply_review,
    load_for_review,
    output_schema,
)
from web.scenarios.health import holders, worker_health
from web.upload.service import UploadError, from_request, start_batch

MAX_PER_PAGE = 500


def _int_arg(name: str, default: int, highest: int) -> int:
    """A paging argument as the OpenAPI document states it: a whole number in 1..highest."""
    raw = request.args.get(name)
    if raw is None:
        return default
    value = whole_number(raw) or 0
    if not 1 <= value <= highest:
        raise FilterError(f"{name} must be a whole number from 1 to {highest}.")
    return value


def _per_page() -> int:
    return _int_arg("per_page", current_app.config["PAGE_SIZE"], MAX_PER_PAGE)


def _page() -> int:
    return _int_arg("page", 1, MAX_PAGE)


@bp.errorhandler(VersionMissing)
def version_missing(exc: VersionMissing):
    return render_error(428, str(exc))


@bp.errorhandler(FutureVersion)
def future_version(exc: FutureVersion):
    return render_error(412, str(exc))


@bp.errorhandler(FilterError)
@bp.errorhandler(ReviewError)
@bp.errorhandler(UploadError)
@bp.errorhandler(GoldError)
@bp.errorhandler(IfMatchError)
@bp.errorhandler(json_input.BodyError)
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
    req = from_request(request.files.getlist("files"), request.form.getlist("scenarios"), request.form.get("name"),
                       request.form.getlist("uploads"))
    batch_id = start_batch(req, source="api", created_by=api_user().username, user_id=api_user().id)
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
    total = bounded_count(session, stmt)  # an exact count reads the whole list: seconds at 100k
    rows = page_of(session, stmt, (page - 1) * size, size, load=with_provenance)
    return jsonify(page=page, per_page=size, total=total.n, total_exact=total.exact, filters=filters.as_args(),
                   results=list(provenance_rows(session, rows)))


@bp.get("/results/export.csv")
def export_csv():
    """The Results page's CSV export for a script: same columns and filters, streamed."""
    return download("csv")


@bp.get("/results/export.items.csv")
def export_items():
    return download("items.csv")


@bp.get("/results/export.jsonl")
def export_jsonl():
    return download("jsonl")


@bp.get("/results/export.parquet")
def export_parquet():
    return download("parquet")


@bp.get("/results/facets")
def result_facets():
    """Per controlled-vocabulary field of the scenario, the count of matching results per value."""
    session = get_db()
    filters = parse_filters(request.args)
    if not filters.scenario:
        raise FilterError("Facets are per scenario: give scenario=NAME.")
    by_band = band_counts(session, filters)
    return jsonify(filters=filters.as_args(), total=by_band.total, confidence=[
        {"band": v.value, "label": CONFIDENCE_BANDS[v.value], "count": v.count} for v in by_band.bands
    ], facets=[{
        "field": f.field.path, "kind": f.field.kind, "array": f.field.array,
        "values": [{"value": v.value, "count": v.count, "where": v.condition} for v in f.values],
    } for f in facets(session, filters)])


def _result_json(result: Result) -> dict:
    analysis = result.analysis
    data = row_dict(analysis, result, analysis.video, analysis.scenario)
    # The model's confidence as its adapter version's calibration map shows it (issue 61).
    from vidlora.feedback.calibration import calibrated_confidence

    settings = get_settings()
    data["calibrated_confidence"] = calibrated_confidence(get_db(), result, settings.eval_number_tolerance,
                                                          settings.calibration_min_answers)
    data["review_version"] = result.review_version
    data["reviews"] = [{
        "id": r.id, "action": r.action, "user": r.user.username if r.user else None,
        "text": r.text, "note": r.note, "version": r.version, "created_at": iso_utc(r.created_at),
    } for r in result.reviews]
    return data


def etag(result: Result) -> str:
    """The result's review version as an entity tag: what If-Match sends back."""
    return f'"v{result.review_version}"'


def _with_etag(result: Result, status: int = 200):
    response = jsonify(_result_json(result))
    response.headers["ETag"] = etag(result)
    return response, status


def _result_or_404(result_id: int) -> Result:
    result = get_db().get(Result, result_id, options=[selectinload(Result.reviews).selectinload(Review.user)])
    if result is None:
        abort(404, f"There is no result {result_id}.")
    return result


def _locked_or_404(result_id: int) -> Result:
    result = load_for_review(get_db(), result_id)
    if result is None:
        abort(404, f"There is no result {result_id}.")
    return result


def _if_match(result: Result) -> int | None:
    """The review version the client's If-Match names (web.api.conditional): None without the
    header (a note needs none), the current one for "*" (the RFC's "whatever is there")."""
    return if_match_version(request.headers.get("If-Match"), result.review_version)


@bp.errorhandler(StaleReview)
def stale(exc: StaleReview):
    """409: nothing was applied. The body says what changed since the client's version and
    carries the result as it is now; sending the request again with the new ETag re-applies it."""
    session = get_db()
    session.rollback()
    result = _result_or_404(int(request.view_args["result_id"]))
    structured = output_schema(result) is not None
    changed, text_before, answer_before = [], result.text, result.parsed
    for review in result.reviews:
        entry = {"version": review.version, "action": review.action, "note": review.note,
                 "user": review.user.username if review.user else None, "created_at": iso_utc(review.created_at)}
        if review.action == "edit" and structured:
            after = json.loads(review.text)
            entry["fields_changed"] = [{"path": c.path, "before": c.before, "after": c.after}
                                       for c in changes(answer_before, after)]
            answer_before = after
        elif review.action == "edit":
            entry["text_before"], entry["text_after"] = text_before, review.text
            text_before = review.text
        if review.version is not None and review.version > exc.seen:
            changed.append(entry)
    response = jsonify(error="Changed since you read it", status=409, etag=etag(result),
                       detail=f"{exc} Send it again with If-Match: {etag(result)} to apply it to the result as it is now.",
                       your_version=exc.seen, review_version=result.review_version, changes=changed,
                       result=_result_json(result))
    response.headers["ETag"] = etag(result)
    return response, 409


@bp.get("/results/<id:result_id>")
def result(result_id: int):
    return _with_etag(_result_or_404(result_id))


@bp.post("/results/<id:result_id>/review")
def review(result_id: int):
    session = get_db()
    result = _locked_or_404(result_id)
    # A form post (curl -F/-d) reads as its fields; anything sent as JSON must be an object.
    body = json_input.object_body(request, '{"action": "approve"}') if request.is_json or not request.form else request.form
    unknown = sorted(set(body) - {"action", "text", "note", "fields"})
    if unknown:
        raise ReviewError(f"Unknown field(s): {', '.join(unknown)}; send action, and text, fields or note.")
    text, note = body.get("text"), body.get("note")
    if (text is not None and not isinstance(text, str)) or (note is not None and not isinstance(note, str)):
        raise ReviewError("text and note must be strings.")
    fields = body.get("fields") if request.is_json else None
    if fields is not None and not isinstance(fields, dict):
        raise ReviewError("fields must be an object: the corrected answer, valid against the scenario's schema.")
    apply_review(session, result, str(body.get("action") or ""), api_user().id, text, note, fields=fields,
                 version=_if_match(result))
    session.commit()
    return _with_etag(result)


@bp.route("/results/<id:result_id>/fields", methods=["GET", "PATCH"])
def result_fields(result_id: int):
    """A structured result's current answer as data, with the ETag a merge patch needs. (One
    rule for both methods: with two, an id past any row answered PATCH with 405, not 404.)"""
    if request.method == "PATCH":
        return patch_fields(result_id)
    result = _result_or_404(result_id)
    if output_schema(result) is None:
        abort(404, f"Result {result_id} is free text: it has no fields (GET /results/{result_id}).")
    response = jsonify(final_value(result))
    response.headers["ETag"] = etag(result)
    return response


def patch_fields(result_id: int):
    """A partial edit of a structured answer: a JSON merge patch (RFC 7396) applied to the
    current answer, saved as an edit (validated against the schema, kept in the history)."""
    session = get_db()
    result = _locked_or_404(result_id)
    if output_schema(result) is None:
        abort(404, f"Result {result_id} is free text: edit its text with POST /results/{result_id}/review.")
    if request.mimetype != MERGE_PATCH:
        abort(415, f"Send a JSON merge patch with Content-Type: {MERGE_PATCH}.")
    try:
        patch = json_input.loads(request.get_data(as_text=True))
    except ValueError as exc:
        raise ReviewError(f"The patch is not JSON: {exc}.") from None
    if not isinstance(patch, dict):
        raise ReviewError("A merge patch of an answer is a JSON object: the fields to change, null to remove one.")
    version = _if_match(result)
    apply_review(session, result, "edit", api_user().id, fields=merge_patch(final_value(result), patch),
                 note=request.args.get("note"), version=version)
    session.commit()
    return _with_etag(result)


@bp.post("/results/<id:result_id>/gold")
def gold(result_id: int):
    """Gold marks the answer that stands as truth: with If-Match, only the answer the client
    read (a review since is a 409, as for a review; none needed, as for a note)."""
    session = get_db()
    result = _locked_or_404(result_id)
    body = json_input.object_body(request, '{"gold": true}')
    if set(body) != {"gold"} or not isinstance(body["gold"], bool):
        raise GoldError('Send a JSON object {"gold": true} or {"gold": false}.')
    seen = _if_match(result)
    if seen is not None and seen != result.review_version:
        raise StaleReview(result, seen)
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


@bp.get("/scenarios/<name>/calibration")
def calibration(name: str):
    from vidlora.feedback.calibration import scenario_calibration

    session = get_db()
    scenario = _scenario_or_404(name)
    settings = get_settings()
    reports = scenario_calibration(session, scenario, request.args.get("version") or None,
                                   settings.eval_number_tolerance, settings.calibration_min_answers)
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
    checked = [(r, *check(session, scenario, r, tolerance)) for r in releases(session, scenario)]
    return jsonify(scenario=scenario.name, serving=scenario.adapter_version, versions=[{
        "version": r.version, "status": r.status, "adapter": shown_name(r.path), "note": r.note,
        "created_at": iso_utc(r.created_at), "promoted_at": iso_utc(r.promoted_at),
        "gold_run_at": iso_utc(r.gold_run_at), "comparison": report,
        "promotable": verdict.ok, "blockers": verdict.blockers, "gold_run": verdict.gold_run.as_dict(),
        "forced_reason": r.forced_reason, "forced_over": r.forced_over,
    } for r, report, verdict in checked])
