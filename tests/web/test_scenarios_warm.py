"""web.scenarios.warm: a web process scores the scenarios' reviewed answers as it starts, so
the first Scenarios view after a deploy or restart finds its measures ready."""

import logging
import time

import pytest
from sqlalchemy import create_engine

from tests.support.reads import answers_read
from tests.support.structured import seed_structured
from tests.support.web import login
from vidlora.config import reset_settings
from vidlora.memo import forget

ANSWER = {"sealed": True, "finds": [{"material": "bronze", "period": "han", "confidence": 0.8}]}
SURE = {"sealed": 0.95, "finds": 0.9}


@pytest.fixture()
def warming(monkeypatch):
    monkeypatch.setenv("VIDLORA_WARM_MEASURES_ON_START", "true")
    reset_settings()
    forget()  # a process that has just started keeps nothing
    yield
    monkeypatch.delenv("VIDLORA_WARM_MEASURES_ON_START", raising=False)
    reset_settings()


def _started_app():
    from web import create_app

    app = create_app({"TESTING": True, "SECRET_KEY": "test-secret-key"})
    thread = app.extensions["vidlora_warm_measures"]
    thread.join(timeout=60)
    assert not thread.is_alive()
    return app


def test_the_first_scenarios_view_after_start_reads_no_answer(database, reviewer, warming):
    seeded = seed_structured([ANSWER] * 3, review_states=["approved", "rejected", "unreviewed"],
                             confidences=[SURE] * 3)
    client = _started_app().test_client()
    login(client, reviewer)
    with answers_read() as reads:
        page = client.get("/scenarios/")
    assert page.status_code == 200 and seeded.scenario in page.get_data(as_text=True)
    assert not _of(seeded, reads)  # scored at start, not on the reviewer's first view
    with answers_read() as reads:  # a later review is still counted at once
        from web.review.actions import apply_review
        from vidlora.db import session_scope
        from vidlora.models import Result

        with session_scope() as session:
            apply_review(session, session.get(Result, seeded.result_ids[2]), "approve", None, version=0)
        client.get("/scenarios/")
    assert _of(seeded, reads)


def _of(seeded, reads) -> list:
    """The reads of this scenario's answers (other tests' scenarios may have gold sets, which
    the page reads each time)."""
    from sqlalchemy import select

    from vidlora.db import session_scope
    from vidlora.models import Scenario

    with session_scope() as session:
        mine = session.scalar(select(Scenario.id).where(Scenario.name == seeded.scenario))
    return [(sql, params) for sql, params in reads if mine in (params or {}).values()]


def test_without_it_the_first_view_scores_the_answers(database, reviewer):
    """The setting off (as in the rest of the tests): the view computes on its own."""
    from web import create_app

    seeded = seed_structured([ANSWER] * 2, review_states=["approved", "rejected"], confidences=[SURE] * 2)
    forget()
    app = create_app({"TESTING": True, "SECRET_KEY": "test-secret-key"})
    assert app.extensions["vidlora_warm_measures"] is None
    client = app.test_client()
    login(client, reviewer)
    with answers_read() as reads:
        assert client.get("/scenarios/").status_code == 200
    assert _of(seeded, reads)


def test_a_database_not_reachable_at_start_is_logged_and_the_app_serves(database, reviewer, warming, monkeypatch,
                                                                        caplog):
    import web.scenarios.warm as warm

    closed = create_engine("postgresql+psycopg://postgres@127.0.0.1:9/none", connect_args={"connect_timeout": 2})
    with monkeypatch.context() as patch, caplog.at_level(logging.WARNING, logger="web.scenarios.warm"):
        patch.setattr(warm, "get_engine", lambda: closed)
        client = _started_app().test_client()
    assert "not warmed at start" in caplog.text and "first Scenarios view computes them" in caplog.text
    login(client, reviewer)
    assert client.get("/scenarios/").status_code == 200


def test_vidlora_web_warms_in_each_worker_and_serves(database, tmp_path):
    """`vidlora web` builds the app before gunicorn forks its workers: warming there would hand
    the workers a half-imported database driver (every page 5xx, /healthz 503). Each worker
    warms after the fork instead, and serves."""
    import json
    import urllib.request

    from tests.support.web_server import WebServer

    seed_structured([ANSWER] * 2, review_states=["approved", "rejected"], confidences=[SURE] * 2)
    server = WebServer(tmp_path / "web.log", extra_env={"VIDLORA_WARM_MEASURES_ON_START": "true"})
    try:
        with urllib.request.urlopen(server.url + "/healthz", timeout=10) as response:
            assert json.load(response)["database"] == "ok"
        time.sleep(1)  # the worker's warm-up has long finished on two rows
        assert "not warmed" not in server.log(200), server.log()
    finally:
        server.stop()
