"""The result query: filters from a query string to one SQL statement (pages, API, exports,
``vidlora results``), and the facet counts beside it.

Rows are analyses, with their result when there is one, so "failed" or "running" work can be
listed too. The search box finds a result by its text, its video's file name, or the name of a
batch (or archive member) the video came in. Text search on PostgreSQL is web-search syntax
(``"red slip" -modern``, ``or``) with every word a prefix (``amph`` finds amphora), on exactly
the expression of the GIN index ``ix_result_fts`` so the planner can use it; SQLite falls back
to a substring match. Field conditions (``vidlora.results.conditions``) run on the indexed
``result_field`` rows.
"""

from __future__ import annotations

import operator
import re
from dataclasses import asdict, dataclass, field
from datetime import date, datetime, time, timedelta, timezone
from typing import Any

from sqlalchemy import ColumnElement, Select, Text, and_, cast, exists, false, func, literal_column, or_, select
from sqlalchemy.orm import Session, aliased

from vidlora.digits import whole_number
from vidlora.names import canonical
from vidlora.lifecycle import AnalysisStatus, ReviewState, values
from vidlora.models import Analysis, Batch, BatchItem, Result, ResultField, Scenario, Video
from vidlora.results.conditions import Condition, ConditionError, parse_conditions
from vidlora.results.confidence import BANDS, UNKNOWN
from vidlora.results.fields import FieldSpec, schema_fields

MAX_QUERY_CHARS = 500
MAX_CONDITION_CHARS = 300


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
    where: tuple[str, ...] = field(default=())  # field conditions, as typed
    confidence: str = ""  # a band of the answer's confidence (CONFIDENCE_BANDS), or "unknown"
    sort: str = ""  # a key of SORTS; "" is relevance when searching, else newest first

    @property
    def active(self) -> bool:
        return any(v not in ("", None, ()) for k, v in asdict(self).items() if k != "sort")

    def as_args(self) -> dict[str, str | list[str]]:
        """The filters as query-string arguments (export and facet links carry the same query)."""
        args: dict[str, str | list[str]] = {k: str(v) for k, v in asdict(self).items()
                                            if k != "where" and v not in ("", None)}
        if self.where:
            args["where"] = list(self.where)
        return args

    def with_confidence(self, band: str) -> "ResultFilters":
        """These filters with the confidence band set ("" clears it): a facet link."""
        return ResultFilters(**{**asdict(self), "confidence": band})

    def with_where(self, condition: str | None = None, without: str | None = None) -> "ResultFilters":
        """These filters with one condition added (a facet link) or removed (its chip)."""
        where = [w for w in self.where if w != without]
        if condition is not None and condition not in where:
            where.append(condition)
        return ResultFilters(**{**asdict(self), "where": tuple(where)})


def _date(value: str, label: str) -> date | None:
    if not value:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise FilterError(f"{label} must be a date like 2026-11-30.") from None


def _clean_arg(value: str, key: str) -> str:
    # A NUL can never match (PostgreSQL text cannot hold one) and would fail the query itself.
    if "\x00" in value:
        raise FilterError(f"{key} may not contain a NUL character.")
    return value


# Free text: surrounding spaces are not meant. Every other filter must be exactly one of its
# values (or empty: no filter), so a stray character is an error, not silently "any".
TEXT_ARGS = {"q", "scenario", "where"}


def parse_filters(args) -> ResultFilters:
    """From request.args (or any mapping); raises FilterError with a message for people."""
    def get(key: str) -> str:
        given = args.getlist(key) if hasattr(args, "getlist") else [args.get(key)]
        if len(given) > 1:
            raise FilterError(f"{key} may be given once.")
        value = _clean_arg(given[0] or "" if given else "", key)
        return value.strip() if key in TEXT_ARGS else value

    review_state, status = get("review_state"), get("status")
    if review_state and review_state not in values(ReviewState):
        raise FilterError(f"Review state must be one of: {', '.join(values(ReviewState))}.")
    if status and status not in values(AnalysisStatus):
        raise FilterError(f"Status must be one of: {', '.join(values(AnalysisStatus))}.")
    batch_raw = get("batch")
    batch = whole_number(batch_raw, most_digits=10)
    if batch_raw and not (batch is not None and 1 <= batch <= 2**31 - 1):
        raise FilterError("Batch must be a batch number.")
    q = canonical(get("q"))  # names are stored in NFC: a Mac's decomposed typing finds them
    if len(q) > MAX_QUERY_CHARS:
        raise FilterError(f"The search text may have at most {MAX_QUERY_CHARS} characters.")
    raw_where = args.getlist("where") if hasattr(args, "getlist") else args.get("where") or []
    where = tuple(_clean_arg(w, "where").strip() for w in ([raw_where] if isinstance(raw_where, str) else raw_where)
                  if w and w.strip())
    if any(len(w) > MAX_CONDITION_CHARS for w in where):
        raise FilterError(f"A field condition may have at most {MAX_CONDITION_CHARS} characters.")
    confidence = get("confidence")
    if confidence and confidence not in CONFIDENCE_BANDS:
        raise FilterError(f"Confidence must be one of: {', '.join(CONFIDENCE_BANDS)}.")
    sort = get("sort")
    if sort and sort not in SORTS:
        raise FilterError(f"Sort must be one of: {', '.join(SORTS)}.")
    filters = ResultFilters(
        sort=sort, scenario=get("scenario"), review_state=review_state, status=status,
        batch=batch if batch_raw else None,
        date_from=_date(get("date_from"), "From"), date_to=_date(get("date_to"), "To"), q=q,
        where=tuple(dict.fromkeys(where)), confidence=confidence,
    )
    if filters.date_from and filters.date_to and filters.date_from > filters.date_to:
        raise FilterError("The 'from' date is after the 'to' date.")
    return filters


