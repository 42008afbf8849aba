from __future__ import annotations

from datetime import timedelta

from vidlora.db import session_scope
from vidlora.models import Worker, utcnow
from web.scenarios.health import classify


def test_scenarios_page(logged_in_client, make_worker):
    make_worker("gpu-page-test", ["artifact_identification", "murals_inscriptions"])
    html = logged_in_client.get("/scenarios/").get_data(as_text=True)
    assert 'data-testid="scenario-card-artifact_identification"' in html
    assert "List every artifact visible in this video." in html  # the prompt
    assert "You are an archaeologist cataloguing finds" in html  # the system prompt
    holders = html.split('data-testid="holders-artifact_identification">')[1].split("</dd>")[0]
    assert "gpu-page-test" in holders
    assert 'data-worker="gpu-page-test" data-health="ok"' in html
    assert "NVIDIA H200" in html and "vllm" in html and "0.11" in html


def test_workers_page(logged_in_client, make_worker):
    make_worker("gpu-stale-test", ["tomb_structure"], age_s=3600)
    html = logged_in_client.get("/scenarios/workers").get_data(as_text=True)
    assert 'data-worker="gpu-stale-test" data-health="stale"' in html
    assert "1 h ago" in html or "60 min ago" in html


def test_worker_health_classification():
    now = utcnow()
    make = lambda status, age: Worker(name="w", queue="q", status=status, heartbeat_at=now - timedelta(seconds=age))  # noqa: E731
    assert classify(make("ready", 1), now, 15).health == "ok"
    assert classify(make("ready", 60), now, 15).health == "stale"
    assert classify(make("starting", 1), now, 15).health == "starting"
    assert classify(make("stopped", 1), now, 15).health == "stopped"


def test_stale_worker_does_not_count_as_holder(logged_in_client, make_worker):
    make_worker("gpu-gone-test", ["murals_inscriptions"], age_s=7200)
    html = logged_in_client.get("/scenarios/").get_data(as_text=True)
    holders = html.split('data-testid="holders-murals_inscriptions">')[1].split("</dd>")[0]
    assert "gpu-gone-test" not in holders
    with session_scope() as session:
        assert session.query(Worker).filter(Worker.name == "gpu-gone-test").count() == 1


def test_refused_adapter_shows_unavailable_with_its_reason(logged_in_client):
    from sqlalchemy import select

    from vidlora.models import Scenario
    from vidlora.scenarios import record_registrations

    reason = "module model.visual.blocks.0.attn.qkv: vision-tower LoRA, but the engine serves no tower LoRA <b>"
    with session_scope() as session:
        row = session.scalar(select(Scenario).where(Scenario.name == "tomb_structure"))
        path, before = row.adapter_path, (row.adapter_status, row.adapter_reason, row.adapter_digest)
        assert record_registrations(session, {"tomb_structure": {
            "ok": False, "reason": reason, "digest": None, "source": path}}) == 1
    try:
        html = logged_in_client.get("/scenarios/").get_data(as_text=True)
        assert 'data-testid="unavailable-tomb_structure"' in html
        refusal = html.split('data-testid="refusal-tomb_structure">')[1].split("</p>")[0]
        assert "vision-tower LoRA" in refusal and "&lt;b&gt;" in refusal  # the reason, escaped
        assert 'data-testid="unavailable-artifact_identification"' not in html
        api = logged_in_client.get("/api/v1/scenarios").get_json()["scenarios"]
        tomb = next(s for s in api if s["name"] == "tomb_structure")
        assert tomb["available"] is False and tomb["adapter_status"] == "refused" and tomb["adapter_reason"] == reason
    finally:
        with session_scope() as session:
            row = session.scalar(select(Scenario).where(Scenario.name == "tomb_structure"))
            row.adapter_status, row.adapter_reason, row.adapter_digest = before


def test_settings_and_workers_read_as_words(logged_in_client, make_worker):
    """Issue 19: no raw dumps: sampling in words for its mode, versions in a line, the canary's age."""
    import time

    from vidlora.db import session_scope
    from vidlora.models import Worker

    make_worker("gpu-words", ["tomb_structure"])
    with session_scope() as session:
        worker = session.query(Worker).filter(Worker.name == "gpu-words").one()
        worker.versions = {"vllm": "0.32.0", "torch": "2.10.0", "ptxas": None}
        worker.last_canary = {"ok": True, "latency_s": 0.4, "at": time.time() - 120}
    html = logged_in_client.get("/scenarios/").get_data(as_text=True)
    assert "8 frames spread evenly over the video, at most 50,176 pixels each" in html
    assert "2 frames a second, 4 to 8 frames, at most 50,176 pixels each" in html
    assert "num_frames=" not in html and "min_frames" not in html
    row = html.split('data-worker="gpu-words"')[1].split("</tr>")[0]
    assert "vLLM 0.32.0 · torch 2.10.0" in row
    assert 'data-testid="worker-canary">healthy, 2 min ago<' in row and "1796" not in row


def test_the_scenarios_page_shows_latency_and_targets(logged_in_client):
    from tests.support.structured import seed_latencies

    name = seed_latencies(target=60)
    html = logged_in_client.get("/scenarios/?window=7d").get_data(as_text=True)
    row = html.split(f'data-scenario="{name}"')[1].split("</tr>")[0]
    assert 'data-count="5" data-target-met="false"' in row and "missed" in row and "1:28" in row  # P95 88 s
    assert "Latency, last 7d" in html
    assert "Latency, last 24h" in logged_in_client.get("/scenarios/?window=forever").get_data(as_text=True)


def test_a_streaming_workers_engine_reads_in_words(logged_in_client, make_worker):
    from vidlora.models import Worker

    make_worker("gpu-stream-words", ["tomb_structure"])
    with session_scope() as session:
        worker = session.query(Worker).filter(Worker.name == "gpu-stream-words").one()
        worker.stream = {"capacity": 64, "held": 2, "in_flight": {"tomb_structure": 2}, "mean_admission_wait_s": 0.0,
                         "tokens_per_s": 88.0}
    html = logged_in_client.get("/scenarios/").get_data(as_text=True)
    row = html.split('data-worker="gpu-stream-words"')[1].split("</tr>")[0]
    assert ('data-testid="worker-stream">2 in flight of 64 (tomb_structure 2); nothing waiting; '
            "admitted after 0.0 s on average; 88 output tokens/s<") in row
