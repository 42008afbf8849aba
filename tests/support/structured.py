"""Structured results in the database as the analyze task leaves them (the answer as text and
data, its fields indexed by the product's own ``index_fields``), for query, export, review and
CLI tests. Each call makes its own scenario, so tests never see each other's rows."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

CATALOGUE = {
    "type": "object", "additionalProperties": False, "required": ["finds", "sealed"],
    "properties": {
        "site": {"type": "string", "maxLength": 20},
        "sealed": {"type": "boolean"},
        "chamber_count": {"type": "integer", "minimum": 0, "maximum": 20},
        "finds": {"type": "array", "maxItems": 5, "items": {
            "type": "object", "additionalProperties": False, "required": ["material", "period", "confidence"],
            "properties": {
                "material": {"enum": ["bronze", "jade", "ceramic"]},
                "period": {"enum": ["han", "tang", "unknown"]},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                "decoration": {"type": "string", "maxLength": 40},
            }}},
        "damage": {"type": "array", "maxItems": 3, "items": {"enum": ["water", "looting", "none"]}},
    },
}


@dataclass
class Seeded:
    scenario: str
    batch_id: int
    result_ids: list[int]  # in the order of the answers
    analysis_ids: list[int]


def seed_structured(answers: list[dict[str, Any] | None], schema: dict[str, Any] = CATALOGUE,
                    review_states: list[str] | None = None, session=None,
                    confidences: list[dict[str, float] | None] | None = None) -> Seeded:
    """One batch, one video per answer, each with a done analysis of a new structured scenario
    (an answer of None: the analysis is still running, no result). In the configured
    database, or in ``session`` (flushed, not committed). ``confidences``: per answer, its
    fields' confidences as the worker would store them (the product's ``add_confidence``)."""
    from contextlib import nullcontext

    from vidlora.db import session_scope
    from vidlora.models import Analysis, Batch, BatchItem, FrameSet, Result, Scenario, Video, utcnow
    from tasks.analysis_rows import add_confidence
    from vidlora.results.confidence import AnswerConfidence
    from vidlora.results.fields import index_fields

    key = uuid.uuid4().hex[:10]
    name = f"catalogue_{key}"
    with (nullcontext(session) if session is not None else session_scope()) as session:
        scenario = Scenario(name=name, title=f"Catalogue {key}", prompt="List the finds.", output_schema=schema,
                            adapter_path=None, adapter_status="none", sampling={"mode": "uniform", "num_frames": 2},
                            generation={})
        batch = Batch(name=f"Site B {key}", source="cli", scenario_names=[name], status="ingested")
        session.add_all([scenario, batch])
        session.flush()
        result_ids, analysis_ids = [], []
        for index, answer in enumerate(answers):
            sha = uuid.uuid4().hex * 2
            video = Video(sha256=sha, path=f"videos/{sha[:2]}/{sha}.mp4", original_name=f"clip-{index}.mp4",
                          size_bytes=100, status="ready")
            session.add(video)
            session.flush()
            frames = FrameSet(video_id=video.id, policy_key="uniform-2", policy={}, status="done",
                              timestamps=[0.5, 1.5], files=[], width=64, height=64, backend="test")
            session.add_all([frames, BatchItem(batch_id=batch.id, name=video.original_name, status="stored",
                                               video_id=video.id)])
            session.flush()
            analysis = Analysis(video_id=video.id, scenario_id=scenario.id, batch_id=batch.id, frame_set_id=frames.id,
                                status="done" if answer is not None else "running", attempts=1,
                                engine={"versions": {"vllm": "0.32.0", "torch": "2.10"}, "model_config_sha256": "cfg1"},
                                finished_at=utcnow() if answer is not None else None)
            session.add(analysis)
            session.flush()
            analysis_ids.append(analysis.id)
            if answer is None:
                continue
            result = Result(analysis_id=analysis.id, text=json.dumps(answer), parsed=answer, prompt_tokens=300,
                            output_tokens=40, latency_s=0.5, finish_reason="stop",
                            health={"ok": True, "schema_ok": True}, model="tiny", adapter=None,
                            adapter_version="digest-abc",
                            review_state=review_states[index] if review_states else "unreviewed")
            fields = confidences[index] if confidences else None
            if fields:
                add_confidence(result, AnswerConfidence(min(fields.values()), fields, dict.fromkeys(fields, 1)))
            session.add(result)
            index_fields(session, result)
            result_ids.append(result.id)
        session.flush()
        return Seeded(name, batch.id, result_ids, analysis_ids)


def seed_latencies(session=None, totals=(10, 20, 30, 40, 100), engines=(1, 2, 3, 4, 5), old=None, target=None):
    """Results whose upload-to-result times are ``totals`` seconds (and, with ``old``, one
    more that finished that many days ago)."""
    from contextlib import nullcontext
    from datetime import timedelta

    from vidlora.db import session_scope
    from vidlora.models import Analysis, Result, Scenario, utcnow

    seeded = seed_structured([{"sealed": True, "finds": []}] * (len(totals) + (old is not None)), session=session)
    now = utcnow()
    with (nullcontext(session) if session is not None else session_scope()) as s:
        for i, analysis_id in enumerate(seeded.analysis_ids):
            analysis = s.get(Analysis, analysis_id)
            total, engine = (totals[i], engines[i]) if i < len(totals) else (9999, 99)
            finished = now - timedelta(days=old if i == len(totals) else 0, seconds=30)
            analysis.created_at, analysis.finished_at = finished - timedelta(seconds=total), finished
            s.get(Result, seeded.result_ids[i]).latency_s = engine
        scenario = s.query(Scenario).filter_by(name=seeded.scenario).one()
        scenario.latency_target_s = target
        s.flush()
    return seeded.scenario
