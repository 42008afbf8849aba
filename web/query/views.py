from __future__ import annotations

from datetime import datetime, timezone

from flask import Response, current_app, render_template, request, stream_with_context
from sqlalchemy import select

from vidlora.db import is_postgres
from vidlora.lifecycle import AnalysisStatus, ReviewState, values
from vidlora.models import Batch
from web.database import get_db
from web.errors import render_error
from web.pagination import Page, page_number
from web.query import bp
from web.query.export import csv_lines, jsonl_lines
from web.query.filters import FilterError, ResultFilters, build_query, count, parse_filters, scenario_choices


@bp.get("/")
def index():
    session = get_db()
    error = None
    try:
        filters = parse_filters(request.args)
    except FilterError as exc:
        error, filters = str(exc), ResultFilters()
    size = current_app.config["PAGE_SIZE"]
    number = page_number()
    rows, total = [], 0
    if error is None:
        stmt = build_query(filters, is_postgres())
        total = count(session, stmt)
        rows = session.execute(stmt.offset((number - 1) * size).limit(size)).all()
    batches = session.scalars(select(Batch).order_by(Batch.id.desc()).limit(200)).all()
    return render_template(
        "query/index.html", filters=filters, rows=rows, page=Page(number, size, total), error=error,
        scenarios=scenario_choices(session), batches=batches, statuses=values(AnalysisStatus),
        review_states=values(ReviewState),
    ), (400 if error else 200)


def _export(lines, mimetype: str, suffix: str) -> Response:
    filters = parse_filters(request.args)  # FilterError -> 400 via the handler below
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    response = Response(stream_with_context(lines(filters)), mimetype=mimetype)
    response.headers["Content-Disposition"] = f'attachment; filename="vidlora-results-{stamp}.{suffix}"'
    return response


@bp.get("/export.csv")
def export_csv():
    return _export(csv_lines, "text/csv; charset=utf-8", "csv")


@bp.get("/export.jsonl")
def export_jsonl():
    return _export(jsonl_lines, "application/x-ndjson; charset=utf-8", "jsonl")


@bp.errorhandler(FilterError)
def bad_filter(exc: FilterError):
    return render_error(400, str(exc))
