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

# Each token is decoded with at most this many before it, so a long answer costs n decodes of
# short slices rather than n decodes of its whole prefix.
WINDOW = 16
REPLACEMENT = "\ufffd"  # what a token that ends inside a UTF-8 character decodes to, for now


def token_ends(tokenizer: Any, token_ids: Sequence[int], text: str) -> list[int] | None:
    """Where each token's text ends in ``text`` (the engine's own detokenized output); a
    token that ends inside a character ends where the character does. None if decoding does
    not give back ``text`` (a tokenizer whose pieces do not concatenate).

    Token i is decoded with the tokens before it back to the start of its window of WINDOW
    tokens, all in one ``batch_decode`` call; if a window starts inside a character (the
    windows' texts do not join up to ``text``), every token is decoded with its whole prefix."""
    ids = list(token_ids)
    for window in (WINDOW, len(ids) or 1):
        starts = [(i // window) * window for i in range(len(ids))]
        pieces = tokenizer.batch_decode([ids[a:i + 1] for i, a in enumerate(starts)], skip_special_tokens=True)
        ends: list[int] = []
        base, joined = 0, []
        for i, piece in enumerate(pieces):
            ends.append(base + len(piece.rstrip(REPLACEMENT)))
            if i + 1 == len(ids) or starts[i + 1] != starts[i]:  # the window's last token
                joined.append(piece)
                base += len(piece)
        if "".join(joined) == text:
            if ends:
                ends[-1] = len(text)  # the last token covers the rest (a trailing invalid byte too)
            return ends
    return None


def with_confidence(tokenizer: Any, req: AnalysisRequest, out: AnalysisOutput) -> AnalysisOutput:
    """``out`` with its confidences, for a healthy answer of a scenario with a schema."""
    if (req.output_schema is None or out.error or tokenizer is None or not out.token_ids
            or len(out.logprobs) != len(out.token_ids)):
        return out
    try:
        text = out.text
        ends = token_ends(tokenizer, out.token_ids, text)
        if ends is None:
            # The engine's incremental detokenizer can render bytes that are not UTF-8 apart
            # from a decode of the whole answer; the tokens' own text has the same fields.
            text = tokenizer.decode(list(out.token_ids), skip_special_tokens=True)
            ends = token_ends(tokenizer, out.token_ids, text)
        conf = field_confidence(text, ends, out.logprobs) if ends is not None else None
    except Exception:  # noqa: BLE001 - a confidence is a help to reviewers, never a reason to lose the answer
        log.exception("confidence of %s could not be computed", out.request_key)
        return out
    return replace(out, confidence=conf.as_dict() if conf is not None else None)
