"""How sure the model was of each field of a structured answer, from the tokens that wrote it.

The engine returns the probability of every token it chose. A top-level field's value is
written by some of those tokens; the others write the schema's structure (braces, keys,
colons, the quotes that open a string), which the grammar mostly forces and which say nothing
about the video. So a field's confidence is read from its *decision characters* only:

- a string: its characters and its closing quote (where the model chose to stop);
- a number: its digits and the character after it (``5`` vs ``54`` is decided there);
- true / false / null: the literal;
- an array: its items' decision characters, plus each ``,`` between items and the closing
  ``]`` (how many items there are is a decision too: "4 chambers" is written as 4 items);
- an object: its values' decision characters (never its keys).

Each part of a field gets its own figure too, so a reviewer sees *which* item to check: an
array item's is read from its own decision characters plus the ``,`` before it (the decision
that the item exists at all; the first item's is the structure the grammar opened), a nested
object field's from its value's. Parts are named by their path as the review form names its
inputs, without the form's prefix: ``finds/0``, ``finds/0/material``, ``finds/1``. A field's
figure is the least of its parts' and its own decisions (the closing ``]``).

Every token whose text overlaps a decision character of the field counts. The field's
confidence is the **smallest** probability among them: a value is wrong as soon as one of its
decisions is, and the tokens after a decision (the rest of an enum word, a name's next
syllable) are near-certain continuations, so a geometric mean would grow with the value's
length and hide a coin flip under them. The answer's confidence is its least certain field.
``bench/review_priority.py`` measures both aggregations on the demo model.

Pure functions: the worker maps its tokens to text offsets (``workers.confidence``) and
calls ``field_confidence``; calibration reads the stored numbers (``vidlora.feedback.calibration``).
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

METHOD = "min"  # the aggregation stored; bench/review_priority.py compares it with "geomean" and "product"
_DECODER = json.JSONDecoder(strict=False)  # as tasks.analysis_rows.parse_answer reads answers
_WS = " \t\r\n"

# Bands for the Results page's facet and filter: (key, label, low inclusive, high exclusive).
BANDS: tuple[tuple[str, str, float, float], ...] = (
    ("low", "below 50 %", 0.0, 0.5),
    ("medium", "50-90 %", 0.5, 0.9),
    ("high", "90-99 %", 0.9, 0.99),
    ("certain", "99 % and above", 0.99, 1.01),
)
UNKNOWN = "unknown"  # results stored before confidences were (or free-text answers)


def band_of(confidence: float | None) -> str:
    if confidence is None:
        return UNKNOWN
    for key, _label, low, high in BANDS:
        if low <= confidence < high:
            return key
    return BANDS[-1][0]


@dataclass(frozen=True)
class AnswerConfidence:
    """One answer's confidences: the answer's, each top-level field's (the answer's order), and
    each part's inside them (``parts``: list items and nested fields by path, ``finds/0/material``).
    ``parts`` is empty for answers whose worker measured fields only (before issue 58)."""

    answer: float | None
    fields: dict[str, float] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)  # decision tokens per field and part
    method: str = METHOD
    parts: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"answer": self.answer, "fields": dict(self.fields), "tokens": dict(self.tokens),
                "method": self.method, "parts": dict(self.parts)}

    @classmethod
    def of(cls, data: dict[str, Any] | None) -> "AnswerConfidence | None":
        if not data:
            return None
        return cls(data.get("answer"), dict(data.get("fields") or {}), dict(data.get("tokens") or {}),
                   data.get("method", METHOD), dict(data.get("parts") or {}))


SEP = "/"  # between a path's steps, as the review form names its inputs (f/finds/0/material)


def is_part(path: str) -> bool:
    """Whether a stored confidence's name is a part inside a field rather than a top-level field."""
    return SEP in path


# The review page marks a figure for checking below the "high" band (the bands it draws in
# red and amber).
DOUBTFUL_BELOW = next(low for key, _label, low, _high in BANDS if key == "high")


def doubtful(confidence: float | None) -> bool:
    return confidence is not None and confidence < DOUBTFUL_BELOW


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


Parts = dict[str, list[tuple[int, int]]]


