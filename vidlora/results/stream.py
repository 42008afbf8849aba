"""Every row of a result query for an export, read as plain tuples in chunks.

An export of 100k results through ORM objects spent most of its time building them (identity
map, instrumented attributes, relationship loaders: about 2 ms a row, over three minutes at
100k, issue 58). Here the query's columns are read with a Core select streamed from a
server-side cursor (``yield_per``), a chunk's reviews and field confidences in one query
each, and each row handed to ``rows.row_dict`` as light records with the attributes it reads,
so the rows, and the exports' bytes, are what the ORM objects gave.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

from sqlalchemy import Select, select
from sqlalchemy.orm import Session, aliased

from vidlora.models import Analysis, Batch, FrameSet, Result, Review, Scenario, User, Video
from vidlora.results.query import ResultFilters, result_query
from vidlora.results.rows import row_dict, stored_confidences

ANALYSIS = ("id", "batch_id", "scenario_id", "status", "reason", "adapter_version", "engine", "created_at",
            "finished_at")
RESULT = ("id", "review_state", "confidence", "text", "edited_text", "parsed", "edited_parsed", "prompt_tokens",
          "output_tokens", "latency_s", "finish_reason", "model", "adapter", "adapter_version", "health", "gold_at")
VIDEO = ("id", "original_name", "sha256", "duration_s", "declared_duration_s", "truncated", "field_order", "width",
         "height", "codec")
FRAME_SET = ("id", "deinterlace", "timestamps")


def plain_select(stmt: Select) -> Select:
    """``stmt`` (a ``result_query``) reading only the columns a row shows. The frame set and
    the batch are joined as aliases: the search's name match names ``Batch`` in a subquery of
    its own, which a plain join would tie to the analysis's batch."""
    frame_set, batch = aliased(FrameSet), aliased(Batch)
    columns = ([getattr(Analysis, c) for c in ANALYSIS] + [getattr(Result, c) for c in RESULT]
               + [getattr(Video, c) for c in VIDEO] + [getattr(frame_set, c) for c in FRAME_SET] + [batch.name])
    return (stmt.with_only_columns(*columns)
            .outerjoin(frame_set, frame_set.id == Analysis.frame_set_id)
            .outerjoin(batch, batch.id == Analysis.batch_id))


def _record(names: tuple[str, ...], values) -> SimpleNamespace:
    return SimpleNamespace(**dict(zip(names, values)))


def _reviews(session: Session, ids: list[int]) -> dict[int, list[SimpleNamespace]]:
    out: dict[int, list[SimpleNamespace]] = {}
    if not ids:
        return out
    rows = session.execute(
        select(Review.result_id, Review.action, Review.note, Review.created_at, User.username)
        .outerjoin(User, User.id == Review.user_id).where(Review.result_id.in_(ids)).order_by(Review.id))
    for rid, action, note, created_at, username in rows:
        user = SimpleNamespace(username=username) if username is not None else None
        out.setdefault(rid, []).append(SimpleNamespace(action=action, note=note, created_at=created_at, user=user))
    return out


def chunks(session: Session, filters: ResultFilters, chunk: int, ordered: bool = True) -> Iterator[list[dict]]:
    """``row_dict`` of every row of the filters' query, in its order, ``chunk`` rows a read
    (``ordered``: as ``row_dict`` takes it)."""
    stmt = plain_select(result_query(session, filters)).execution_options(yield_per=chunk)
    scenarios: dict[int, Scenario] = {}
    a, r, v = len(ANALYSIS), len(ANALYSIS) + len(RESULT), len(ANALYSIS) + len(RESULT) + len(VIDEO)
    f = v + len(FRAME_SET)
    for part in session.execute(stmt).partitions():
        out = []
        ids = [row[a] for row in part if row[a] is not None]
        reviews, confidences = _reviews(session, ids), stored_confidences(session, ids)
        for row in part:
            analysis = _record(ANALYSIS, row[:a])
            analysis.frame_set = _record(FRAME_SET, row[v:f]) if row[v] is not None else None
            analysis.batch = SimpleNamespace(name=row[f]) if analysis.batch_id is not None else None
            result = None
            if row[a] is not None:
                result = _record(RESULT, row[a:r])
                result.reviews = reviews.get(result.id, [])
            scenario = scenarios.get(analysis.scenario_id)
            if scenario is None:
                scenario = scenarios[analysis.scenario_id] = session.get(Scenario, analysis.scenario_id)
            out.append(row_dict(analysis, result, _record(VIDEO, row[r:v]), scenario,
                                confidences.get(result.id, {}) if result is not None else None, ordered=ordered))
        yield out


def rows(session: Session, filters: ResultFilters, chunk: int) -> Iterator[dict]:
    for part in chunks(session, filters, chunk):
        yield from part
