"""What the Scenarios page shows per scenario from its reviewed answers: agreement and
calibration per adapter version, the newest versions first.

One function for the page and for the start-up warm-up (``web.scenarios.warm``), so both ask
for the same figures under the same keys: what the warm-up computed is what the page finds kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from vidlora.feedback.calibration import Calibration, calibrations
from vidlora.feedback.measure import agreements
from vidlora.feedback.scores import scenario_reviews
from vidlora.models import Scenario

# Adapter versions shown side by side per scenario: the serving one and those before it.
VERSIONS_SHOWN = 3


@dataclass(frozen=True)
class Measures:
    agreement: dict[int, list[Any]]  # scenario id -> its versions' agreement
    calibration: dict[int, list[Calibration]]


def scenario_measures(session: Session, scenarios: list[Scenario], tolerance: float, minimum: int) -> Measures:
    """Each scenario's reviewed answers read and scored once for both measures (kept until its
    results change: ``vidlora.memo``)."""
    reviews = {s.id: scenario_reviews(session, s, None, tolerance) for s in scenarios}
    return Measures(
        agreement={s.id: agreements(reviews[s.id])[:VERSIONS_SHOWN] for s in scenarios},
        calibration={s.id: calibrations(session, s, reviews[s.id], None, tolerance, minimum)[:VERSIONS_SHOWN]
                     for s in scenarios})
