"""The result query: filters from a query string to one SQL statement (pages, export, API).

Rows are analyses, with their result when there is one, so "failed" or "running" work can be
listed too. Full-text search on PostgreSQL uses exactly the expression of the GIN index
``ix_result_fts``, so the planner can use it; SQLite falls back to a substring match.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import date, datetime, time, timedelta, timezone

from sqlalchemy import Select, func, literal_column, select
from sqlalchemy.orm import Session

from vidlora.lifecycle import AnalysisStatus, ReviewState, values
from vidlora.models import Analysis, BatchItem, Result, Scenario, Video

MAX_QUERY_CHARS = 500


class FilterError(ValueError):
    pass


@dataclass(frozen=True)
class ResultFilters:
    scenario: str = ""
    review_state: str = ""
    status: str = ""
    batch: int | None = None
    date_from: date | None = None
    date_to: date | None = None
    q: str = ""

    @property
    def active(self) -> bool:
        return any(v not in ("", None) for v in asdict(self).values())

    def as_args(self) -> dict[str, str]:
        """The filters as query-string arguments (export links carry the same query)."""
        return {k: str(v) for k, v in asdict(self).items() if v not in ("", None)}


def _date(value: str, label: str) -> date | None:
    if not value:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise FilterError(f"{label} must be a date like 2026-11-30.") from None


def parse_filters(args) -> ResultFilters:
    """From request.args (or any mapping); raises FilterError with a message for people."""
    get = lambda key: (args.get(key) or "").strip()  # noqa: E731
    review_state, status = get("review_state"), get("status")
    if review_state and review_state not in values(ReviewState):
        raise FilterError(f"Review state must be one of: {', '.join(values(ReviewState))}.")
    if status and status not in values(AnalysisStatus):
        raise FilterError(f"Status must be one of: {', '.join(values(AnalysisStatus))}.")
    batch_raw = get("batch")
    if batch_raw and not batch_raw.isdigit():
        raise FilterError("Batch must be a batch number.")
    q = get("q")
    if len(q) > MAX_QUERY_CHARS:
        raise FilterError(f"The search text may have at most {MAX_QUERY_CHARS} characters.")
    filters = ResultFilters(
        scenario=get("scenario"), review_state=review_state, status=status,
        batch=int(batch_raw) if batch_raw else None,
        date_from=_date(get("date_from"), "From"), date_to=_date(get("date_to"), "To"), q=q,
    )
    if filters.date_from and filters.date_to and filters.date_from > filters.date_to:
        raise FilterError("The 'from' date is after the 'to' date.")
    return filters


def _fts_document():
    # Must match the index expression in the initial migration, character for character.
    return func.to_tsvector(literal_column("'english'"), func.coalesce(Result.edited_text, Result.text))


def build_query(filters: ResultFilters, postgres: bool) -> Select:
    stmt = (
        select(Analysis, Result, Video, Scenario)
        .join(Video, Video.id == Analysis.video_id)
        .join(Scenario, Scenario.id == Analysis.scenario_id)
    )
    # An inner join when only rows with a result can match: with an outer join PostgreSQL
    # cannot push the search condition down to the result table and its GIN index.
    needs_result = bool(filters.review_state or filters.q)
    stmt = stmt.join(Result, Result.analysis_id == Analysis.id, isouter=not needs_result)
    if filters.scenario:
        stmt = stmt.where(Scenario.name == filters.scenario)
    if filters.review_state:
        stmt = stmt.where(Result.review_state == filters.review_state)
    if filters.status:
        stmt = stmt.where(Analysis.status == filters.status)
    if filters.batch is not None:
        # A video seen in an earlier batch keeps its analyses; membership is by batch item.
        stmt = stmt.where(Analysis.video_id.in_(
            select(BatchItem.video_id).where(BatchItem.batch_id == filters.batch, BatchItem.video_id.is_not(None))
        ))
    if filters.date_from:
        stmt = stmt.where(Analysis.created_at >= datetime.combine(filters.date_from, time(), timezone.utc))
    if filters.date_to:
        end = datetime.combine(filters.date_to + timedelta(days=1), time(), timezone.utc)
        stmt = stmt.where(Analysis.created_at < end)
    if filters.q:
        if postgres:
            query = func.websearch_to_tsquery(literal_column("'english'"), filters.q)
            stmt = stmt.where(_fts_document().bool_op("@@")(query))
            return stmt.order_by(func.ts_rank(_fts_document(), query).desc(), Analysis.id.desc())
        pattern = "%" + filters.q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        stmt = stmt.where(func.coalesce(Result.edited_text, Result.text).ilike(pattern, escape="\\"))
    return stmt.order_by(Analysis.id.desc())


def count(session: Session, stmt: Select) -> int:
    return session.scalar(select(func.count()).select_from(stmt.order_by(None).subquery())) or 0


def scenario_choices(session: Session) -> list[Scenario]:
    return list(session.scalars(select(Scenario).order_by(Scenario.active.desc(), Scenario.title)))