# Orders a list can be read in, each ending in the analysis id so pages and the review queue's
# previous/next are stable: (column, descending, nulls last) per key.
SORT_KEYS: dict[str, tuple[tuple[Any, bool, bool], ...]] = {
    "newest": ((Analysis.id, True, False),),
    "oldest": ((Analysis.id, False, False),),
    "name": ((Video.original_name, False, False), (Analysis.id, True, False)),
    "scenario": ((Scenario.title, False, False), (Analysis.id, True, False)),
    # The review queue a reviewer with little time wants: the model's doubts first; answers
    # without a confidence (free text, stored before) after all that have one.
    "uncertain": ((Result.confidence, False, True), (Analysis.id, False, False)),
}


def _order(keys, reverse: bool = False) -> list:
    out = []
    for column, descending, nulls_last in keys:
        down = descending != reverse
        term = column.desc() if down else column.asc()
        if nulls_last:
            term = term.nulls_first() if reverse else term.nulls_last()
        out.append(term)
    return out


SORTS = {name: tuple(_order(keys)) for name, keys in SORT_KEYS.items()}
SORT_LABELS = {"": "best match, or newest", "newest": "newest first", "oldest": "oldest first",
               "name": "file name", "scenario": "scenario", "uncertain": "least certain first"}
CONFIDENCE_BANDS = {**{key: label for key, label, _low, _high in BANDS}, UNKNOWN: "unknown"}


def _confidence_clause(band: str) -> ColumnElement[bool]:
    if band == UNKNOWN:
        return Result.confidence.is_(None)
    low, high = next((lo, hi) for key, _label, lo, hi in BANDS if key == band)
    return and_(Result.confidence >= low, Result.confidence < high)


def _prefix_tsquery(q: str):
    """Web-search syntax with every lexeme a prefix: websearch_to_tsquery parses the operators,
    then each quoted lexeme of its text form gains ``:*`` and is parsed back."""
    english = literal_column("'english'")
    parsed = cast(func.websearch_to_tsquery(english, q), Text)
    return func.to_tsquery(english, func.regexp_replace(parsed, r"'((?:[^']|'')+)'", r"'\1':*", "g"))


def _name_terms(q: str) -> list[str]:
    """The words a file or batch name must contain: the search's words, without the
    web-search operators (a "-word" excludes text, it is not a name)."""
    words = [w.strip('"') for w in re.findall(r'-?"[^"]*"|\S+', q)]
    return [w for w in words if w and not w.startswith("-") and w.lower() != "or"]


def _names_match(q: str) -> ColumnElement[bool]:
    """Every search word is in the video's file name, or in a batch's or member's name it came in.
    Each name is matched in a subquery of its own table, so PostgreSQL can answer it from that
    name's trigram index (migration 0017) rather than test every row's names."""
    terms = _name_terms(q)
    if not terms:
        return false()  # only operators: nothing to match by name
    member = BatchItem.video_id.is_not(None)
    return and_(*[
        or_(Analysis.video_id.in_(select(Video.id).where(_contains(Video.original_name, t)).correlate(None)),
            # (a member that never became a video has no video id: a NULL here matches nothing)
            Analysis.video_id.in_(select(BatchItem.video_id).where(_contains(BatchItem.name, t)).correlate(None)),
            Analysis.video_id.in_(select(BatchItem.video_id).join(Batch, Batch.id == BatchItem.batch_id)
                                  .where(member, _contains(Batch.name, t)).correlate(None)))
        for t in terms
    ])


