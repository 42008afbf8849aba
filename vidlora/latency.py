"""Per-scenario latency over a window: P50 and P95 of upload-to-result time (the analysis row
was created when its video arrived; finished when the result was stored) and of engine time
(the engine's own seconds for the request), with the scenario's target (scenarios.yaml
``slo.p95_seconds``) met or missed. The scenarios page, ``vidlora status --latency`` and the
API show the same numbers.

Percentiles are computed in PostgreSQL (``percentile_cont``); on SQLite (the embedded demo)
the window's values are read and interpolated the same way in Python.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from vidlora.memo import remembered
from vidlora.lifecycle import AnalysisStatus
from vidlora.models import Analysis, Result, Scenario, utcnow

DEFAULT_WINDOW = timedelta(hours=24)


@dataclass(frozen=True)
class ScenarioLatency:
    scenario: str
    title: str
    count: int  # results finished in the window
    p50_total_s: float | None
    p95_total_s: float | None
    p50_engine_s: float | None
    p95_engine_s: float | None
    target_p95_s: float | None

    @property
    def target_met(self) -> bool | None:
        """None when there is no target or nothing finished in the window."""
        if self.target_p95_s is None or self.p95_total_s is None:
            return None
        return self.p95_total_s <= self.target_p95_s

    def as_dict(self) -> dict:
        return {**asdict(self), "target_met": self.target_met}


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks, as PostgreSQL's percentile_cont."""
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _total_seconds():
    return func.extract("epoch", Analysis.finished_at - Analysis.created_at)


def scenario_latency(session: Session, window: timedelta = DEFAULT_WINDOW,
                     now: datetime | None = None) -> list[ScenarioLatency]:
    """Every active scenario (and any with results in the window), by title."""
    scenarios = {s.id: s for s in session.scalars(select(Scenario))}
    if now is not None:
        stats = _stats(session, now - window)
    else:
        # Percentiles over every result of the window: 100k at a busy site, a tenth of a second
        # and more each time the Scenarios page is drawn. They change only when a result is
        # stored (or removed) and as the window slides: kept until then, a minute at most.
        results = tuple(session.execute(select(func.count(Result.id), func.max(Result.id))).one())
        minute = int(time.time() // KEPT_S)
        key = ("latency", str(session.get_bind().engine.url), window, results, minute)
        stats = remembered(key, lambda: _stats(session, utcnow() - window))
    out = []
    for sid, scenario in scenarios.items():
        if not scenario.active and sid not in stats:
            continue
        count, *numbers = stats.get(sid, (0, None, None, None, None))
        out.append(ScenarioLatency(scenario.name, scenario.title, int(count),
                                   *[float(n) if n is not None else None for n in numbers],
                                   scenario.latency_target_s))
    return sorted(out, key=lambda r: r.title)


KEPT_S = 60  # how stale the window's edge may be: results leaving it as it slides


def _stats(session: Session, since: datetime) -> dict[int, tuple]:
    """Per scenario id: (count, p50 total, p95 total, p50 engine, p95 engine) of the results
    finished since ``since``."""
    done = (Analysis.status == AnalysisStatus.DONE, Analysis.finished_at >= since)
    stats: dict[int, tuple] = {}
    if session.get_bind().dialect.name == "postgresql":
        total, engine = _total_seconds(), Result.latency_s
        rows = session.execute(
            select(Analysis.scenario_id, func.count(),
                   func.percentile_cont(0.5).within_group(total), func.percentile_cont(0.95).within_group(total),
                   func.percentile_cont(0.5).within_group(engine), func.percentile_cont(0.95).within_group(engine))
            .join(Result, Result.analysis_id == Analysis.id).where(*done).group_by(Analysis.scenario_id))
        stats = {sid: tuple(numbers) for sid, *numbers in rows}
    else:
        values: dict[int, tuple[list[float], list[float]]] = {}
        for sid, created, finished, engine in session.execute(
                select(Analysis.scenario_id, Analysis.created_at, Analysis.finished_at, Result.latency_s)
                .join(Result, Result.analysis_id == Analysis.id).where(*done)):
            totals, engines = values.setdefault(sid, ([], []))
            totals.append((finished - created).total_seconds())
            engines.append(engine)
        stats = {sid: (len(t), percentile(t, .5), percentile(t, .95), percentile(e, .5), percentile(e, .95))
                 for sid, (t, e) in values.items()}
    return stats


def parse_window(text: str) -> timedelta:
    """'90m', '24h', '7d' -> a timedelta (what the CLI and the page accept)."""
    text = text.strip().lower()
    units = {"m": 60, "h": 3600, "d": 86400}
    if len(text) < 2 or text[-1] not in units or not text[:-1].isdigit() or int(text[:-1]) < 1:
        raise ValueError("a window is a whole number with m, h or d: 90m, 24h, 7d")
    return timedelta(seconds=int(text[:-1]) * units[text[-1]])
