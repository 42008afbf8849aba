"""Agreement per adapter version of one scenario, read from its stored results and reviews."""

from __future__ import annotations

import copy

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from vidlora.feedback.agreement import Agreement, Reviewed, agreement
from vidlora.feedback.memo import remembered
from vidlora.lifecycle import ReviewState
from vidlora.models import Analysis, Result, Scenario
from vidlora.results.fields import schema_fields


class EvalError(ValueError):
    pass


def scenario_or_error(session: Session, name: str) -> Scenario:
    scenario = session.scalar(select(Scenario).where(Scenario.name == name))
    if scenario is None:
        raise EvalError(f"There is no scenario {name!r}.")
    return scenario


def reviewed_answer(review_state: str, parsed, edited_parsed):
    """The answer a review left: the edit, or the model's own when approved unchanged; None
    for a rejected or unreviewed result."""
    if review_state == ReviewState.EDITED:
        return edited_parsed
    if review_state == ReviewState.APPROVED:
        return edited_parsed if edited_parsed is not None else parsed
    return None


def reviewed_row(result: Result) -> Reviewed:
    """A result as agreement reads it: the model's answer and the one the review left."""
    return Reviewed(result.review_state, result.parsed,
                    reviewed_answer(result.review_state, result.parsed, result.edited_parsed))


def scenario_agreement(session: Session, scenario: Scenario, version: str | None = None,
                       relative: float = 0.05) -> list[Agreement]:
    """One ``Agreement`` per adapter version that made results of the scenario, the version
    with the newest result first; ``version`` (or a prefix of it) keeps that one only.
    Computed again only once the scenario's results changed (``memo``)."""
    kept = remembered(session, scenario, ("agreement", version, relative),
                      lambda: _scenario_agreement(session, scenario, version, relative))
    return copy.deepcopy(kept)


def _scenario_agreement(session: Session, scenario: Scenario, version: str | None,
                        relative: float) -> list[Agreement]:
    """The counts per version come from one grouped query; only reviewed results' answers are read
    (a tenth of them at 100k results: reading every answer made the Scenarios page take
    seconds, issue 58)."""
    mine = [Analysis.scenario_id == scenario.id]
    if version:
        mine.append(Result.adapter_version.startswith(version, autoescape=True))
    unreviewed = Result.review_state == ReviewState.UNREVIEWED
    counts = session.execute(
        select(Result.adapter_version, func.count(), func.count().filter(unreviewed), func.max(Result.created_at))
        .join(Analysis, Analysis.id == Result.analysis_id).where(*mine)
        .group_by(Result.adapter_version).order_by(func.min(Result.id))).all()
    by_version: dict[str | None, list[Reviewed]] = {v: [] for v, *_ in counts}
    reviewed = (select(Result.adapter_version, Result.review_state, Result.parsed, Result.edited_parsed)
                .join(Analysis, Analysis.id == Result.analysis_id).where(*mine, ~unreviewed).order_by(Result.id))
    for v, state, parsed, edited in session.execute(reviewed):
        by_version[v].append(Reviewed(state, parsed, reviewed_answer(state, parsed, edited)))
    specs = schema_fields(scenario.output_schema)
    out = []
    # the newest result's version first; a tie keeps the order of the versions' first results
    for v, _n, waiting, _newest in sorted(counts, key=lambda row: row[3], reverse=True):
        report = agreement(v, by_version[v], specs, relative)
        report.results += waiting
        report.unreviewed += waiting
        out.append(report)
    return out
