from __future__ import annotations

import tempfile
from datetime import datetime, timezone

from flask import Response, current_app, render_template, request, send_file, stream_with_context
from sqlalchemy import select

from vidlora.lifecycle import AnalysisStatus, ReviewState, values
from vidlora.models import Batch
from vidlora.results.export import csv_lines, items_lines, jsonl_lines, write_parquet
from vidlora.results.query import (
    SORT_LABELS,
    FilterError,
    ResultFilters,
    count,
    facets,
    parse_filters,
    result_query,
    scenario_choices,
    scenario_fields,
)
from web.database import get_db
from web.errors import render_error
from web.pagination import PAGE_SIZES, Page, page_number, page_size
from web.query import bp


@bp.get("/")
def index():
    session = get_db()
    error = None
    try:
        filters = parse_filters(request.args)
        stmt = result_query(session, filters)
    except FilterError as exc:
        error, filters, stmt = str(exc), ResultFilters(), None
    size = page_size(current_app.config["PAGE_SIZE"])
    number = page_number()
    rows, total, facet_list = [], 0, []
    if stmt is not None:
        total = count(session, stmt)
        rows = session.execute(stmt.offset((number - 1) * size).limit(size)).all()
        facet_list = facets(session, filters)
    batches = session.scalars(select(Batch).order_by(Batch.id.desc()).limit(200)).all()
    fields = scenario_fields(session, filters.scenario)
    return render_template(
        "query/index.html", filters=filters, rows=rows, page=Page(number, size, total), error=error,
        scenarios=scenario_choices(session), batches=batches, statuses=values(AnalysisStatus),
        review_states=values(ReviewState), facets=facet_list, fields=fields,
        has_items=any(f.array for f in fields), sort_labels=SORT_LABELS, page_sizes=PAGE_SIZES, per_page=size,
    ), (400 if error else 200)


def _filename(suffix: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"vidlora-results-{stamp}.{suffix}"


def _export(lines, mimetype: str, suffix: str) -> Response:
    filters = parse_filters(request.args)  # FilterError -> 400 via the handler below
    result_query(get_db(), filters)  # a bad field condition is a 400 now, not a broken download
    response = Response(stream_with_context(lines(filters)), mimetype=mimetype)
    response.headers["Content-Disposition"] = f'attachment; filename="{_filename(suffix)}"'
    return response


@bp.get("/export.csv")
def export_csv():
    return _export(csv_lines, "text/csv; charset=utf-8", "csv")


@bp.get("/export.items.csv")
def export_items():
    return _export(items_lines, "text/csv; charset=utf-8", "items.csv")


@bp.get("/export.jsonl")
def export_jsonl():
    return _export(jsonl_lines, "application/x-ndjson; charset=utf-8", "jsonl")


@bp.get("/export.parquet")
def export_parquet():
    filters = parse_filters(request.args)
    result_query(get_db(), filters)
    # Parquet's footer comes last: the file is written whole (to disk, not memory), then sent.
    spool = tempfile.TemporaryFile(suffix=".parquet")
    write_parquet(filters, spool)
    spool.seek(0)
    return send_file(spool, mimetype="application/vnd.apache.parquet", as_attachment=True,
                     download_name=_filename("parquet"))


@bp.errorhandler(FilterError)
def bad_filter(exc: FilterError):
    return render_error(400, str(exc))
