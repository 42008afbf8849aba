"""Each reviewed answer of a scenario scored once, for agreement and calibration alike.

Agreement counts each field's right values; calibration asks whether the whole answer was right
and whether the review kept each top-level field the model gave a confidence for. All three
come from one pass of ``agreement.score_field`` per schema field over one read of the answers
(issue 58: at 100k results each measure reading and scoring every reviewed answer for itself
made the Scenarios page's first view take about a second). The scores are kept per scenario
until its results change (``memo``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, null, select
from sqlalchemy.orm import Session

from vidlora.feedback.agreement import normalise_text, score_fields
from vidlora.memo import keep_items, kept_items, remembered
from vidlora.lifecycle import ReviewState
from vidlora.models import Analysis, Result, ResultConfidence, Review, Scenario
from vidlora.results.confidence import is_part
from vidlora.results.fields import FieldSpec, schema_fields


@dataclass(frozen=True, slots=True)
class Scored:
    """One answer against the one its review (or the gold set) left."""

    version: str | None
    state: str  # the review state; "gold" for a candidate's answer on the gold set
    fields: tuple[tuple[int, int], ...] | None  # (right, compared) per schema field; None: not compared
    right: bool  # the whole answer (``answer_right``)
    confidence: float | None  # the model's, for the whole answer
    kept: tuple[tuple[float, bool], ...]  # (a top-level field's confidence, whether the review kept it)


def reviewed_answer(review_state: str, parsed, edited_parsed):
    """The answer a review left: the edit, or the model's own when approved unchanged; None
    for a rejected or unreviewed result."""
    if review_state == ReviewState.EDITED:
        return edited_parsed
    if review_state == ReviewState.APPROVED:
        return edited_parsed if edited_parsed is not None else parsed
    return None


def score(specs: list[FieldSpec], version: str | None, state: str, model: Any, reviewed: Any, relative: float,
          confidence: float | None = None, field_confidence: dict[str, float] | None = None,
          text: str | None = None, reviewed_text: str | None = None) -> Scored:
    """An answer scored field by field. Structured: right when every field is (a number within
    the tolerance counts, wherever the reviewed value came from); free text: the same text after
    normalising; no reviewed answer (a rejection) or no answer: wrong, and no field compared."""
    if not specs:
        right = text is not None and reviewed_text is not None and normalise_text(text) == normalise_text(reviewed_text)
        return Scored(version, state, None, right, confidence, ())
    if model is None or reviewed is None:
        return Scored(version, state, None, False, confidence, ())
    fields = score_fields(specs, model, reviewed, relative)
    kept = []
    for name, conf in (field_confidence or {}).items():
        if is_part(name):
            continue  # a list item's figure: calibrated through its field's (reviews compare fields)
        mine = [s for spec, s in zip(specs, fields) if spec.path == name or spec.path.startswith(name + ".")]
        if not mine:
            continue
        if sum(n for _, n in mine) == 0:  # neither side gives it (an empty list on both): kept as it was
            kept.append((conf, (model or {}).get(name) == (reviewed or {}).get(name)))
        else:
            kept.append((conf, all(r == n for r, n in mine)))
    return Scored(version, state, fields, all(r == n for r, n in fields), confidence, tuple(kept))


def answer_right(specs: list[FieldSpec], model: Any, reviewed: Any, relative: float,
                 text: str | None = None, reviewed_text: str | None = None) -> bool:
    """Whether an answer is right against the reviewed one: the one rule agreement, calibration
    and the gold comparison share, whoever gave the reviewed answer (a reviewer's edit or a
    gold answer)."""
    return score(specs, None, "", model, reviewed, relative, text=text, reviewed_text=reviewed_text).right


@dataclass(frozen=True)
class VersionCount:
    version: str | None
    results: int
    unreviewed: int
    newest: datetime | None  # its newest result's time


@dataclass(frozen=True)
class ScenarioReviews:
    """A scenario's reviewed answers, scored; and every adapter version's result counts, the
    version of the newest result first (a tie keeps the order of the versions' first results)."""

    specs: list[FieldSpec]
    versions: list[VersionCount]
    scored: list[Scored]  # reviewed results, oldest first


def scenario_reviews(session: Session, scenario: Scenario, version: str | None = None,
                     relative: float = 0.05) -> ScenarioReviews:
    """The scenario's reviewed answers scored (``version``, or a prefix of it, keeps that
    version's only); scored again only once its results changed (``memo``): the grouped counts
    read first are the key, with the newest review."""
    mine = [Analysis.scenario_id == scenario.id]
    if version:
        mine.append(Result.adapter_version.startswith(version, autoescape=True))
    counts = tuple(tuple(row) for row in session.execute(
        select(Result.adapter_version, func.count(), func.count().filter(Result.review_state == ReviewState.UNREVIEWED),
               func.max(Result.created_at), func.max(Result.id), func.sum(Result.review_version))
        .join(Analysis, Analysis.id == Result.analysis_id).where(*mine)
        .group_by(Result.adapter_version).order_by(func.min(Result.id))))
    key = ("reviews", str(session.get_bind().engine.url), scenario.id, repr(scenario.output_schema), version, relative,
           counts, session.scalar(select(func.max(Review.id))))
    return remembered(key, lambda: _read(session, scenario, mine, counts, relative))


def _read(session: Session, scenario: Scenario, mine: list, counts: tuple, relative: float) -> ScenarioReviews:
    """The reviewed results' ids and review versions (``ix_result_reviewed`` finds them without
    reading the rest); then only the answers not scored before at that review version, with
    their fields' confidences (a review after the page was drawn costs one answer, not all)."""
    versions = [VersionCount(v, n, waiting, newest)
                for v, n, waiting, newest, *_ in sorted(counts, key=lambda row: row[3], reverse=True)]
    reviewed = Result.review_state != ReviewState.UNREVIEWED
    specs = schema_fields(scenario.output_schema)
    prefix = ("scored", str(session.get_bind().engine.url), scenario.id, repr(scenario.output_schema), relative)
    wanted = [(*prefix, rid, rv) for rid, rv in session.execute(
        select(Result.id, Result.review_version).join(Analysis, Analysis.id == Result.analysis_id)
        .where(*mine, reviewed).order_by(Result.id))]
    found = kept_items(wanted)
    missing = [key[-2] for key in wanted if key not in found]
    fresh: dict[int, tuple[int, Scored]] = {}
    for start in range(0, len(missing), CHUNK) if len(missing) <= FEW else [0]:
        only = [Result.id.in_(missing[start:start + CHUNK])] if len(missing) <= FEW else []
        fresh.update(_score_rows(session, specs, [*mine, reviewed, *only], relative))
    keep_items({(*prefix, rid, rv): one for rid, (rv, one) in fresh.items()})
    # A review between the two reads: the answer as read the second time
    scored = [fresh[key[-2]][1] if key[-2] in fresh else found[key] for key in wanted if key in found or key[-2] in fresh]
    return ScenarioReviews(specs, versions, scored)


FEW = 5_000  # answers to score up to which they are read by id (in chunks), past it all at once
CHUNK = 1_000


def _score_rows(session: Session, specs: list[FieldSpec], where: list, relative: float) -> dict[int, tuple[int, Scored]]:
    """The answers ``where`` selects, scored: result id -> (its review version, its score). Their
    fields' confidences joined, not passed as an id list; the texts only for a free-text scenario."""
    by_field: dict[int, dict[str, float]] = {}
    for rid, name, conf in session.execute(
            select(ResultConfidence.result_id, ResultConfidence.field, ResultConfidence.confidence)
            .join(Result, Result.id == ResultConfidence.result_id).join(Analysis, Analysis.id == Result.analysis_id)
            .where(*where, Result.confidence.is_not(None))):
        by_field.setdefault(rid, {})[name] = conf
    texts = (Result.text, Result.edited_text) if not specs else (null(), null())
    out = {}
    for rid, rv, v, state, parsed, edited, conf, text, edited_text in session.execute(
            select(Result.id, Result.review_version, Result.adapter_version, Result.review_state, Result.parsed,
                   Result.edited_parsed, Result.confidence, *texts)
            .join(Analysis, Analysis.id == Result.analysis_id).where(*where)):
        if state == ReviewState.UNREVIEWED:
            continue  # sent back to the queue between the two reads
        reviewed_text = None if state == ReviewState.REJECTED else (edited_text if edited_text is not None else text)
        out[rid] = (rv, score(specs, v, state, parsed, reviewed_answer(state, parsed, edited), relative, conf,
                              by_field.get(rid), text, reviewed_text))
    return out
