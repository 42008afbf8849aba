"""Reviewed results as an adapter's next training set, each example as the engine saw it.

The format is the conversation JSON Lines that the common LoRA trainers for Qwen
vision-language models read (LLaMA-Factory's ``sharegpt`` with ``messages`` / ``videos``
columns and role/content tags, ms-swift's standard ``messages`` + ``videos``): per line

    {"messages": [{"role": "system", "content": SYSTEM},
                  {"role": "user", "content": "<video>" + PROMPT},
                  {"role": "assistant", "content": ANSWER}],
     "videos": [["frames/17/0000.jpg", ...]], "video_timestamps": [[0.0, 0.5, ...]], ...}

A video is its sampled frames, in time order, with the seconds each was taken at: the frames
the scenario's sampling gave the GPU worker, not the file again (so the trainer sees what the
adapter will see). A structured answer is the reviewed value as compact JSON in the schema's
key order, what the structured-output grammar lets the model write. Beside it:
``manifest.json`` (counts, scenario, prompt as the model's chat template renders it, adapter
versions the answers came from, review dates) and LLaMA-Factory's form of the same examples
(``vidlora.feedback.llamafactory``: ``llamafactory.jsonl``, ``dataset_info.json`` and a recipe),
because LLaMA-Factory reads ``train.jsonl`` into other prompt tokens than vLLM serves. Gold
results are held out unless asked for; ``gold_only`` writes the gold set itself in the same
format.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from vidlora.feedback import llamafactory
from vidlora.lifecycle import ReviewAction, ReviewState
from vidlora.models import Analysis, Result, Scenario, as_utc
from vidlora.results.fields import in_schema_order
from vidlora.results.rows import iso_utc

TRAIN_FILE = "train.jsonl"
VIDEO_TAG = "<video>"
INCLUDABLE = (ReviewState.APPROVED.value, ReviewState.EDITED.value)
FORMAT = "vidlora-training/1"


class TrainingSetError(ValueError):
    pass


@dataclass
class Selection:
    include: tuple[str, ...] = INCLUDABLE
    since: datetime | None = None  # reviewed on or after
    with_gold: bool = False  # training exports hold the gold set out by default
    gold_only: bool = False
    link: bool = False  # hard-link frames (same file system) instead of copying them

    def __post_init__(self) -> None:
        unknown = sorted(set(self.include) - set(INCLUDABLE))
        if unknown or not self.include:
            raise TrainingSetError(f"include takes {', '.join(INCLUDABLE)}; not {', '.join(unknown) or 'nothing'}")


@dataclass
class Written:
    examples: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)


def reviewed_at(result: Result) -> datetime | None:
    """When the answer took its reviewed form: the last approve or edit."""
    last = next((r for r in reversed(result.reviews) if r.action in (ReviewAction.APPROVE, ReviewAction.EDIT)), None)
    return as_utc(last.created_at) if last is not None else None


def answer_of(result: Result, scenario: Scenario) -> str:
    """The reviewed answer as the model should learn to write it."""
    if result.parsed is not None:
        value = result.edited_parsed if result.edited_parsed is not None else result.parsed
        return json.dumps(in_schema_order(value, scenario.output_schema), ensure_ascii=False, separators=(",", ":"))
    return result.edited_text if result.edited_text is not None else result.text


def messages(scenario: Scenario, answer: str) -> list[dict[str, str]]:
    """The conversation the engine had (``vidlora.engine_io.build_messages``), with the
    video as the trainers' ``<video>`` placeholder and the reviewed answer as the reply."""
    out = [{"role": "system", "content": scenario.system_prompt}] if scenario.system_prompt else []
    return out + [{"role": "user", "content": VIDEO_TAG + scenario.prompt},
                  {"role": "assistant", "content": answer}]


