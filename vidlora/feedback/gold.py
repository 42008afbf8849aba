"""The gold set: reviewed results a team holds out of training and tests each new adapter
version on. Only a reviewed answer can be gold (approved, or edited: the answer that stood);
a rejected result has none."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from vidlora.lifecycle import ReviewState
from vidlora.models import Analysis, Result, utcnow

GOLD_STATES = (ReviewState.APPROVED, ReviewState.EDITED)


class GoldError(ValueError):
    pass


def set_gold(result: Result, gold: bool, user_id: int | None) -> None:
    if gold and result.review_state not in GOLD_STATES:
        raise GoldError("Only an approved or edited result can be gold: review it first.")
    if gold and result.gold_at is None:
        result.gold_at, result.gold_by = utcnow(), user_id
    elif not gold:
        result.gold_at, result.gold_by = None, None


def _gold(scenario_id: int, what=Result):
    return (select(what).join(Analysis, Analysis.id == Result.analysis_id)
            .where(Analysis.scenario_id == scenario_id, Result.gold_at.is_not(None),
                   Result.review_state.in_([s.value for s in GOLD_STATES])))


def gold_count(session: Session, scenario_id: int) -> int:
    return session.scalar(_gold(scenario_id, func.count(Result.id))) or 0


def gold_results(session: Session, scenario_id: int) -> list[Result]:
    """The scenario's gold results, oldest first. A gold result whose review later changed to
    rejected (or back to unreviewed) is left out: it no longer has an answer to test against."""
    return list(session.scalars(_gold(scenario_id).order_by(Result.id)))
