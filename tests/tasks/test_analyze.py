"""tasks.analyze: what is stored for an engine output. A structured scenario's answer is kept
parsed with its schema check; one cut off by max_tokens is a failure with the reason, never
a truncated result stored as success. On the session's PostgreSQL, through the task's own
store step (what analyze_batch runs for each output)."""
from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from tasks.analysis_rows import store
from tests.support.running_rows import running_analyses
from vidlora.db import session_scope
from vidlora.engine_io import AnalysisOutput
from vidlora.models import Analysis, Result, ResultConfidence, ResultField, Scenario

SCHEMA = {"type": "object", "required": ["finds"], "properties": {"finds": {"type": "array", "maxItems": 2}}}


@pytest.fixture(autouse=True)
def keep_the_scenario(database):
    with session_scope() as session:
        before = session.scalar(select(Scenario).where(Scenario.name == "artifact_identification")).output_schema
    yield
    with session_scope() as session:
        session.scalar(select(Scenario).where(Scenario.name == "artifact_identification")).output_schema = before


def _running_analysis(tag: str) -> int:
    with session_scope() as session:
        session.scalar(select(Scenario).where(Scenario.name == "artifact_identification")).output_schema = SCHEMA
    return running_analyses(1, tag)[0]


def _output(key: int, text: str, finish: str, tokens: int = 6) -> AnalysisOutput:
    return AnalysisOutput(request_key=str(key), text=text, token_ids=list(range(tokens)), prompt_tokens=40,
                          output_tokens=tokens, latency_s=0.5, finish_reason=finish, cumulative_logprob=-1.0,
                          health={"ok": True, "reason": None, "checks": {}}, structured=True)


def test_a_structured_answer_is_stored_parsed_and_checked(database):
    aid = _running_analysis("analyze-structured")
    store(_output(aid, json.dumps({"finds": [{"type": "vessel"}]}), "stop"), {"model": "m"})
    with session_scope() as session:
        a = session.get(Analysis, aid)
        r = session.scalar(select(Result).where(Result.analysis_id == aid))
        assert a.status == "done" and r.parsed == {"finds": [{"type": "vessel"}]} and r.health["schema_ok"] is True


def test_the_workers_confidences_are_stored_typed_and_an_answer_without_them_is_unknown(database):
    from dataclasses import replace

    aid, other = _running_analysis("analyze-confidence"), _running_analysis("analyze-no-confidence")
    conf = {"answer": 0.42, "fields": {"finds": 0.42, "site\x00": 0.97}, "tokens": {"finds": 5, "site\x00": 2},
            "method": "min"}
    store(replace(_output(aid, json.dumps({"finds": []}), "stop"), confidence=conf), {"model": "m"})
    store(_output(other, json.dumps({"finds": []}), "stop"), {"model": "m"})
    with session_scope() as session:
        r = session.scalar(select(Result).where(Result.analysis_id == aid))
        rows = session.execute(select(ResultConfidence.field, ResultConfidence.confidence, ResultConfidence.tokens)
                               .where(ResultConfidence.result_id == r.id).order_by(ResultConfidence.id)).all()
        assert r.confidence == 0.42 and [tuple(x) for x in rows] == [("finds", 0.42, 5), ("site\ufffd", 0.97, 2)]
        unknown = session.scalar(select(Result).where(Result.analysis_id == other))
        assert unknown.confidence is None and unknown.field_confidences == []


def test_a_stored_answer_has_its_fields_indexed(database):
    aid = _running_analysis("analyze-fields")
    store(_output(aid, json.dumps({"finds": [{"type": "vessel"}, {"type": "coin"}]}), "stop"), {"model": "m"})
    with session_scope() as session:
        rid = session.scalar(select(Result.id).where(Result.analysis_id == aid))
        fields = session.execute(select(ResultField.path, ResultField.item, ResultField.text)
                                 .where(ResultField.result_id == rid).order_by(ResultField.item)).all()
        assert [tuple(f) for f in fields] == [("finds.type", 0, "vessel"), ("finds.type", 1, "coin")]


def test_control_characters_the_grammar_allowed_are_kept_readable(database):
    # The grammar lets a model write raw control characters (even NUL) inside a JSON string:
    # read leniently, NUL replaced (neither PostgreSQL text nor JSONB can hold it).
    aid = _running_analysis("analyze-control")
    store(_output(aid, '{"finds": [{"type": "ves\x00sel\x07"}]}', "stop"), {"model": "m"})
    with session_scope() as session:
        r = session.scalar(select(Result).where(Result.analysis_id == aid))
        assert r.parsed == {"finds": [{"type": "ves\ufffdsel\x07"}]} and r.health["schema_ok"] is True
        assert "\x00" not in r.text


def test_a_structured_answer_cut_off_by_max_tokens_fails_with_the_reason(database):
    aid = _running_analysis("analyze-cutoff")
    store(_output(aid, '{"finds": [{"type": "ves', "length", tokens=12), {"model": "m"})
    with session_scope() as session:
        a = session.get(Analysis, aid)
        assert a.status == "failed" and "did not complete within max_tokens=12" in a.reason
        assert session.scalar(select(Result).where(Result.analysis_id == aid)) is None


@pytest.mark.parametrize("taken_back_to", ["queued", "ready"])
def test_a_healthy_answer_is_kept_when_the_analysis_was_taken_back_meanwhile(database, taken_back_to):
    """The reconciler gave the analysis back while this worker still ran it (its heartbeat
    looked stale under load): the finished answer is stored, once, and a later delivery finds
    it done; a failure is not stored then (the other delivery may succeed)."""
    aid = _running_analysis(f"analyze-back-{taken_back_to}")
    with session_scope() as session:
        session.get(Analysis, aid).status = "ready"
        if taken_back_to == "queued":
            session.get(Analysis, aid).status = "queued"
    failed = AnalysisOutput.failed(str(aid), "deadline of 1s exceeded", finish_reason="deadline")
    store(failed, {"model": "m"})
    with session_scope() as session:
        assert session.get(Analysis, aid).status == taken_back_to
    store(_output(aid, json.dumps({"finds": []}), "stop"), {"model": "m"})
    store(_output(aid, json.dumps({"finds": [{"type": "coin"}]}), "stop"), {"model": "m"})  # the other delivery
    with session_scope() as session:
        assert session.get(Analysis, aid).status == "done"
        [r] = session.scalars(select(Result).where(Result.analysis_id == aid)).all()
        assert r.parsed == {"finds": []} and r.token_ids == list(range(6))
