"""Agreement per adapter version of one scenario, read from its stored results and reviews."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from vidlora.feedback.agreement import Agreement, Reviewed, agreement
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
    with the newest result first; ``version`` (or a prefix of it) keeps that one only. Reads
    the four columns it needs, not whole results (the Scenarios page runs it per scenario)."""
    stmt = (select(Result.adapter_version, Result.review_state, Result.parsed, Result.edited_parsed,
                   Result.created_at)
            .join(Analysis, Analysis.id == Result.analysis_id).where(Analysis.scenario_id == scenario.id))
    if version:
        stmt = stmt.where(Result.adapter_version.startswith(version, autoescape=True))
    by_version: dict[str | None, list[Reviewed]] = {}
    newest: dict[str | None, object] = {}
    for v, state, parsed, edited, created in session.execute(stmt.order_by(Result.id)):
        by_version.setdefault(v, []).append(Reviewed(state, parsed, reviewed_answer(state, parsed, edited)))
        newest[v] = max(newest.get(v, created), created)
    specs = schema_fields(scenario.output_schema)
    order = sorted(by_version, key=lambda v: newest[v], reverse=True)
    return [agreement(v, by_version[v], specs, relative) for v in order]
