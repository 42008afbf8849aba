"""vidlora.scenarios: the YAML file is validated, synced by name, never deletes history."""

from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from vidlora.scenarios import ScenarioError, load_scenarios, sync_scenarios

from tests.support.env import ROOT


def write(tmp_path, scenarios):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"scenarios": scenarios}))
    return path


def test_shipped_file_declares_the_three_archaeology_scenarios():
    specs = load_scenarios(ROOT / "scenarios.yaml", Path("/adapters"))
    assert [s.name for s in specs] == ["artifact_identification", "tomb_structure", "murals_inscriptions"]
    assert all(s.adapter_path.startswith("/adapters/") for s in specs)
    assert specs[1].sampling["mode"] == "fps"
    assert [s.latency_target_s for s in specs] == [900.0] * 3


@pytest.mark.parametrize("entry, message", [
    ({"name": "x y", "prompt": "p"}, "scenario name"),
    ({"name": "x"}, "prompt is required"),
    ({"name": "x", "prompt": "p", "sampling": {"mode": "bogus"}}, "bad sampling policy"),
    ({"name": "x", "prompt": "p", "generation": {"beams": 4}}, "unknown generation keys"),
    ({"name": "x", "prompt": "p", "generation": {"max_tokens": 0}}, "max_tokens"),
    ({"name": "x", "prompt": "p", "slo": {"p95_seconds": 0}}, "positive number"),
    ({"name": "x", "prompt": "p", "slo": {"p95_seconds": "fast"}}, "positive number"),
    ({"name": "x", "prompt": "p", "slo": {"p50_seconds": 5}}, "p95_seconds only"),
])
def test_invalid_entries_are_refused_with_a_clear_message(tmp_path, entry, message):
    with pytest.raises(ScenarioError, match=message):
        load_scenarios(write(tmp_path, [entry]), tmp_path)


def test_duplicate_names_and_empty_files_are_refused(tmp_path):
    with pytest.raises(ScenarioError, match="duplicate"):
        load_scenarios(write(tmp_path, [{"name": "a", "prompt": "p"}] * 2), tmp_path)
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(ScenarioError, match="non-empty"):
        load_scenarios(tmp_path / "empty.yaml", tmp_path)


def test_sync_updates_by_name_and_deactivates_removed_scenarios(db_session, tmp_path):
    from vidlora.models import Scenario

    adapter = tmp_path / "ad"
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"weights-1")
    first = load_scenarios(write(tmp_path, [
        {"name": "zz_keep", "prompt": "one", "adapter": str(adapter)},
        {"name": "zz_drop", "prompt": "two"},
    ]), tmp_path)
    ids = sync_scenarios(db_session, first)
    keep = db_session.get(Scenario, ids["zz_keep"])
    version = keep.adapter_version
    assert version and len(version) == 16
    (adapter / "adapter_model.safetensors").write_bytes(b"weights-2")
    second = load_scenarios(write(tmp_path, [{"name": "zz_keep", "prompt": "changed", "adapter": str(adapter)}]), tmp_path)
    ids2 = sync_scenarios(db_session, second)
    assert ids2["zz_keep"] == ids["zz_keep"]
    assert keep.prompt == "changed" and keep.adapter_version != version
    dropped = db_session.scalar(select(Scenario).where(Scenario.name == "zz_drop"))
    assert dropped is not None and dropped.active is False



def test_sync_reads_adapter_weights_only_when_their_files_change(db_session, tmp_path, monkeypatch):
    """Every `vidlora enqueue` syncs the scenarios; twenty 27B adapters must not be re-read
    each time. Unchanged names, sizes and mtimes keep the recorded version."""
    import os

    from vidlora import scenarios
    from vidlora.models import Scenario

    adapter = tmp_path / "ad"
    adapter.mkdir()
    weights = adapter / "adapter_model.safetensors"
    weights.write_bytes(b"weights-1")
    specs = load_scenarios(write(tmp_path, [{"name": "zz_cached", "prompt": "p", "adapter": str(adapter)}]), tmp_path)
    reads = []
    real = scenarios.adapter_version
    monkeypatch.setattr(scenarios, "adapter_version", lambda p: reads.append(p) or real(p))

    row = db_session.get(Scenario, sync_scenarios(db_session, specs)["zz_cached"])
    first = row.adapter_version
    sync_scenarios(db_session, specs)
    sync_scenarios(db_session, specs)
    assert len(reads) == 1 and row.adapter_version == first

    weights.write_bytes(b"weights-2")  # same size, new content and mtime
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    sync_scenarios(db_session, specs)
    assert len(reads) == 2 and row.adapter_version != first


def test_an_invalid_output_schema_refuses_the_scenario_file_with_where_and_why(tmp_path):
    bad = write(tmp_path, [{"name": "zz_schema", "prompt": "p",
                            "output_schema": {"type": "object", "properties": {"n": {"type": "integr"}}}}])
    with pytest.raises(ScenarioError, match=r"zz_schema: output_schema is not a valid JSON Schema at properties/n/type"):
        load_scenarios(bad, tmp_path)


def test_a_server_fault_is_never_recorded_as_the_adapters_verdict(db_session, tmp_path):
    """A registration the server failed to make (stage "server": its prepared-adapter cache
    cannot be written) leaves the scenario as it was; the adapter's own verdict then lands."""
    from vidlora.lifecycle import AdapterStatus
    from vidlora.models import Scenario
    from vidlora.scenarios import record_registrations

    row = Scenario(name="zz_server_fault", title="t", prompt="p", adapter_path=str(tmp_path), active=True,
                   adapter_status=AdapterStatus.UNCHECKED)
    db_session.add(row)
    db_session.flush()
    fault = {"ok": False, "stage": "server", "digest": None, "source": str(tmp_path),
             "reason": "not judged: a server fault, not the adapter's: the prepared-adapter cache cannot be written"}
    assert record_registrations(db_session, {row.name: fault}) == 0
    assert row.adapter_status == AdapterStatus.UNCHECKED and row.adapter_reason is None
    ok = {"ok": True, "stage": "device", "digest": "abc", "source": str(tmp_path), "reason": None}
    assert record_registrations(db_session, {row.name: ok}) == 1 and row.adapter_status == AdapterStatus.OK
