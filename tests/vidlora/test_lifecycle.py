"""vidlora.lifecycle: states are plain strings where they are stored and sent; an analysis
moves only forward along its lifecycle, and a final one never moves again."""
from __future__ import annotations

import json

import pytest
from sqlalchemy import CheckConstraint

from vidlora.lifecycle import (
    ANALYSIS_MOVES,
    FINAL_ANALYSIS,
    AnalysisStatus,
    IllegalMove,
    VideoStatus,
    check_analysis_move,
    values,
)
from vidlora.models import Analysis, Video


def test_states_are_their_string_values_in_json_and_comparisons():
    assert AnalysisStatus.DONE == "done" and json.dumps([AnalysisStatus.DONE]) == '["done"]'
    assert f"{VideoStatus.READY}" == "ready"
    assert values(AnalysisStatus) == ("pending", "ready", "queued", "running", "done", "failed", "rejected")


def test_the_database_constraint_lists_every_state():
    for model, states in ((Analysis, AnalysisStatus), (Video, VideoStatus)):
        [check] = [c for c in model.__table__.constraints if isinstance(c, CheckConstraint)]
        assert str(check.sqltext) == "status IN (" + ", ".join(f"'{v}'" for v in values(states)) + ")"


def test_every_state_has_its_moves_and_final_states_have_none():
    assert set(ANALYSIS_MOVES) == set(AnalysisStatus)
    assert all(not ANALYSIS_MOVES[s] for s in FINAL_ANALYSIS)
    # every non-final state can still end (failed is reachable from each)
    assert all(AnalysisStatus.FAILED in ANALYSIS_MOVES[s] for s in set(AnalysisStatus) - FINAL_ANALYSIS)


@pytest.mark.parametrize("old,new", [("pending", "ready"), ("ready", "queued"), ("queued", "running"),
                                     ("running", "done"), ("running", "ready"), ("queued", "ready"),
                                     (None, "rejected"), ("done", "done")])
def test_allowed_moves(old, new):
    assert check_analysis_move(old, new) == new


@pytest.mark.parametrize("old,new", [("done", "ready"), ("failed", "queued"), ("rejected", "running"),
                                     ("pending", "running"), ("ready", "done")])
def test_moves_the_lifecycle_does_not_have_are_refused(old, new):
    with pytest.raises(IllegalMove, match=f"from {old} to {new}"):
        check_analysis_move(old, new)


def test_the_model_checks_every_assignment():
    a = Analysis(video_id=1, scenario_id=1, batch_id=1)
    a.status = AnalysisStatus.PENDING
    a.status = "ready"
    assert a.status is AnalysisStatus.READY
    a.status = "queued"
    a.status = "running"
    a.status = "done"
    with pytest.raises(IllegalMove):
        a.status = "ready"  # a late duplicate message must not set finished work back
    with pytest.raises(ValueError):
        a.status = "finished"  # not a state at all
