from __future__ import annotations

from flask import abort, render_template, request
from sqlalchemy import select

from vidlora.config import get_settings
from vidlora.feedback.gate import check
from vidlora.feedback.gold import gold_count, gold_results
from vidlora.feedback.releases import releases
from vidlora.latency import parse_window, scenario_latency
from vidlora.models import Scenario
from web.database import get_db
from web.scenarios import bp
from web.scenarios.health import holders, worker_health
from web.scenarios.measures import scenario_measures


WINDOWS = ("1h", "24h", "7d", "30d")


@bp.get("/")
def index():
    session = get_db()
    scenarios = session.scalars(select(Scenario).order_by(Scenario.active.desc(), Scenario.title)).all()
    workers = worker_health(session)
    window = request.args.get("window", "24h")
    if window not in WINDOWS:
        window = "24h"
    tolerance = get_settings().eval_number_tolerance
    minimum = get_settings().calibration_min_answers
    measures = scenario_measures(session, scenarios, tolerance, minimum)
    gold = {s.id: gold_count(session, s.id) for s in scenarios}
    # Each candidate version beside the stored answers on the gold set, once it has answered it,
    # and whether promote would serve it (vidlora.feedback.gate).
    candidates = {s.id: [(r, *check(session, s, r, tolerance))
                         for r in releases(session, s) if r.status == "candidate"] for s in scenarios}
    return render_template("scenarios/index.html", scenarios=scenarios, workers=workers, holders=holders(workers),
                           latency=scenario_latency(session, parse_window(window)), window=window, windows=WINDOWS,
                           agreement=measures.agreement, calibration=measures.calibration, gold=gold, config_tolerance=tolerance,
                           candidates=candidates)


@bp.get("/<name>/gold")
def gold_set(name: str):
    session = get_db()
    scenario = session.scalar(select(Scenario).where(Scenario.name == name))
    if scenario is None:
        abort(404, f"There is no scenario {name!r}.")
    return render_template("scenarios/gold.html", scenario=scenario, results=gold_results(session, scenario.id))


@bp.get("/workers")
def workers():
    return render_template("scenarios/workers.html", workers=worker_health(get_db()))
