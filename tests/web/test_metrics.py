"""The web app's /metrics: state read at scrape time from PostgreSQL and Redis (issue 17)."""

from __future__ import annotations

import uuid

from prometheus_client.parser import text_string_to_metric_families


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_show_analyses_by_status_and_queue_depth(client, factory, broker, monkeypatch):
    import redis

    from vidlora.config import get_settings

    monkeypatch.setattr(get_settings(), "metrics_public", True)  # the operator opened it
    before = _samples(client.get("/metrics").get_data(as_text=True))
    factory.batch({"artifact_identification": "x", "tomb_structure": None}, statuses={"tomb_structure": "queued"})
    queue = f"gpu.metrics-{uuid.uuid4().hex[:6]}"
    r = redis.Redis.from_url(get_settings().broker_url)
    r.rpush(queue, "a", "b", "c")
    try:
        response = client.get("/metrics")  # no session: Prometheus scrapes without one
        assert response.status_code == 200 and response.mimetype == "text/plain"
        after = _samples(response.get_data(as_text=True))
    finally:
        r.delete(queue)
    key = lambda scenario, status: ("vidlora_analyses", (("scenario", scenario), ("status", status)))  # noqa: E731
    assert after[key("artifact_identification", "done")] == before.get(key("artifact_identification", "done"), 0) + 1
    assert after[key("tomb_structure", "queued")] == before.get(key("tomb_structure", "queued"), 0) + 1
    assert after[("vidlora_queue_depth", (("queue", queue),))] == 3
    assert ("vidlora_queue_depth", (("queue", "cpu"),)) in after


def test_metrics_token_when_set(client, database, monkeypatch):
    from vidlora.config import get_settings

    monkeypatch.setattr(get_settings(), "metrics_token", "scrape-secret")
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer scrape-secret"}).status_code == 200


def test_metrics_are_closed_by_default(client, database):
    """Issue 32: /metrics showed scenario names, counts and worker states to anyone."""
    response = client.get("/metrics")
    assert response.status_code == 403 and "VIDLORA_METRICS_TOKEN" in response.get_data(as_text=True)
