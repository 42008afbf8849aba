"""vidlora.feedback.releases: a candidate serves nothing until promoted; a promotion outlives
scenario syncs; rollback returns to the version it replaced; results keep their version."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from demo_model import ADAPTERS
from vidlora.feedback.releases import ReleaseError, promote, register_candidate, releases, rollback
from vidlora.models import Scenario
from vidlora.scenarios import ScenarioSpec, adapter_version, sync_scenarios


@pytest.fixture()
def two_versions(tmp_path):
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    shutil.copytree(ADAPTERS / "tomb_structure", v1)
    shutil.copytree(ADAPTERS / "tomb_structure", v2)
    (v2 / "README.md").write_text("v2: trained on reviewed answers\n")  # another version, by content
    return v1, v2


def test_promote_then_rollback_and_syncs_keep_the_promotion(db_session, two_versions):
    v1, v2 = two_versions
    spec = ScenarioSpec(name="tomb_releases", title="Tombs", prompt="Count the chambers.", adapter_path=str(v1))
    sync_scenarios(db_session, [spec])
    scenario = db_session.query(Scenario).filter_by(name="tomb_releases").one()
    first = scenario.adapter_version
    assert first == adapter_version(str(v1))

    candidate = register_candidate(db_session, scenario, v2, note="from the December reviews")
    assert candidate.status == "candidate" and scenario.adapter_version == first  # serves nothing yet
    with pytest.raises(ReleaseError, match="already serves"):
        register_candidate(db_session, scenario, v1)

    promote(db_session, scenario, candidate.version[:8])
    assert (scenario.adapter_path, scenario.adapter_version) == (str(v2), candidate.version)
    assert scenario.adapter_status == "unchecked"  # the workers judge the new adapter anew
    assert {r.version: r.status for r in releases(db_session, scenario)} == {candidate.version: "serving",
                                                                            first: "retired"}
    sync_scenarios(db_session, [spec])  # the file still names v1: the promotion stands
    assert scenario.adapter_version == candidate.version

    back = rollback(db_session, scenario)
    assert back.version == first and (scenario.adapter_path, scenario.adapter_version) == (str(v1), first)
    sync_scenarios(db_session, [spec])
    assert scenario.adapter_version == first
    with pytest.raises(ReleaseError, match="no earlier adapter version"):
        rollback(db_session, scenario)
    with pytest.raises(ReleaseError, match="no adapter version 'zzz'"):
        promote(db_session, scenario, "zzz")


def test_a_scenario_file_that_names_another_adapter_wins_over_a_promotion(db_session, two_versions, tmp_path):
    v1, v2 = two_versions
    v3 = tmp_path / "v3"
    shutil.copytree(v2, v3)
    (v3 / "README.md").write_text("v3: named in scenarios.yaml by the team\n")
    spec = ScenarioSpec(name="tomb_file_wins", title="Tombs", prompt="Count the chambers.", adapter_path=str(v1))
    sync_scenarios(db_session, [spec])
    scenario = db_session.query(Scenario).filter_by(name="tomb_file_wins").one()
    promote(db_session, scenario, register_candidate(db_session, scenario, v2).version)
    sync_scenarios(db_session, [replace(spec, adapter_path=str(v3))])
    assert scenario.adapter_version == adapter_version(str(v3))
    assert {r.status for r in releases(db_session, scenario)} == {"retired"}  # nothing left promoted
