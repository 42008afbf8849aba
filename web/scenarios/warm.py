"""The Scenarios page's measures computed as a web process starts, off the request path.

At 100k results the page's first view scores each scenario's reviewed answers (about half a
second per 10,000 on a server core, issue 58); every later view finds them kept in the process
(``vidlora.memo``) and a review costs only the answers it changed. Each gunicorn worker is its
own process with its own kept figures, so each warms itself once, in a daemon thread: the
first reviewer after a deploy or restart no longer pays for it. A failure (the database not
reachable yet, not migrated) is logged and left to the first view, which computes as before.
"""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from vidlora.config import get_settings
from vidlora.db import get_engine
from vidlora.models import Scenario
from web.scenarios.measures import scenario_measures

log = logging.getLogger(__name__)


def warm_in_background() -> threading.Thread | None:
    """Start warming (``warm_measures_on_start``); the thread, or None when it is off."""
    if not get_settings().warm_measures_on_start:
        return None
    thread = threading.Thread(target=warm, name="vidlora-warm-measures", daemon=True)
    thread.start()
    return thread


def warm() -> float | None:
    """Every scenario's measures computed as the page asks for them, and the calibration maps
    with their held-out error (what the page draws); seconds taken, None where it failed."""
    settings = get_settings()
    t0 = time.perf_counter()
    try:
        with Session(get_engine()) as session:
            scenarios = list(session.scalars(select(Scenario)))
            measures = scenario_measures(session, scenarios, settings.eval_number_tolerance,
                                         settings.calibration_min_answers)
            for versions in measures.calibration.values():
                for calibration in versions:
                    calibration.as_dict()
    except Exception as exc:  # the first view computes them instead: nothing is lost
        log.warning("scenario measures not warmed at start (%s: %s); the first Scenarios view computes them",
                    type(exc).__name__, exc)
        return None
    took = time.perf_counter() - t0
    log.info("scenario measures of %d scenario(s) warmed in %.0f ms", len(scenarios), took * 1000)
    return took
