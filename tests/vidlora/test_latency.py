"""vidlora.latency: per-scenario P50/P95 over a window, the same on PostgreSQL and SQLite,
with the target met or missed."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.support.structured import seed_latencies as _seed
from vidlora.latency import parse_window, percentile, scenario_latency


def _row(rows, name):
    return next(r for r in rows if r.scenario == name)


def test_percentiles_per_scenario_in_the_window(database):
    from vidlora.db import session_scope

    name = _seed(old=3.0, target=60)
    with session_scope() as session:
        row = _row(scenario_latency(session, timedelta(hours=24)), name)
    # the 3-day-old result is outside the window; percentile_cont interpolates
    assert row.count == 5
    assert row.p50_total_s == pytest.approx(30) and row.p95_total_s == pytest.approx(88)
    assert row.p50_engine_s == pytest.approx(3) and row.p95_engine_s == pytest.approx(4.8)
    assert row.target_p95_s == 60 and row.target_met is False
    with session_scope() as session:
        wide = _row(scenario_latency(session, timedelta(days=7)), name)
    assert wide.count == 6 and wide.p95_total_s > 1000


def test_a_target_is_met_or_has_no_data(database):
    from vidlora.db import session_scope

    met = _seed(totals=(5, 6, 7), engines=(1, 1, 1), target=60)
    with session_scope() as session:
        assert _row(scenario_latency(session), met).target_met is True
        rows = scenario_latency(session, timedelta(seconds=1))
    assert _row(rows, met).count == 0 and _row(rows, met).target_met is None


def test_sqlite_gives_the_same_numbers(tmp_path):
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from vidlora.models import Base

    engine = create_engine(f"sqlite:///{tmp_path / 'latency.db'}")
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        name = _seed(session, old=3.0, target=60)
        row = _row(scenario_latency(session, timedelta(hours=24)), name)
    assert row.count == 5 and row.p50_total_s == pytest.approx(30) and row.p95_total_s == pytest.approx(88)
    assert row.p95_engine_s == pytest.approx(4.8) and row.target_met is False


def test_percentile_and_windows():
    assert percentile([], 0.5) is None and percentile([3.0], 0.95) == 3.0
    assert percentile([1, 2, 3, 4], 0.5) == 2.5
    assert parse_window("90m") == timedelta(minutes=90) and parse_window("7d") == timedelta(days=7)
    for bad in ("", "h", "0h", "5w", "-1h", "1.5h"):
        with pytest.raises(ValueError):
            parse_window(bad)

