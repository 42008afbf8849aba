from __future__ import annotations

from flask import render_template, request
from sqlalchemy import select

from vidlora.latency import parse_window, scenario_latency
from vidlora.models import Scenario
from web.database import get_db
from web.scenarios import bp
from web.scenarios.health import holders, worker_health


WINDOWS = ("1h", "24h", "7d", "30d")


@bp.get("/")
def index():
    session = get_db()
    scenarios = session.scalars(select(Scenario).order_by(Scenario.active.desc(), Scenario.title)).all()
    workers = worker_health(session)
    window = request.args.get("window", "24h")
    if window not in WINDOWS:
        window = "24h"
    return render_template("scenarios/index.html", scenarios=scenarios, workers=workers, holders=holders(workers),
                           latency=scenario_latency(session, parse_window(window)), window=window, windows=WINDOWS)


@bp.get("/workers")
def workers():
    return render_template("scenarios/workers.html", workers=worker_health(get_db()))
