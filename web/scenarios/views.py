from __future__ import annotations

from flask import render_template
from sqlalchemy import select

from vidlora.models import Scenario
from web.database import get_db
from web.scenarios import bp
from web.scenarios.health import holders, worker_health


@bp.get("/")
def index():
    session = get_db()
    scenarios = session.scalars(select(Scenario).order_by(Scenario.active.desc(), Scenario.title)).all()
    workers = worker_health(session)
    return render_template("scenarios/index.html", scenarios=scenarios, workers=workers, holders=holders(workers))


@bp.get("/workers")
def workers():
    return render_template("scenarios/workers.html", workers=worker_health(get_db()))
