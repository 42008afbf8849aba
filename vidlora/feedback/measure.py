"""Agreement per adapter version of one scenario, read from its stored results and reviews."""

from __future__ import annotations

from sqlalchemy import func, select
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


def reviewed_row(result: Result) -> Reviewed:
    """A result as agreement reads it: the model's answer and the one the review left."""
    if result.review_state == ReviewState.EDITED:
        reviewed = result.edited_parsed
    elif result.review_state == ReviewState.APPROVED:
        reviewed = result.edited_parsed if result.edited_parsed is not None else result.parsed
    else:
        reviewed = None
    return Reviewed(result.review_state, result.parsed, reviewed)


def scenario_agreement(session: Session, scenario: Scenario, version: str | None = None,
                       relative: float = 0.05) -> list[Agreement]:
    """One ``Agreement`` per adapter version that made results of the scenario, the version
    with the newest result first; ``version`` (or a prefix of it) keeps that one only."""
    stmt = (select(Result).join(Analysis, Analysis.id == Result.analysis_id)
            .where(Analysis.scenario_id == scenario.id))
    if version:
        stmt = stmt.where(Result.adapter_version.startswith(version, autoescape=True))
    newest = {v: t for v, t in session.execute(
        select(Result.adapter_version, func.max(Result.created_at)).join(Analysis, Analysis.id == Result.analysis_id)
        .where(Analysis.scenario_id == scenario.id).group_by(Result.adapter_version))}
    by_version: dict[str | None, list[Reviewed]] = {}
    for result in session.scalars(stmt.order_by(Result.id)):
        by_version.setdefault(result.adapter_version, []).append(reviewed_row(result))
    specs = schema_fields(scenario.output_schema)
    order = sorted(by_version, key=lambda v: newest.get(v), reverse=True)
    return [agreement(v, by_version[v], specs, relative) for v in order]
