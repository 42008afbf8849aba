"""Agreement per adapter version of one scenario, read from its stored results and reviews."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from vidlora.feedback.agreement import Agreement, agreement
from vidlora.feedback.scores import ScenarioReviews, scenario_reviews
from vidlora.models import Scenario


class EvalError(ValueError):
    pass


def scenario_or_error(session: Session, name: str) -> Scenario:
    scenario = session.scalar(select(Scenario).where(Scenario.name == name))
    if scenario is None:
        raise EvalError(f"There is no scenario {name!r}.")
    return scenario


def scenario_agreement(session: Session, scenario: Scenario, version: str | None = None,
                       relative: float = 0.05) -> list[Agreement]:
    """One ``Agreement`` per adapter version that made results of the scenario, the version
    with the newest result first; ``version`` (or a prefix of it) keeps that one only."""
    return agreements(scenario_reviews(session, scenario, version, relative))


def agreements(reviews: ScenarioReviews) -> list[Agreement]:
    """Per version, from the scored reviewed answers and the grouped counts (only reviewed
    answers are read: a tenth of them at 100k results, issue 58)."""
    by_version: dict[str | None, list] = {v.version: [] for v in reviews.versions}
    for row in reviews.scored:
        by_version[row.version].append(row)
    out = []
    for v in reviews.versions:
        report = agreement(v.version, by_version[v.version], reviews.specs)
        report.results += v.unreviewed
        report.unreviewed += v.unreviewed
        out.append(report)
    return out