def _fts_document():
    # Must match the index expression in the initial migration, character for character.
    return func.to_tsvector(literal_column("'english'"), func.coalesce(Result.edited_text, Result.text))


def scenario_schema(session: Session, name: str) -> dict | None:
    """A scenario's output schema (None for a free-text or unknown scenario, or none chosen)."""
    if not name:
        return None
    return session.scalar(select(Scenario.output_schema).where(Scenario.name == name))


def scenario_fields(session: Session, name: str) -> list[FieldSpec]:
    """The fields of a scenario's answers (none for a free-text or unknown scenario)."""
    return schema_fields(scenario_schema(session, name))


def field_conditions(session: Session, filters: ResultFilters) -> list[Condition]:
    try:
        return parse_conditions(filters.where, scenario_fields(session, filters.scenario))
    except ConditionError as exc:
        raise FilterError(str(exc)) from None


COMPARE = {"=": operator.eq, "!=": operator.ne, ">": operator.gt, ">=": operator.ge, "<": operator.lt,
           "<=": operator.le}


def _contains(column, text: str) -> ColumnElement[bool]:
    """Case-insensitive substring match, the text's own % and _ taken literally."""
    pattern = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    return column.ilike(pattern, escape="\\")


def _matches(column: type[ResultField], cond: Condition) -> ColumnElement[bool]:
    value = column.num if cond.field.numeric else column.text
    if cond.op == "~":
        return _contains(value, str(cond.value))
    return COMPARE[cond.op](value, cond.value)


def _field_clause(conditions: list[Condition]) -> ColumnElement[bool]:
    """Each condition holds for some leaf; conditions on one array hold for the same item."""
    groups: dict[str | None, list[Condition]] = {}
    for cond in conditions:
        groups.setdefault(cond.field.array, []).append(cond)
    clauses: list[ColumnElement[bool]] = []
    for array, group in groups.items():
        if array is None:
            for cond in group:
                clauses.append(exists().where(ResultField.result_id == Result.id,
                                              ResultField.path == cond.field.path, _matches(ResultField, cond)))
            continue
        first = aliased(ResultField)
        where = [first.result_id == Result.id, first.path == group[0].field.path, _matches(first, group[0])]
        for cond in group[1:]:
            other = aliased(ResultField)
            where.append(exists().where(other.result_id == first.result_id, other.item == first.item,
                                        other.path == cond.field.path, _matches(other, cond)))
        clauses.append(exists().where(*where))
    return and_(*clauses)


def result_query(session: Session, filters: ResultFilters) -> Select:
    """The statement for these filters on this session's database."""
    return build_query(filters, session.get_bind().dialect.name == "postgresql", field_conditions(session, filters))


def build_query(filters: ResultFilters, postgres: bool, conditions: list[Condition] | None = None) -> Select:
    stmt = (
        select(Analysis, Result, Video, Scenario)
        .join(Video, Video.id == Analysis.video_id)
        .join(Scenario, Scenario.id == Analysis.scenario_id)
    )
    # An inner join when only rows with a result can match: with an outer join PostgreSQL
    # cannot push the search condition down to the result table and its GIN index.
    needs_result = bool(filters.review_state or conditions or filters.confidence)
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
    if conditions:
        stmt = stmt.where(_field_clause(conditions))
    if filters.confidence:
        stmt = stmt.where(_confidence_clause(filters.confidence))
    if filters.q:
        if postgres:
            query = _prefix_tsquery(filters.q)
            # The text match as its own subquery on result, so it can use the GIN index
            # whatever the name matches around it do.
            text_match = Result.id.in_(select(Result.id).where(_fts_document().bool_op("@@")(query)))
            stmt = stmt.where(or_(text_match, _names_match(filters.q)))
            if not filters.sort:
                rank = func.coalesce(func.ts_rank(_fts_document(), query), 0)
                return stmt.order_by(rank.desc(), Analysis.id.desc())
        else:
            stmt = stmt.where(or_(_contains(func.coalesce(Result.edited_text, Result.text), filters.q),
                                  _names_match(filters.q)))
    return stmt.order_by(*SORTS[filters.sort or "newest"])


@dataclass(frozen=True)
class FacetValue:
    value: str
    count: int
    condition: str  # the condition that selects it
    active: bool


@dataclass(frozen=True)
class Facet:
    field: FieldSpec
    values: list[FacetValue]


