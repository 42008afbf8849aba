"""A structured answer stored as the GPU worker and the store task leave it, with confidences
the worker measured itself: the demo model's real tokenizer writes the answer, every token
near-certain but those writing one chosen value, and ``workers.confidence.with_confidence``
and ``tasks.analysis_rows.store`` do the rest (no engine: its logprobs are set here)."""

from __future__ import annotations

import json
import math
from functools import lru_cache
from typing import Any

SURE, UNSURE = 0.995, 0.3


@lru_cache(maxsize=1)
def _tokenizer():
    from transformers import AutoTokenizer

    from demo_model import BASE

    return AutoTokenizer.from_pretrained(str(BASE))


def store_measured(analysis_id: int, answer: dict[str, Any], unsure: str, schema: dict[str, Any] | None = None) -> int:
    """Store ``answer`` for the RUNNING analysis ``analysis_id``, the tokens overlapping the
    first occurrence of ``unsure`` in its JSON at UNSURE, the others at SURE; the result's id."""
    from sqlalchemy import select

    from tasks.analysis_rows import store
    from tests.support.structured import CATALOGUE
    from vidlora.db import session_scope
    from vidlora.engine_io import AnalysisOutput, AnalysisRequest
    from vidlora.models import Result
    from workers.confidence import token_ends, with_confidence

    tokenizer = _tokenizer()
    text = json.dumps(answer)
    ids = tokenizer.encode(text)
    at = text.index(unsure)
    ends = token_ends(tokenizer, ids, text)
    starts = [0, *ends[:-1]]
    logprobs = [math.log(UNSURE if a < at + len(unsure) and at < b else SURE) for a, b in zip(starts, ends)]
    out = AnalysisOutput(str(analysis_id), text, ids, 300, len(ids), 0.5, "stop", None, logprobs,
                         health={"ok": True, "reason": None, "checks": {}}, structured=True)
    request = AnalysisRequest(str(analysis_id), "p", None, [], [], None, None, 256, 0.0, 1.0, None,
                              output_schema=schema or CATALOGUE)
    store(with_confidence(tokenizer, request, out), {"model": "tiny"})
    with session_scope() as session:
        return session.scalar(select(Result.id).where(Result.analysis_id == analysis_id))
