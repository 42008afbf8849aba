from __future__ import annotations

from flask import current_app, render_template, request
from sqlalchemy import select

from vidlora.digits import whole_number
from vidlora.lifecycle import AnalysisStatus, ReviewState, values
from vidlora.models import Batch
from vidlora.results.query import (
    CONFIDENCE_BANDS,
    SORT_LABELS,
    FilterError,
    ResultFilters,
    Total,
    bounded_count,
    confidence_facet,
    facets,
    page_of,
    parse_filters,
    result_query,
    scenario_choices,
    scenario_fields,
)
from web.database import get_db
from web.errors import render_error
from web.pagination import PAGE_SIZES, Page, last_page_at_most, page_number, page_size
from web.query import bp
from web.query.downloads import download


@bp.get("/")
def index():
    session = get_db()
    error = None
    try:
        filters = parse_filters(request.args)
        stmt = result_query(session, filters)
    except FilterError as exc:
        error, filters, stmt = str(exc), as_typed(), None
    size = page_size(current_app.config["PAGE_SIZE"])
    number = page_number()
    rows, total, facet_list, by_confidence = [], Total(0, True), [], []
    if stmt is not None:
        total = bounded_count(session, stmt)
        number = last_page_at_most(number, size, total.n)
        rows = page_of(session, stmt, (number - 1) * size, size)
        if total.exact:  # per-value counts read the whole list: past the exact count, none
            facet_list = facets(session, filters)
            by_confidence = confidence_facet(session, filters)
    batches = session.scalars(select(Batch).order_by(Batch.id.desc()).limit(200)).all()
    fields = scenario_fields(session, filters.scenario)
    return render_template(
        "query/index.html", filters=filters, rows=rows, page=Page(number, size, total.n, total.exact), error=error,
        scenarios=scenario_choices(session), batches=batches, statuses=values(AnalysisStatus),
        review_states=values(ReviewState), facets=facet_list, fields=fields,
        has_items=any(f.array for f in fields), sort_labels=SORT_LABELS, confidence_bands=CONFIDENCE_BANDS, confidence_facet=by_confidence, page_sizes=PAGE_SIZES, per_page=size,
    ), (400 if error else 200)


def as_typed() -> ResultFilters:
    """The filter form as the reader sent it, unchecked: after an error the form keeps what
    they typed (to correct it), not "all"."""
    args = request.args
    batch = args.get("batch", "")
    return ResultFilters(
        scenario=args.get("scenario", ""), review_state=args.get("review_state", ""), status=args.get("status", ""),
        batch=whole_number(batch, most_digits=10), date_from=args.get("date_from") or None,  # type: ignore[arg-type]
        date_to=args.get("date_to") or None, q=args.get("q", ""),  # type: ignore[arg-type]
        where=tuple(w for w in args.getlist("where") if w), sort=args.get("sort", ""),
        confidence=args.get("confidence", ""))


@bp.get("/export.csv")
def export_csv():
    return download("csv")


@bp.get("/export.items.csv")
def export_items():
    return download("items.csv")


@bp.get("/export.jsonl")
def export_jsonl():
    return download("jsonl")


@bp.get("/export.parquet")
def export_parquet():
    return download("parquet")


@bp.errorhandler(FilterError)
def bad_filter(exc: FilterError):
    return render_error(400, str(exc))
