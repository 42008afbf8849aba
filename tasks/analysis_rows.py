"""The one way an analysis row moves on a GPU worker, in both worker modes: ``claim`` (RUNNING
here, one attempt counted), the request it becomes (``build_request``), ``store`` (its result,
or its failure with the reason), ``fail`` and ``release`` (back to ready for another try).
Model output is untrusted text: ``storable_text`` / ``storable_value`` make it fit PostgreSQL.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import jsonschema
from sqlalchemy import select

from tasks.base import TRANSIENT_ERRORS, VidloraTask
from vidlora import metrics
from vidlora.attempts import begin_attempt
from vidlora.config import get_settings
from vidlora.db import session_scope
from vidlora.engine_io import AnalysisOutput, AnalysisRequest
from vidlora.lifecycle import FINAL_ANALYSIS, IN_FLIGHT_ANALYSIS, AnalysisStatus
from vidlora.models import Analysis, Result, ResultConfidence, as_utc, utcnow
from vidlora.results.confidence import AnswerConfidence
from vidlora.result_health import ResultHealth
from vidlora.results.fields import index_fields
from vidlora.scenarios import Generation

log = logging.getLogger(__name__)


def claim(task: VidloraTask, analysis_ids: list[int], worker_name: str) -> list[AnalysisRequest]:
    """Mark the analyses RUNNING on this worker (one attempt counted) and build their requests;
    those finished meanwhile, or over the attempt cap, are skipped."""
    settings = get_settings()
    requests: list[AnalysisRequest] = []
    with session_scope() as session:
        rows = session.scalars(select(Analysis).where(Analysis.id.in_(analysis_ids)).order_by(Analysis.id))
        for analysis in rows:
            # Anything else was finished by an earlier delivery or re-queued by the reconciler.
            if analysis.status not in IN_FLIGHT_ANALYSIS:
                continue
            if not begin_attempt(analysis, settings.max_attempts, counts=task.is_first_delivery):
                analysis.finished_at = utcnow()
                continue
            analysis.status, analysis.started_at, analysis.worker = AnalysisStatus.RUNNING, utcnow(), worker_name
            requests.append(build_request(analysis.id, analysis.scenario, analysis.frame_set, settings.media_root))
    return requests


def build_request(analysis_id: int, scenario, frame_set, media_root: Path) -> AnalysisRequest:
    """The engine request for one analysis: its scenario's prompt, adapter and generation
    settings over its frame set. The one place a stored analysis becomes a request."""
    gen = Generation.of(scenario.generation)
    return AnalysisRequest(
        request_key=str(analysis_id),
        prompt=scenario.prompt,
        system=scenario.system_prompt,
        frames=[str(media_root / f) for f in frame_set.files],
        timestamps=list(frame_set.timestamps),
        adapter_name=scenario.name if scenario.adapter_path else None,
        adapter_path=scenario.adapter_path,
        max_tokens=gen.max_tokens,
        temperature=gen.temperature,
        top_p=gen.top_p,
        seed=gen.seed,
        repetition_penalty=gen.repetition_penalty,
        output_schema=scenario.output_schema,
    )


def parse_answer(text: str, schema: dict | None) -> tuple[dict | None, bool | None]:
    """A structured scenario's answer, parsed, and whether it is valid against its schema (the
    engine enforces the schema while generating; this is the check that it did). Control
    characters inside strings are read as the grammar let the model write them."""
    if schema is None:
        return None, None
    try:
        value = storable_value(json.loads(text, strict=False))
    except ValueError:
        return None, False
    valid = jsonschema.Draft202012Validator(schema).is_valid(value)
    return (value if isinstance(value, dict) else {"value": value}), valid


def storable_text(text: str) -> str:
    """Model output is untrusted bytes-as-text: PostgreSQL text cannot hold NUL, and lone
    surrogates cannot be encoded; both become U+FFFD so the rest of the output is kept."""
    return text.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")


def storable_value(value):
    """The same for every string (and key) of a parsed answer: JSONB cannot hold NUL either."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, list):
        return [storable_value(v) for v in value]
    if isinstance(value, dict):
        return {storable_text(k): storable_value(v) for k, v in value.items()}
    return value


def store(output: AnalysisOutput, identity: dict) -> None:
    """Store one output (result, or failure with its reason) if its analysis is still running.

    A healthy answer is stored also for an analysis the reconciler took back meanwhile (this
    worker's heartbeat looked stale under load) and no one finished yet: the work is done, and
    the other delivery then finds it done. A failure is not: the other delivery may succeed."""
    with session_scope() as session:
        analysis = session.get(Analysis, int(output.request_key))
        if analysis is None or analysis.status in FINAL_ANALYSIS:
            return
        if analysis.status != AnalysisStatus.RUNNING:
            if output.error:
                return
            if analysis.status == AnalysisStatus.READY:
                analysis.status = AnalysisStatus.QUEUED
            analysis.status = AnalysisStatus.RUNNING
        _stored(session, analysis, output, identity)
        done = analysis.status == AnalysisStatus.DONE
        seen = (analysis.scenario.name, analysis.status,
                _seconds_between(analysis.created_at, analysis.finished_at) if done else None,
                output.latency_s if done else None, output.prompt_tokens or 0, output.output_tokens or 0)
    metrics.observe_result(*seen, health=output.health)  # once committed