def dataset_info(name: str, file: str) -> dict[str, Any]:
    """LLaMA-Factory's description of its form of the set (``dataset_dir`` is the export folder)."""
    return {name: {"file_name": file, "formatting": "sharegpt",
                   "columns": {"messages": "messages", "videos": "videos"},
                   "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                            "assistant_tag": "assistant", "system_tag": "system"}}}


def _results(session: Session, scenario: Scenario, sel: Selection) -> list[Result]:
    stmt = (select(Result).join(Analysis, Analysis.id == Result.analysis_id)
            .where(Analysis.scenario_id == scenario.id, Result.review_state.in_(sel.include))
            .options(selectinload(Result.reviews), selectinload(Result.analysis).selectinload(Analysis.frame_set),
                     selectinload(Result.analysis).selectinload(Analysis.video))
            .order_by(Result.id))
    if sel.gold_only:
        stmt = stmt.where(Result.gold_at.is_not(None))
    elif not sel.with_gold:
        stmt = stmt.where(Result.gold_at.is_(None))
    return list(session.scalars(stmt))


def _place(src: Path, dst: Path, link: bool) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if link:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass  # another file system: copy
    shutil.copyfile(src, dst)


def write_training_set(session: Session, scenario: Scenario, out: Path, media_root: Path, sel: Selection,
                       model: str | None = None) -> Written:
    """Write the examples, ``manifest.json`` and, where ``model``'s folder can be read here,
    LLaMA-Factory's form of them (``vidlora.feedback.llamafactory``: its file, recipe and
    ``dataset_info.json``) into ``out`` (which must be empty or new: an export is one set,
    never merged with an older one)."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise TrainingSetError(f"{out} is not empty: export into a new folder")
    out.mkdir(parents=True, exist_ok=True)
    written = Written()
    versions: dict[str, int] = {}
    dates: list[datetime] = []
    states: dict[str, int] = {}

    def skip(reason: str) -> None:
        written.skipped[reason] = written.skipped.get(reason, 0) + 1

    name = f"vidlora_{scenario.name}{'_gold' if sel.gold_only else ''}"
    factory, no_factory = llamafactory.Writer.for_model(out, name, model, scenario.adapter_path)
    with (out / TRAIN_FILE).open("w", encoding="utf-8") as fh, factory or nullcontext():
        for result in _results(session, scenario, sel):
            when = reviewed_at(result)
            if sel.since is not None and (when is None or when < as_utc(sel.since)):
                continue
            frame_set = result.analysis.frame_set
            if frame_set is None or not frame_set.files:
                skip("no stored frames")
                continue
            sources = [media_root / f for f in frame_set.files]
            if not all(p.is_file() for p in sources):
                skip("frames missing from the media store")
                continue
            frames = [f"frames/{result.id}/{i:04d}{p.suffix.lower()}" for i, p in enumerate(sources)]
            for src, rel in zip(sources, frames):
                _place(src, out / rel, sel.link)
            conversation = messages(scenario, answer_of(result, scenario))
            if factory is not None:
                factory.add(conversation, sources, frames, frame_set.timestamps)
            row = {"messages": conversation, "videos": [frames],
                   "video_timestamps": [[float(t) for t in frame_set.timestamps]],
                   "result_id": result.id, "video_sha256": result.analysis.video.sha256,
                   "adapter_version": result.adapter_version, "review_state": result.review_state,
                   "reviewed_at": iso_utc(when), "gold": result.gold_at is not None}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            written.examples += 1
            key = result.adapter_version or "none"
            versions[key] = versions.get(key, 0) + 1
            states[result.review_state] = states.get(result.review_state, 0) + 1
            if when is not None:
                dates.append(when)
    if factory is not None:
        factory_part = factory.finish()
        (out / "dataset_info.json").write_text(json.dumps(dataset_info(name, llamafactory.FILE), indent=2) + "\n")
    else:
        factory_part = {"file": None, "why": no_factory}
    written.manifest = {
        "format": FORMAT, "file": TRAIN_FILE, "dataset_name": name, "scenario": scenario.name,
        "examples": written.examples, "by_review_state": states, "skipped": written.skipped,
        "set": "gold" if sel.gold_only else "training",
        "gold": "only" if sel.gold_only else ("included" if sel.with_gold else "held out"),
        "include": list(sel.include), "since": iso_utc(sel.since) if sel.since else None,
        "adapter_versions": versions, "serving_adapter_version": scenario.adapter_version,
        "reviewed_from": iso_utc(min(dates)) if dates else None, "reviewed_to": iso_utc(max(dates)) if dates else None,
        "system": scenario.system_prompt, "prompt": scenario.prompt,
        "chat_template_prompt": render_prompt(model, scenario) if model else None, "llamafactory": factory_part,
        "output_schema": scenario.output_schema, "sampling": scenario.sampling,
        "frames": "linked" if sel.link else "copied",
    }
    (out / "manifest.json").write_text(json.dumps(written.manifest, indent=2, ensure_ascii=False) + "\n")
    return written


def render_prompt(model: str, scenario: Scenario) -> str | None:
    """The prompt as the model's own chat template renders it (the video one placeholder, as
    vLLM receives it), or None where the model's tokenizer cannot be read here."""
    from vidlora.engine_io import AnalysisRequest, build_prompt

    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
    except (OSError, ValueError):
        return None
    req = AnalysisRequest(request_key="export", prompt=scenario.prompt, system=scenario.system_prompt,
                          frames=["frame"], timestamps=[0.0], adapter_name=None, adapter_path=None,
                          max_tokens=1, temperature=0.0, top_p=1.0, seed=0)
    return build_prompt(tokenizer, req)
