"""Shared by the engine pipeline tests: every analysis of a batch with its scenario,
result (or None) and frame set, read straight from the database."""

from __future__ import annotations

from sqlalchemy import select


def batch_rows(batch_id: int):
    from vidlora.db import session_scope
    from vidlora.models import Analysis, Result, Scenario

    with session_scope() as session:
        rows = session.execute(
            select(Analysis, Scenario, Result)
            .join(Scenario, Scenario.id == Analysis.scenario_id)
            .outerjoin(Result, Result.analysis_id == Analysis.id)
            .where(Analysis.batch_id == batch_id)
        ).all()
        return [(a, s, r, a.frame_set) for a, s, r in rows]