def _facet_text(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def facets(session: Session, filters: ResultFilters) -> list[Facet]:
    """For a structured scenario: each controlled-vocabulary field with, per value, how many
    results of the current filter have it (any item, for an array)."""
    fields = [f for f in scenario_fields(session, filters.scenario) if f.facetable]
    if not fields:
        return []
    ids = (result_query(session, filters).with_only_columns(Result.id).where(Result.id.is_not(None))
           .order_by(None).scalar_subquery())
    # Each result once per value (``ResultField.repeat``): a plain count, not a DISTINCT that
    # sorts every row (issue 58: 300,000 rows at 100k results).
    rows = session.execute(
        select(ResultField.path, ResultField.text, func.count())
        .where(ResultField.result_id.in_(ids), ResultField.path.in_([f.path for f in fields]),
               ResultField.repeat.is_(False))
        .group_by(ResultField.path, ResultField.text)
    ).all()
    counts = {(path, text): n for path, text, n in rows}
    active = {str(c) for c in field_conditions(session, filters) if c.op == "="}
    out = []
    for f in fields:
        vocabulary = [_facet_text(v) for v in (f.enum if f.enum is not None else (True, False))]
        vocabulary += sorted({t for (p, t) in counts if p == f.path and t is not None} - set(vocabulary))
        values = [FacetValue(v, counts.get((f.path, v), 0), f"{f.path}={v}", f"{f.path}={v}" in active)
                  for v in vocabulary]
        out.append(Facet(f, values))
    return out


@dataclass(frozen=True)
class BandCounts:
    total: int  # results of the filter as given (its band included)
    bands: list[FacetValue]


def confidence_facet(session: Session, filters: ResultFilters) -> list[FacetValue]:
    """How many results of the current filter (whatever band it picks) fall in each
    confidence band; the value is the band's key, for the filter."""
    return band_counts(session, filters).bands


def band_counts(session: Session, filters: ResultFilters) -> BandCounts:
    """The confidence bands' counts and the filter's own total, in one pass over the list
    (a count per band was a pass each: five at 100k results; the list joined to itself to
    count them was another)."""
    base = ResultFilters(**{**asdict(filters), "confidence": "", "sort": ""})
    total = func.count().filter(_confidence_clause(filters.confidence)) if filters.confidence else func.count()
    counts = session.execute(
        result_query(session, base).order_by(None)
        .with_only_columns(total, *(func.count(Result.id).filter(_confidence_clause(band)) for band in CONFIDENCE_BANDS))
    ).one()
    return BandCounts(counts[0] or 0, [FacetValue(band, n or 0, band, filters.confidence == band)
                                       for band, n in zip(CONFIDENCE_BANDS, counts[1:])])


@dataclass(frozen=True)
class Neighbours:
    previous: int | None  # result ids, in the list's order
    next: int | None
    next_unreviewed: int | None
    position: Total  # 1-based, 0 when the result is not in the filter
    total: Total


def _beyond(keys, values, forward: bool) -> ColumnElement[bool]:
    """Rows strictly after (``forward``) or before the row whose sort values are ``values``,
    in the list's order: a keyset condition, so finding a neighbour reads a few index
    entries, not the whole list."""
    either = []
    for i, ((column, descending, nulls_last), value) in enumerate(zip(keys, values)):
        same = [(c.is_(None) if v is None else c == v) for (c, _, _), v in zip(keys[:i], values[:i])]
        later = forward != descending  # the column grows along the direction read
        if value is None:  # only a nulls-last column holds None: nulls are the list's end
            step = false() if forward else column.is_not(None)
        else:
            step = column > value if later else column < value
            if nulls_last and forward:
                step = or_(step, column.is_(None))
        either.append(and_(*same, step))
    # The first key's own bound besides: a condition an index can seek on (the OR alone made
    # PostgreSQL read the whole index to find the row before).
    (column, descending, nulls_last), value = keys[0], values[0]
    if value is None:
        return or_(*either)
    lead = column >= value if forward != descending else column <= value
    if nulls_last and forward:
        lead = or_(lead, column.is_(None))
    return and_(lead, or_(*either))


def neighbours(session: Session, filters: ResultFilters, result_id: int,
               passed_over: Select | None = None) -> Neighbours:
    """Where a result sits in a filtered list of results: the review queue's moves.
    ``passed_over``: ids the next unreviewed one may not be (those another reviewer holds)."""
    base = result_query(session, filters).where(Result.id.is_not(None))
    ranked = bool(filters.q and not filters.sort and session.get_bind().dialect.name == "postgresql")
    if ranked:  # a search in rank order: read its (few) rows
        return _neighbours_in(session, base, result_id, passed_over)
    keys = SORT_KEYS[filters.sort or "newest"]
    open_ = [Result.review_state == ReviewState.UNREVIEWED]
    if passed_over is not None:
        open_.append(Result.id.not_in(passed_over))

    def first(stmt: Select, reverse: bool = False) -> int | None:
        return session.scalar(stmt.with_only_columns(Result.id).order_by(None).order_by(*_order(keys, reverse)).limit(1))

    total = bounded_count(session, base)
    here = session.execute(base.with_only_columns(*(c for c, _, _ in keys)).where(Result.id == result_id)).first()
    if here is None:
        return Neighbours(None, first(base), first(base.where(*open_)), Total(0, True), total)
    values = tuple(here)
    after, before = _beyond(keys, values, True), _beyond(keys, values, False)
    following = first(base.where(after, *open_)) or first(base.where(before, *open_))  # then from the top
    position = bounded_count(session, base.where(before))
    return Neighbours(first(base.where(before), reverse=True), first(base.where(after)), following,
                      Total(position.n + 1, position.exact), total)


def _neighbours_in(session: Session, base: Select, result_id: int, passed_over: Select | None) -> Neighbours:
    skip = set(session.scalars(passed_over)) if passed_over is not None else set()
    rows = session.execute(base.with_only_columns(Result.id, Result.review_state, Analysis.id)).all()
    ids = [rid for rid, _, _ in rows]
    free = [rid for rid, state, _ in rows if state == ReviewState.UNREVIEWED and rid not in skip]
    if result_id not in ids:
        return Neighbours(None, ids[0] if ids else None, free[0] if free else None, Total(0, True), Total(len(ids), True))
    at = ids.index(result_id)
    after = [rid for rid, state, _ in rows[at + 1:] + rows[:at]
             if state == ReviewState.UNREVIEWED and rid not in skip]
    return Neighbours(ids[at - 1] if at > 0 else None, ids[at + 1] if at + 1 < len(ids) else None,
                      after[0] if after else None, Total(at + 1, True), Total(len(ids), True))


def page_of(session: Session, stmt: Select, offset: int, limit: int, load=None) -> list:
    """The rows of ``stmt`` (a ``result_query``) from ``offset``, at most ``limit``: the page's
    analysis ids first, by the list's filters and order on that one column, then those rows
    whole (``load``: a function that adds loader options to a statement). Read whole, every row skipped before page 1000 went through the
    joins and the sort with all its columns (issue 58)."""
    ids = list(session.scalars(stmt.with_only_columns(Analysis.id).offset(offset).limit(limit)))
    if not ids:
        return []
    whole = (select(Analysis, Result, Video, Scenario)
             .join(Video, Video.id == Analysis.video_id).join(Scenario, Scenario.id == Analysis.scenario_id)
             .outerjoin(Result, Result.analysis_id == Analysis.id).where(Analysis.id.in_(ids)))
    rows = session.execute(load(whole) if load is not None else whole).all()
    at = {analysis_id: i for i, analysis_id in enumerate(ids)}
    return sorted(rows, key=lambda row: at[row[0].id])


def count(session: Session, stmt: Select) -> int:
    return session.scalar(select(func.count()).select_from(stmt.order_by(None).subquery())) or 0


# Lists longer than this are counted from the planner's estimate on PostgreSQL ("about
# 100,000"): an exact count reads every row of the list, half a second and more at 100k.
COUNT_EXACT_UP_TO = 10_000


@dataclass(frozen=True)
class Total:
    n: int
    exact: bool

    def __str__(self) -> str:
        return f"{self.n:,}" if self.exact else f"about {self.n:,}"


def bounded_count(session: Session, stmt: Select) -> Total:
    """How many rows ``stmt`` gives: exact up to ``COUNT_EXACT_UP_TO`` (reading at most that
    many), past it PostgreSQL's estimate (never below the bound), exact again on SQLite."""
    up_to = COUNT_EXACT_UP_TO
    stmt = stmt.order_by(None)
    n = session.scalar(select(func.count()).select_from(stmt.limit(up_to + 1).subquery())) or 0
    if n <= up_to:
        return Total(n, True)
    bind = session.get_bind()
    if bind.dialect.name != "postgresql":
        return Total(count(session, stmt), True)
    compiled = stmt.with_only_columns(Analysis.id).compile(dialect=bind.dialect,
                                                           compile_kwargs={"render_postcompile": True})
    plan = session.connection().exec_driver_sql("EXPLAIN (FORMAT JSON) " + str(compiled), compiled.params).scalar()
    return Total(max(up_to + 1, int(plan[0]["Plan"]["Plan Rows"])), False)


def scenario_choices(session: Session) -> list[Scenario]:
    return list(session.scalars(select(Scenario).order_by(Scenario.active.desc(), Scenario.title)))
