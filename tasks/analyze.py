"""Run one batch of analyses (one adapter, usually) on this GPU worker's engine.

Runs only in a GPU worker process (solo pool), where ``workers.runtime`` holds the engine
built at start-up. One batch is one ``generate`` call; vLLM's continuous batching does the
rest. Every output passes engine_patch's health guard before it may be stored: a degenerate
output is never recorded as a result.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import jsonschema
from celery import shared_task
from celery.exceptions import WorkerShutdown
from sqlalchemy import select

from tasks import messages
from tasks.base import TRANSIENT_ERRORS, VidloraTask
from vidlora import metrics
from vidlora.attempts import begin_attempt
from vidlora.config import get_settings
from vidlora.db import session_scope
from vidlora.engine_io import AnalysisOutput, AnalysisRequest
from vidlora.lifecycle import IN_FLIGHT_ANALYSIS, AnalysisStatus
from vidlora.models import Analysis, Result, as_utc, utcnow
from vidlora.result_health import ResultHealth
from vidlora.results.fields import index_fields
from vidlora.scenarios import Generation, record_registrations
from workers import runtime

log = logging.getLogger(__name__)

# Exit status of a GPU worker that stopped to have its engine replaced (EX_TEMPFAIL): a
# supervisor restarts it; the work it held is back in the queue already.
EXIT_ENGINE_REPLACED = 75


def _claim(task: VidloraTask, analysis_ids: list[int], worker_name: str) -> list[AnalysisRequest]:
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


def _parse(text: str, schema: dict | None) -> tuple[dict | None, bool | None]:
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


def _store(output: AnalysisOutput, identity: dict, worker_name: str) -> None:
    with session_scope() as session:
        analysis = session.get(Analysis, int(output.request_key))
        if analysis is None or analysis.status != AnalysisStatus.RUNNING:
            return
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
            parsed, schema_ok = _parse(output.text, analysis.scenario.output_schema)
            result = Result(
                analysis_id=analysis.id,
                text=storable_text(output.text),
                parsed=parsed,
                prompt_tokens=output.prompt_tokens,
                output_tokens=output.output_tokens,
                latency_s=output.latency_s,
                finish_reason=output.finish_reason,
                health=ResultHealth.of(output.health).with_schema(schema_ok).as_dict(),
                model=identity.get("model", ""),
                adapter=analysis.scenario.name if analysis.scenario.adapter_path else None,
                adapter_version=analysis.scenario.adapter_version,
            )
            session.add(result)
            index_fields(session, result)
        analysis.status, analysis.reason = AnalysisStatus.DONE, None


def _fail(analysis_id: int, reason: str) -> None:
    with session_scope() as session:
        analysis = session.get(Analysis, analysis_id)
        if analysis is not None and analysis.status == AnalysisStatus.RUNNING:
            analysis.status, analysis.reason, analysis.finished_at = AnalysisStatus.FAILED, reason, utcnow()


def _release(requests: list[AnalysisRequest], reason: str) -> None:
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


@shared_task(base=VidloraTask, bind=True, name=messages.ANALYZE_BATCH)
def analyze_batch(self: VidloraTask, analysis_ids: list[int]) -> int:
    # Here, not at module level: CPU-image processes load this module and have no engine_patch.
    from engine_patch.guard import EngineReplaceRequired

    host = runtime.get_host()
    settings = get_settings()
    requests = _claim(self, analysis_ids, runtime.worker_name())
    if not requests:
        return 0
    try:
        outputs = host.generate(requests, deadline_s=settings.gpu_batch_deadline_s)
    except EngineReplaceRequired as exc:
        # The engine cannot be rebuilt in this process: give the work back and exit non-zero;
        # the supervisor (compose restart policy) starts a fresh worker with a fresh engine.
        log.error("engine must be replaced: %s; releasing %d analyses and exiting", exc, len(requests))
        _release(requests, f"engine replaced: {exc}"[:2000])
        messages.dispatch_ready(countdown=settings.dispatch_max_wait_s)
        raise WorkerShutdown(EXIT_ENGINE_REPLACED) from exc
    except Exception as exc:  # the engine itself failed; the guard could not recover it
        log.exception("batch %s failed in the engine", analysis_ids)
        _release(requests, f"engine error: {type(exc).__name__}: {exc}"[:2000])
        messages.dispatch_ready(countdown=settings.dispatch_max_wait_s)
        return 0
    # Which analyses shared this engine batch, in order: batch composition changes low-order
    # numerics, so an output is reproduced exactly (and a cross-request effect is traced) only
    # with its batch-mates.
    identity = {**host.identity(), "engine_batch": [int(r.request_key) for r in requests]}
    with session_scope() as session:  # an adapter registered (or refused) during this batch
        record_registrations(session, host.registrations())
    for output in outputs:
        try:
            _store(output, identity, runtime.worker_name())
        except TRANSIENT_ERRORS:
            raise  # the database went away: Celery retries the batch; finished rows are skipped
        except Exception as exc:  # this one output cannot be stored; the others still are
            log.exception("storing analysis %s failed", output.request_key)
            _fail(int(output.request_key), f"could not store the result: {type(exc).__name__}: {exc}"[:2000])
    runtime.after_batch()
    return sum(1 for o in outputs if not o.error)

