"""Run a candidate adapter version on its scenario's gold set, without touching stored results.

The requests are the worker's own (``analysis_rows.build_request`` over each gold result's
stored frame set, with the scenario's prompt, schema and generation settings), with the
candidate's adapter in place of the serving one; they go through the product's engine host
(its adapter registration and run-time guard), and the answers are parsed and checked against
the schema as stored results are. They are kept on the release (``AdapterRelease.gold_answers``),
never as results: the gold set's results, and their provenance, stay as they were.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from tasks.analysis_rows import build_request, parse_answer
from vidlora.config import Settings
from vidlora.db import session_scope
from vidlora.engine_io import AnalysisRequest
from vidlora.feedback.gold import gold_results
from vidlora.models import AdapterRelease, utcnow


def candidate_name(scenario: str, version: str) -> str:
    """The candidate's adapter name in the engine: never the serving adapter's (the scenario's)."""
    return f"{scenario}-candidate-{version[:12]}"


def gold_requests(release_id: int, media_root: Path) -> tuple[list[AnalysisRequest], dict[str, Any] | None]:
    with session_scope() as session:
        release = session.get(AdapterRelease, release_id)
        scenario = release.scenario
        requests = []
        for result in gold_results(session, scenario.id):
            frame_set = result.analysis.frame_set
            if frame_set is None or not frame_set.files:
                continue
            req = build_request(result.id, scenario, frame_set, media_root)
            requests.append(dataclasses.replace(req, adapter_name=candidate_name(scenario.name, release.version),
                                                adapter_path=release.path))
        return requests, scenario.output_schema


def store_answers(release_id: int, outputs, schema: dict[str, Any] | None) -> int:
    answers: dict[str, Any] = {}
    for out in outputs:
        parsed, schema_ok = parse_answer(out.text, schema) if out.error is None else (None, None)
        answers[out.request_key] = {"text": out.text, "parsed": parsed, "schema_ok": schema_ok,
                                    "error": out.error, "health": out.health, "confidence": out.confidence}
    with session_scope() as session:
        release = session.get(AdapterRelease, release_id)
        release.gold_answers, release.gold_run_at = answers, utcnow()
    return len(answers)


def run_candidate(release_id: int, settings: Settings) -> int:
    """Start an engine host (as a GPU worker does), answer the gold set, store the answers on
    the release; the number answered. Run where an engine fits (a GPU host between batches,
    or the CPU build on the demo model)."""
    import gc

    from workers.engine_env import shutdown
    from workers.engine_host import EngineHost

    requests, schema = gold_requests(release_id, Path(settings.media_root))
    if not requests:
        return store_answers(release_id, [], schema)
    host = EngineHost(settings.model_copy(update={"max_num_seqs": max(1, min(len(requests), settings.max_num_seqs))}))
    host.start()
    try:
        outputs = host.generate(requests)
    finally:
        shutdown(host.llm)
        host.llm = None
        gc.collect()
    return store_answers(release_id, outputs, schema)
