"""A structured answer's per-field confidence, in the worker, from the logprobs it already has.

vidlora's requests get each chosen token's logprob as a number, without its text
(``engine_patch.patches.logprob_text``), so the worker maps tokens to text offsets itself:
it decodes the token ids incrementally with the engine's tokenizer. No extra engine pass.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from vidlora.engine_io import AnalysisOutput, AnalysisRequest
from vidlora.results.confidence import field_confidence

log = logging.getLogger(__name__)

# Decoding re-anchors after this many tokens, so a long answer costs O(n) decodes of short
# slices rather than n decodes of its whole prefix.
WINDOW = 16
REPLACEMENT = "\ufffd"  # what a token that ends inside a UTF-8 character decodes to, for now


def token_ends(tokenizer: Any, token_ids: Sequence[int], text: str) -> list[int] | None:
    """Where each token's text ends in ``text`` (the engine's own detokenized output); a
    token that ends inside a character ends where the character does. None if decoding does
    not give back ``text`` (a tokenizer whose pieces do not concatenate)."""
    def decode(ids: Sequence[int]) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=True)

    for window in (WINDOW, None):  # windowed first; the whole prefix each time if that fails
        ends: list[int] = []
        base, anchor, pieces = 0, 0, []
        for i in range(len(token_ids)):
            piece = decode(token_ids[anchor:i + 1])
            clean = piece.rstrip(REPLACEMENT)
            ends.append(base + len(clean))
            if window is not None and clean == piece and i + 1 - anchor >= window:
                pieces.append(piece)
                base, anchor = base + len(piece), i + 1
        if anchor < len(token_ids):
            pieces.append(decode(token_ids[anchor:]))
        if "".join(pieces) == text and (not ends or ends[-1] == len(text)):
            return ends
    return None


def with_confidence(tokenizer: Any, req: AnalysisRequest, out: AnalysisOutput) -> AnalysisOutput:
    """``out`` with its confidences, for a healthy answer of a scenario with a schema."""
    if (req.output_schema is None or out.error or tokenizer is None or not out.token_ids
            or len(out.logprobs) != len(out.token_ids)):
        return out
    try:
        ends = token_ends(tokenizer, out.token_ids, out.text)
        conf = field_confidence(out.text, ends, out.logprobs) if ends is not None else None
    except Exception:  # noqa: BLE001 - a confidence is a help to reviewers, never a reason to lose the answer
        log.exception("confidence of %s could not be computed", out.request_key)
        return out
    return replace(out, confidence=conf.as_dict() if conf is not None else None)
