"""Jinja filters and globals: sizes, times, durations, status labels, health flags."""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from typing import Any

from flask import Flask
from markupsafe import Markup

from vidlora.lifecycle import AnalysisStatus, ReviewState, VideoStatus
from vidlora.models import as_utc
from vidlora.result_health import ResultHealth
from vidlora.results.rows import shown_name
from vidlora.status import stream_words
from vidlora.reasons import in_words, member_name
from vidlora.results.confidence import DOUBTFUL_BELOW, band_of
from vidlora.results.fields import in_schema_order
from vidlora.visible import PATTERN as INVISIBLE_PATTERN, visible

# What people see for each analysis status; the raw status stays in data-status attributes.
STATUS_LABELS = {
    AnalysisStatus.PENDING: "queued",
    AnalysisStatus.READY: "queued",
    AnalysisStatus.QUEUED: "queued",
    AnalysisStatus.RUNNING: "running",
    AnalysisStatus.DONE: "done",
    AnalysisStatus.FAILED: "failed",
    AnalysisStatus.REJECTED: "rejected",
}
STATUS_HINTS = {
    AnalysisStatus.PENDING: "Waiting for its frames to be sampled",
    AnalysisStatus.READY: "Frames ready; waiting for a GPU worker",
    AnalysisStatus.QUEUED: "Sent to a GPU worker",
    AnalysisStatus.RUNNING: "The model is looking at it now",
    AnalysisStatus.DONE: "Finished",
    AnalysisStatus.FAILED: "Failed after retries",
    AnalysisStatus.REJECTED: "Not analysable",
}
# Video statuses are a different set: "ready" means probed and accepted, not "waiting".
VIDEO_LABELS = {VideoStatus.REGISTERED: "received", VideoStatus.PROBING: "checking", VideoStatus.READY: "ready",
                VideoStatus.REJECTED: "rejected", VideoStatus.FAILED: "failed"}
# The one status vocabulary: pages render it and pass it to their scripts (data-vocabulary), so
# a live update never names a status differently from the first render.
VOCABULARY = {"analysis": {s: [STATUS_LABELS[s], STATUS_HINTS[s]] for s in STATUS_LABELS},
              "video": {s: [label, ""] for s, label in VIDEO_LABELS.items()}}
REVIEW_LABELS = {ReviewState.UNREVIEWED: "not reviewed", ReviewState.APPROVED: "approved",
                 ReviewState.REJECTED: "rejected", ReviewState.EDITED: "edited"}


def human_bytes(n: int | float | None) -> str:
    if n is None:
        return ""
    value = float(n)
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{int(value)} {unit}" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"


def when(value: datetime | None) -> Markup | str:
    """A moment as <time>: UTC without JavaScript; common.js shows it in the reader's own zone
    with how long ago it was (the server cannot know the reader's zone)."""
    if value is None:
        return ""
    moment = as_utc(value)
    return Markup('<time datetime="{}" data-local>{}</time>').format(
        moment.isoformat(timespec="seconds").replace("+00:00", "Z"), moment.strftime("%Y-%m-%d %H:%M UTC"))


def age(value: datetime | None, now: datetime | None = None) -> str:
    if value is None:
        return "never"
    seconds = ((now or datetime.now(timezone.utc)) - as_utc(value)).total_seconds()
    if seconds < 90:
        return f"{max(0, int(seconds))} s ago"
    if seconds < 5400:
        return f"{int(seconds // 60)} min ago"
    if seconds < 172800:
        return f"{int(seconds // 3600)} h ago"
    return f"{int(seconds // 86400)} days ago"


