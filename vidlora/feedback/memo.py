"""The Scenarios page's measures per scenario, kept between page views until its results change.

Agreement and calibration score every reviewed answer of a scenario in Python: seconds at
100k results (issue 58), for numbers that only move when a result is stored or reviewed. Each
is kept in this process under a fingerprint of the scenario's results, read in one grouped
query: how many there are, the newest id, the sum of their review versions (every review
action but a note moves one on: ``web.review.actions``) and the newest review. A result's
answer, confidence and adapter version are written once, when it is stored; so any change the
measures could see changes the fingerprint, and the next view computes afresh.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from vidlora.models import Analysis, Result, Review, Scenario

KEPT = 64  # measures kept, the least recently used dropped first
T = TypeVar("T")
_kept: OrderedDict[tuple, Any] = OrderedDict()
_lock = threading.Lock()


def fingerprint(session: Session, scenario: Scenario) -> tuple:
    results = session.execute(
        select(func.count(Result.id), func.max(Result.id), func.sum(Result.review_version))
        .join(Analysis, Analysis.id == Result.analysis_id).where(Analysis.scenario_id == scenario.id)).one()
    return (str(session.get_bind().engine.url), scenario.id, repr(scenario.output_schema), *results,
            session.scalar(select(func.max(Review.id))))


def remembered(session: Session, scenario: Scenario, what: tuple, compute: Callable[[], T]) -> T:
    """``compute()``, or what it gave for ``what`` on this scenario while its results were as now."""
    key = (*fingerprint(session, scenario), *what)
    with _lock:
        if key in _kept:
            _kept.move_to_end(key)
            return _kept[key]
    value = compute()
    with _lock:
        _kept[key] = value
        while len(_kept) > KEPT:
            _kept.popitem(last=False)
    return value


def forget() -> None:
    with _lock:
        _kept.clear()