def _seconds_between(start, end) -> float:
    return (as_utc(end) - as_utc(start)).total_seconds()


def _stored(session, analysis: Analysis, output: AnalysisOutput, identity: dict) -> None:
        analysis.finished_at = utcnow()
        analysis.engine = identity
        analysis.adapter_version = analysis.scenario.adapter_version
        if output.error:
            analysis.status, analysis.reason = AnalysisStatus.FAILED, output.error
            return
        schema = analysis.scenario.output_schema
        if schema is not None and output.finish_reason == "length":
            # A schema answer cut off is not an answer: never stored as a truncated success.
            analysis.status = AnalysisStatus.FAILED
            analysis.reason = (f"the structured answer did not complete within max_tokens={output.output_tokens} "
                               "(raise the scenario's max_tokens, or bound its schema: maxItems, maxLength)")
            return
        if session.scalar(select(Result.id).where(Result.analysis_id == analysis.id)) is None:
            parsed, schema_ok = parse_answer(output.text, analysis.scenario.output_schema)
            result = Result(
                analysis_id=analysis.id,
                text=storable_text(output.text),
                parsed=parsed,
                prompt_tokens=output.prompt_tokens,
                output_tokens=output.output_tokens,
                latency_s=output.latency_s,
                finish_reason=output.finish_reason,
                token_ids=[int(t) for t in output.token_ids] if output.token_ids else None,
                health=ResultHealth.of(output.health).with_schema(schema_ok).as_dict(),
                model=identity.get("model", ""),
                adapter=analysis.scenario.name if analysis.scenario.adapter_path else None,
                adapter_version=analysis.scenario.adapter_version,
            )
            add_confidence(result, AnswerConfidence.of(output.confidence) if parsed is not None else None)
            session.add(result)
            index_fields(session, result)
        analysis.status, analysis.reason = AnalysisStatus.DONE, None


def add_confidence(result: Result, confidence: AnswerConfidence | None) -> None:
    """The worker's confidences, typed: the answer's on the result, each field's and each part's
    (list item, nested field: ``finds/0/material``) in its row, the fields first."""
    if confidence is None or confidence.answer is None:
        return
    result.confidence = float(confidence.answer)
    result.field_confidences = [
        ResultConfidence(field=storable_text(name)[:255], confidence=float(value),
                         tokens=int(confidence.tokens.get(name, 0)))
        for name, value in (*confidence.fields.items(), *confidence.parts.items())]


def fail(analysis_id: int, reason: str) -> None:
    with session_scope() as session:
        analysis = session.get(Analysis, analysis_id)
        if analysis is not None and analysis.status == AnalysisStatus.RUNNING:
            analysis.status, analysis.reason, analysis.finished_at = AnalysisStatus.FAILED, reason, utcnow()


def release(requests: list[AnalysisRequest], reason: str) -> None:
    """The engine failed as a whole: give the analyses back for another try (the attempt cap
    still applies) rather than failing them for what may be a transient engine fault."""
    settings = get_settings()
    with session_scope() as session:
        for req in requests:
            analysis = session.get(Analysis, int(req.request_key))
            if analysis is None or analysis.status != AnalysisStatus.RUNNING:
                continue
            if analysis.attempts >= settings.max_attempts:
                analysis.status, analysis.reason, analysis.finished_at = AnalysisStatus.FAILED, reason, utcnow()
            else:
                analysis.status, analysis.reason, analysis.ready_at = AnalysisStatus.READY, reason, utcnow()


def store_or_fail(output: AnalysisOutput, identity: dict) -> None:
    """``store``; an output that cannot be stored fails its analysis with why, and the database
    going away is raised for the caller to retry (finished rows are skipped then)."""
    try:
        store(output, identity)
    except TRANSIENT_ERRORS:
        raise
    except Exception as exc:  # noqa: BLE001 - this one output cannot be stored; the others still are
        log.exception("storing analysis %s failed", output.request_key)
        fail(int(output.request_key), f"could not store the result: {type(exc).__name__}: {exc}"[:2000])


def reclaim(analysis_ids: list[int], worker_name: str) -> None:
    """Analyses this worker still holds whose message came again (the reconciler took them back
    while the worker looked stale): RUNNING here again, no attempt counted."""
    with session_scope() as session:
        for analysis in session.scalars(select(Analysis).where(Analysis.id.in_(analysis_ids))):
            if analysis.status == AnalysisStatus.QUEUED:
                analysis.status, analysis.worker = AnalysisStatus.RUNNING, worker_name