def seconds_left(until: datetime, now: datetime | None = None) -> str:
    """How long until ``until``, in a reviewer's words ("45 s", "3 min")."""
    seconds = max(0, int((as_utc(until) - (now or datetime.now(timezone.utc))).total_seconds()))
    return f"{seconds} s" if seconds < 120 else f"{seconds // 60} min"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    total = int(round(seconds))
    h, rest = divmod(total, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def timestamp(seconds: float | None) -> str:
    """Frame timestamps: tenths of a second matter when frames are close together."""
    if seconds is None:
        return ""
    m, s = divmod(float(seconds), 60)
    return f"{int(m)}:{s:04.1f}"


def answer_line(value: Any, schema: dict[str, Any] | None = None) -> str:
    """A structured answer in one line for lists, every value with its field's name: "finds:
    1. material bronze, period han, confidence 0.8 / 2. material jade, ..." (schema order)."""
    from vidlora.results.fields import in_schema_order

    def text(node: Any) -> str:
        if isinstance(node, dict):
            return ", ".join(f"{k.replace('_', ' ')} {t}" for k, t in ((k, text(v)) for k, v in node.items()) if t)
        if isinstance(node, list):
            if not node:
                return "none"
            if any(isinstance(v, dict) for v in node):
                return " / ".join(f"{i}. {text(v)}" for i, v in enumerate(node, 1))
            return ", ".join(text(v) for v in node)
        if isinstance(node, bool):
            return "yes" if node else "no"
        return "" if node is None else str(node)

    value = in_schema_order(value, schema)
    if not isinstance(value, dict):
        return text(value)
    return "; ".join(f"{k.replace('_', ' ')}: {text(v)}" for k, v in value.items())


VERSION_NAMES = (("vllm", "vLLM"), ("torch", "torch"), ("transformers", "transformers"), ("peft", "PEFT"),
                 ("triton", "Triton"))


def versions_line(versions: dict[str, Any] | None) -> str:
    """The serving stack in one line: "vLLM 0.32.0 · torch 2.10.0 · transformers 5.19.0"."""
    versions = versions or {}
    return " · ".join(f"{label} {versions[key]}" for key, label in VERSION_NAMES if versions.get(key)) or "unknown"


def canary_summary(canary: dict[str, Any] | None, now: datetime | None = None) -> tuple[str, str]:
    """(the worker's last canary in words, good|bad|info): "healthy, 3 min ago"."""
    if not canary:
        return "not run yet", "info"
    when_text = ""
    if isinstance(canary.get("at"), (int, float)):
        when_text = ", " + age(datetime.fromtimestamp(canary["at"], timezone.utc), now)
    if canary.get("ok"):
        return f"healthy{when_text}", "good"
    return f"failed: {canary.get('reason') or canary.get('detail') or 'no reason given'}{when_text}", "bad"


def describe_sampling(stored: dict[str, Any] | None) -> str:
    """A scenario's frame sampling in words, only what its mode uses."""
    from vidlora.media.sampling import SamplingPolicy

    try:
        return SamplingPolicy.from_dict(stored or {"mode": "uniform"}).describe()
    except (TypeError, ValueError):
        return "not readable: re-sync the scenario file"


def health_flags(health: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """(name, value text, good|bad|info) per flag of a stored result's health."""
    return [(f.name, f.value, f.kind) for f in ResultHealth.of(health).flags()]


def health_summary(health: dict[str, Any] | None) -> tuple[str, str]:
    """(the verdict in words, good|bad|info) of a stored result's health."""
    flag = ResultHealth.of(health).summary()
    return flag.value, flag.kind


_ITEM = re.compile(r"^(\w+)\[(\d+)\]$")


def confidence_text(value: float | None) -> str:
    """A confidence as reviewers read it: a whole percentage, never a false 100 %."""
    if value is None:
        return "unknown"
    if value >= 1:
        return "100 %"  # the grammar left one choice
    pct = math.floor(100 * value)  # rounded down: 99.6 % shows as 99 %, not as certain
    return f"{pct} %" if pct >= 1 else "<1 %"


def field_label(path: str) -> str:
    """A field path as the edit form names it: "finds[0].material" -> "Find 1 · material"; a
    confidence's path ("finds/0/material", as the form's inputs are named) reads the same."""
    if "/" in path:
        steps: list[str] = []
        for step in path.split("/"):
            if step.isdigit() and steps:
                steps[-1] += f"[{step}]"
            else:
                steps.append(step)
        path = ".".join(steps)
    words = []
    for part in path.split("."):
        item = _ITEM.match(part)
        if item:
            name = item.group(1).replace("_", " ")
            name = name[:-1] if name.endswith("s") and len(name) > 1 else name
            words.append(f"{name.capitalize()} {int(item.group(2)) + 1}")
        else:
            words.append(part.replace("_", " "))
    return " · ".join(words)


def init_app(app: Flask) -> None:
    app.jinja_env.filters.update(
        human_bytes=human_bytes, when=when, age=age, seconds_left=seconds_left, duration=duration, timestamp=timestamp,
        answer_line=answer_line, shown_name=shown_name, field_label=field_label, visible=visible,
        reason_words=in_words, member_name=member_name, in_schema_order=in_schema_order,
        reject_key=lambda mapping, key: {k: v for k, v in mapping.items() if k != key},
    )
    app.jinja_env.globals.update(
        STATUS_LABELS=STATUS_LABELS, VIDEO_LABELS=VIDEO_LABELS, VOCABULARY=VOCABULARY, STATUS_HINTS=STATUS_HINTS, REVIEW_LABELS=REVIEW_LABELS,
        health_flags=health_flags, health_summary=health_summary, versions_line=versions_line,
        canary_summary=canary_summary, describe_sampling=describe_sampling, stream_words=stream_words,
        INVISIBLE_PATTERN=INVISIBLE_PATTERN, confidence_text=confidence_text, confidence_band=band_of,
        DOUBTFUL_BELOW=DOUBTFUL_BELOW,
    )
