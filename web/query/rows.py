"""One query row as plain data: the JSON API, JSONL and CSV exports all use this shape."""

from __future__ import annotations

from typing import Any

from vidlora.models import Analysis, Result, Scenario, Video

COLUMNS = (
    "analysis_id", "result_id", "video_id", "video_name", "scenario", "status", "reason",
    "review_state", "text", "edited_text", "final_text", "prompt_tokens", "output_tokens",
    "latency_s", "finish_reason", "model", "adapter", "adapter_version", "health",
    "created_at", "finished_at",
)


def _iso(value) -> str | None:
    return value.isoformat() if value is not None else None


def row_dict(analysis: Analysis, result: Result | None, video: Video, scenario: Scenario) -> dict[str, Any]:
    final = None
    if result is not None:
        final = result.edited_text if result.edited_text is not None else result.text
    return {
        "analysis_id": analysis.id,
        "result_id": result.id if result else None,
        "video_id": video.id,
        "video_name": video.original_name,
        "scenario": scenario.name,
        "status": analysis.status,
        "reason": analysis.reason,
        "review_state": result.review_state if result else None,
        "text": result.text if result else None,
        "edited_text": result.edited_text if result else None,
        "final_text": final,
        "prompt_tokens": result.prompt_tokens if result else None,
        "output_tokens": result.output_tokens if result else None,
        "latency_s": result.latency_s if result else None,
        "finish_reason": result.finish_reason if result else None,
        "model": result.model if result else None,
        "adapter": result.adapter if result else None,
        "adapter_version": (result.adapter_version if result else None) or analysis.adapter_version,
        "health": result.health if result else None,
        "created_at": _iso(analysis.created_at),
        "finished_at": _iso(analysis.finished_at),
    }
