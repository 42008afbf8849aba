"""One query row as plain data: the JSON API, the exports and ``vidlora results`` use this shape.

Besides the answer, a row carries its provenance (which adapter version and engine produced
it, from which frames) and its review, so an exported catalogue can be traced and audited
without the database.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

from vidlora.models import Analysis, Result, Scenario, Video, as_utc
from vidlora.result_health import ResultHealth
from vidlora.results.fields import final_value, in_schema_order
from vidlora.visible import warning

COLUMNS = (
    "analysis_id", "result_id", "batch_id", "batch_name", "video_id", "video_name", "video_name_warning",
    "video_sha256", "video_duration_s", "video_declared_duration_s", "video_truncated", "video_field_order",
    "video_width", "video_height", "video_codec", "frames_deinterlace", "scenario", "status", "reason",
    "review_state", "reviewed_by", "reviewed_at", "review_note", "text", "edited_text", "final_text",
    "health_verdict", "health_ok", "health_schema_ok", "health_engine_runs", "health_isolated_rerun",
    "health_quality", "model_confidence", "model_field_confidence", "prompt_tokens", "output_tokens", "latency_s", "finish_reason", "model", "adapter",
    "adapter_version", "engine_versions", "frame_timestamps", "health", "created_at", "finished_at",
)
# Typed JSON only (JSONL, Parquet, the API): the answer as data, final and as the model gave it.
STRUCTURED = ("fields", "model_fields")


def shown_name(path: str | None) -> str | None:
    """A model or adapter as users see it: its name, never the server path it was loaded from
    (a hub-style "org/model" id stays whole)."""
    if not path:
        return path
    if not path.startswith(("/", ".", "~")) and path.count("/") <= 1:
        return path
    return PurePath(path.rstrip("/")).name or path


def iso_utc(value) -> str | None:
    """RFC 3339 with its zone, always (SQLite hands back naive datetimes; they are UTC)."""
    if value is None:
        return None
    return as_utc(value).isoformat()


def _engine_versions(analysis: Analysis) -> dict[str, Any] | None:
    engine = analysis.engine or {}
    versions = dict(engine.get("versions") or {})
    if not versions and not engine:
        return None
    if engine.get("model_config_sha256"):
        versions["model_config_sha256"] = engine["model_config_sha256"]
    if engine.get("served_model_name"):
        versions["served_model_name"] = shown_name(engine["served_model_name"])  # never a server path
    return {k: v for k, v in versions.items() if v is not None}


def _health_columns(result: Result | None) -> dict[str, Any]:
    """The guard's verdict as flat columns a spreadsheet can filter on (the whole record
    stays in ``health``)."""
    if result is None:
        return dict.fromkeys(("health_verdict", "health_ok", "health_schema_ok", "health_engine_runs",
                              "health_isolated_rerun", "health_quality"))
    health = ResultHealth.of(result.health)
    return {"health_verdict": health.summary().value, "health_ok": health.ok, "health_schema_ok": health.schema_ok,
            "health_engine_runs": health.runs, "health_isolated_rerun": health.isolated_rerun,
            "health_quality": health.quality}


def stored_confidences(session: Any, result_ids: list[int]) -> dict[int, dict[str, float]]:
    """Each result's stored confidences by name (fields, then list items and nested fields),
    read as plain rows: an answer has a dozen or more, and loading them as ORM objects was half
    of an export's time."""
    from sqlalchemy import select

    from vidlora.models import ResultConfidence

    out: dict[int, dict[str, float]] = {}
    for start in range(0, len(result_ids), 1000):
        rows = session.execute(select(ResultConfidence.result_id, ResultConfidence.field, ResultConfidence.confidence)
                               .where(ResultConfidence.result_id.in_(result_ids[start:start + 1000]))
                               .order_by(ResultConfidence.id))
        for rid, name, value in rows:
            out.setdefault(rid, {})[name] = value
    return out


def _answer(value: Any, scenario: Scenario, ordered: bool) -> Any:
    return in_schema_order(value, scenario.output_schema) if ordered else value


def row_dict(analysis: Analysis, result: Result | None, video: Video, scenario: Scenario,
             confidences: dict[str, float] | None = None, ordered: bool = True) -> dict[str, Any]:
    """One result's row; ``confidences``: its stored confidences by name when the caller read
    them for many rows at once (``stored_confidences``), else they are read from the result;
    ``ordered``: the answers' keys in the schema's order (JSON shows them to people); a CSV
    cell reads a field by its path and writes objects with sorted keys, so it skips that."""
    final = None
    last_review = last_note = None
    if result is not None:
        final = result.edited_text if result.edited_text is not None else result.text
        last_review = next((r for r in reversed(result.reviews) if r.action != "note"), None)
        last_note = next((r.note for r in reversed(result.reviews) if r.note), None)
    frame_set = analysis.frame_set
    return {
        "analysis_id": analysis.id,
        "result_id": result.id if result else None,
        # the batch that asked for this analysis (a re-upload of the same content reuses it)
        "batch_id": analysis.batch_id,
        "batch_name": analysis.batch.name if analysis.batch is not None else None,
        "video_id": video.id,
        "video_name": video.original_name,
        # The name as stored, and a flag when it holds characters a reader cannot see
        # (vidlora.visible): a spreadsheet shows "report<U+202E>fdp.mp4" as "reportpdf.mp4".
        "video_name_warning": warning(video.original_name),
        "video_sha256": video.sha256,
        "video_duration_s": video.duration_s,
        # A partial file: analysed for video_duration_s of the span its header declares.
        "video_declared_duration_s": video.declared_duration_s,
        "video_truncated": video.truncated,
        "video_field_order": video.field_order,
        "video_width": video.width,
        "video_height": video.height,
        "video_codec": video.codec,
        "frames_deinterlace": frame_set.deinterlace if frame_set is not None else None,
        "scenario": scenario.name,
        "status": analysis.status,
        "reason": analysis.reason,
        "review_state": result.review_state if result else None,
        "reviewed_by": (last_review.user.username if last_review and last_review.user else None),
        "reviewed_at": iso_utc(last_review.created_at) if last_review else None,
        "review_note": last_note,
        **_health_columns(result),
        # The model's own doubt (vidlora.results.confidence), as it wrote the answer; None: unknown.
        "model_confidence": result.confidence if result else None,
        "model_field_confidence": ((confidences if confidences is not None
                                    else {c.field: c.confidence for c in result.field_confidences})
                                   if result is not None and result.confidence is not None else None),
        "text": result.text if result else None,
        "edited_text": result.edited_text if result else None,
        "final_text": final,
        "prompt_tokens": result.prompt_tokens if result else None,
        "output_tokens": result.output_tokens if result else None,
        "latency_s": result.latency_s if result else None,
        "finish_reason": result.finish_reason if result else None,
        "model": shown_name(result.model) if result else None,
        "adapter": result.adapter if result else None,
        "adapter_version": (result.adapter_version if result else None) or analysis.adapter_version,
        "engine_versions": _engine_versions(analysis),
        "frame_timestamps": list(frame_set.timestamps) if frame_set is not None else None,
        "health": result.health if result else None,
        "created_at": iso_utc(analysis.created_at),
        "finished_at": iso_utc(analysis.finished_at),
        "fields": _answer(final_value(result), scenario, ordered) if result else None,
        "model_fields": _answer(result.parsed, scenario, ordered) if result else None,
        "gold": result.gold_at is not None if result else None,
    }