def _decisions(text: str, start: int, path: str = "", parts: Parts | None = None) -> tuple[int, list[tuple[int, int]]]:
    """(end of the value starting at ``start``, its decision character ranges [a, b)); with
    ``parts``, each item and nested field inside the value at ``path`` is added to it too."""
    ch = text[start]
    if ch == "{":
        ranges: list[tuple[int, int]] = []
        i = _skip_ws(text, start + 1)
        if text[i] == "}":
            return i + 1, [(i, i + 1)]  # an empty object: its closing brace is all it decided
        while True:
            key, i = _DECODER.raw_decode(text, i)
            i = _skip_ws(text, i)
            i = _skip_ws(text, i + 1)  # the colon
            child = f"{path}{SEP}{key}"
            if parts is not None:
                parts[child] = []  # its place in the answer's order, before its own parts
            i, inner = _decisions(text, i, child, parts)
            if parts is not None:
                parts[child] = inner
            ranges += inner
            i = _skip_ws(text, i)
            if text[i] == "}":
                return i + 1, ranges
            i = _skip_ws(text, i + 1)  # the comma
    if ch == "[":
        ranges = []
        i = _skip_ws(text, start + 1)
        if text[i] == "]":
            return i + 1, [(i, i + 1)]
        index, before = 0, []
        while True:
            child = f"{path}{SEP}{index}"
            if parts is not None:
                parts[child] = []
            i, inner = _decisions(text, i, child, parts)
            if parts is not None:
                parts[child] = before + inner  # the "," that chose to write this item, and the item
            ranges += inner
            i = _skip_ws(text, i)
            ranges.append((i, i + 1))  # "," (another item) or "]" (no more)
            before, index = [(i, i + 1)], index + 1
            if text[i] == "]":
                return i + 1, ranges
            i = _skip_ws(text, i + 1)
    _value, end = _DECODER.raw_decode(text, start)
    if ch == '"':
        return end, [(start + 1, end)]  # the characters and the closing quote
    if ch in "-0123456789":
        after = _skip_ws(text, end)
        return end, [(start, min(after + 1, len(text)))]  # the digits and what ended them
    return end, [(start, end)]


def field_spans(text: str, parts: Parts | None = None) -> dict[str, list[tuple[int, int]]] | None:
    """Each top-level field of a JSON object answer with its decision character ranges, in the
    answer's order; None when the text is not one JSON object. With ``parts``, every list item
    and nested field inside the fields is added to it by path (``finds/0/material``)."""
    try:
        i = _skip_ws(text, 0)
        if i >= len(text) or text[i] != "{":
            return None
        out: dict[str, list[tuple[int, int]]] = {}
        i = _skip_ws(text, i + 1)
        if text[i] == "}":
            return out
        while True:
            key, i = _DECODER.raw_decode(text, i)
            i = _skip_ws(text, i)
            if text[i] != ":":
                return None
            i = _skip_ws(text, i + 1)
            i, ranges = _decisions(text, i, str(key), parts)
            out[str(key)] = ranges
            i = _skip_ws(text, i)
            if text[i] == "}":
                return out
            if text[i] != ",":
                return None
            i = _skip_ws(text, i + 1)
    except (ValueError, IndexError):
        return None


def _aggregate(probs: list[float], method: str) -> float:
    logs = [math.log(max(p, 1e-300)) for p in probs]
    if method == "geomean":
        return math.exp(sum(logs) / len(logs))
    if method == "product":  # every decision right, were they independent; falls with length
        return math.exp(sum(logs))
    return min(probs)


def _overlapping(starts: Sequence[int], ends: Sequence[int], ranges: list[tuple[int, int]]) -> list[int]:
    """The tokens whose text overlaps any of ``ranges`` (sorted, as the parser found them)."""
    found: list[int] = []
    for lo, hi in ranges:
        t = bisect_right(ends, lo)  # the first token that ends after lo
        while t < len(ends) and starts[t] < hi:
            if ends[t] > starts[t]:
                found.append(t)
            t += 1
    return sorted(set(found))


def field_confidence(text: str, token_ends: Sequence[int], logprobs: Sequence[float],
                     method: str = METHOD) -> AnswerConfidence | None:
    """Per-field, per-part and answer confidence of a JSON answer. ``token_ends[i]`` is where
    token ``i``'s text ends in ``text`` (token i covers ``token_ends[i-1]..token_ends[i]``) and
    ``logprobs[i]`` its logprob. None when it cannot be told (not a JSON object, tokens that
    do not cover the text, a missing or non-finite logprob on a decision)."""
    if len(token_ends) != len(logprobs) or not token_ends or token_ends[-1] != len(text):
        return None
    found: Parts = {}
    spans = field_spans(text, found)
    if spans is None:
        return None
    starts = [0, *token_ends[:-1]]

    def measure(ranges: list[tuple[int, int]]) -> list[float] | None:
        probs = []
        for t in _overlapping(starts, token_ends, ranges):
            lp = logprobs[t]
            if lp is None or not math.isfinite(lp):
                return None
            probs.append(math.exp(min(lp, 0.0)))
        return probs

    fields: dict[str, float] = {}
    parts: dict[str, float] = {}
    counts: dict[str, int] = {}
    for into, named in ((fields, spans), (parts, found)):
        for name, ranges in named.items():
            probs = measure(ranges)
            if probs is None:
                return None
            if probs:
                into[name] = round(_aggregate(probs, method), 6)
                counts[name] = len(probs)
    if not fields:
        return None
    return AnswerConfidence(min(fields.values()), fields, counts, method, parts)
