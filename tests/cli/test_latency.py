"""`vidlora status --latency`: each scenario's P50/P95 and target, as an operator reads it."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import vidlora
from tests.support.structured import seed_latencies


def test_status_latency_as_json_and_text(database):
    name = seed_latencies(target=60)
    out = vidlora("status", "--latency", "--window", "7d", "--json")
    assert out.returncode == 0, out.stderr
    [entry] = [s for s in json.loads(out.stdout)["scenarios"] if s["scenario"] == name]
    assert entry["count"] == 5 and entry["p95_total_s"] == pytest.approx(88) and entry["target_met"] is False
    text = vidlora("status", "--latency").stdout
    assert name in text and "60 s MISSED" in text
    bad = vidlora("status", "--latency", "--window", "soon")
    assert bad.returncode == 2 and "90m, 24h, 7d" in bad.stderr
