"""How far reviewers agree with an adapter version: pure functions over plain values.

A reviewed result is *approved* (the answer stood as the model gave it), *edited* (a reviewer
corrected it) or *rejected* (no usable answer). For a structured scenario each field of the
model's answer is also scored against the reviewed answer (the edit, or the model's own when
approved unchanged): enums, integers and yes/no exactly, numbers within a tolerance, strings
after normalising case, width and blanks. Rejected results have no reviewed answer, so they
count in the rates and not in field accuracy.

Every rate comes with its count and a Wilson score interval: with 12 reviews, 11 approved is
"0.92, 0.65-0.99", which says how much a comparison between two versions can be trusted.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol

from vidlora.lifecycle import ReviewState
from vidlora.results.fields import FieldSpec

Z_95 = 1.959963984540054


def wilson(k: int, n: int, z: float = Z_95) -> tuple[float, float] | None:
    """The Wilson score interval of k successes in n trials (None for no trials): unlike
    k/n +- z*se it stays inside 0..1 and is honest for small n and rates near 0 or 1."""
    if n <= 0:
        return None
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Rate:
    k: int
    n: int

    @property
    def value(self) -> float | None:
        return self.k / self.n if self.n else None

    def as_dict(self) -> dict[str, Any]:
        ci = wilson(self.k, self.n)
        return {"count": self.k, "of": self.n, "rate": _round(self.value),
                "ci95": [_round(ci[0]), _round(ci[1])] if ci else None}


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


# -- one field ---------------------------------------------------------------------------


def normalise_text(value: Any) -> str:
    """Text as two reviewers would call it the same: Unicode-compatible forms, case, and
    runs of blanks folded; blanks at the ends dropped."""
    return " ".join(unicodedata.normalize("NFKC", str(value)).casefold().split())


def number_tolerance(spec: FieldSpec, reviewed: float, relative: float) -> float:
    """How far a number may be from the reviewed one and still count as right: ``relative``
    of the schema's range where it has one (a confidence in 0..1: 0.05), else of the value."""
    if spec.minimum is not None and spec.maximum is not None and spec.maximum > spec.minimum:
        return relative * (spec.maximum - spec.minimum)
    return relative * max(abs(reviewed), 1e-9)


def same_value(spec: FieldSpec, model: Any, reviewed: Any, relative: float) -> bool:
    """One value of a field, the model's against the reviewed one."""
    if model is None or reviewed is None:
        return model is None and reviewed is None
    if spec.many:  # a list of scalars is one value: the same members, in any order
        if not isinstance(model, list) or not isinstance(reviewed, list) or len(model) != len(reviewed):
            return False
        one = FieldSpec(spec.path, spec.kind, spec.enum, spec.minimum, spec.maximum)
        return all(same_value(one, a, b, relative)
                   for a, b in zip(sorted(model, key=_key), sorted(reviewed, key=_key)))
    if spec.kind == "number" and spec.enum is None:
        if isinstance(model, bool) or not isinstance(model, (int, float)) or not isinstance(reviewed, (int, float)):
            return False
        return abs(float(model) - float(reviewed)) <= number_tolerance(spec, float(reviewed), relative) + 1e-12
    if spec.kind == "string" and spec.enum is None:
        return normalise_text(model) == normalise_text(reviewed)
    # enums, integers, yes/no: exactly (and True is not 1)
    return model == reviewed and isinstance(model, bool) == isinstance(reviewed, bool)


def _key(v: Any) -> str:
    return normalise_text(v) if isinstance(v, str) else repr(v)


def values_of(answer: Any, spec: FieldSpec) -> list[Any]:
    """A field's values in an answer, one per item of its first array (None where an item
    lacks it), or one value for a top-level field."""
    if not isinstance(answer, dict):
        return []
    whole, array, rest = _parts(spec.path, spec.array, spec.many)
    if array is None:
        return [_walk(answer, whole)]
    items = _walk(answer, array)
    if not isinstance(items, list):
        return []
    return [_walk(item, rest) if rest else item for item in items]


@lru_cache(maxsize=1024)
def _parts(path: str, array: str | None, many: bool) -> tuple[list[str], list[str] | None, list[str]]:
    """A field's path split once, not per answer (the Scenarios page scores every reviewed one):
    the whole path, its array's (None: one value per answer), and the rest within an item."""
    if array is None or (many and array == path):
        return path.split("."), None, []
    return path.split("."), array.split("."), path[len(array) + 1:].split(".") if path != array else []


def _walk(node: Any, parts: list[str]) -> Any:
    for part in parts:
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def score_field(spec: FieldSpec, model: Any, reviewed: Any, relative: float) -> tuple[int, int]:
    """(right, compared) for one field of one result. Items pair by position; an item only one
    side has is a wrong value (the model missed a find, or invented one); a field neither side
    gives is not compared."""
    left = values_of(model, spec)
    return _score_values(spec, left, left if reviewed is model else values_of(reviewed, spec), relative)


def score_fields(specs: list[FieldSpec], model: Any, reviewed: Any, relative: float) -> tuple[tuple[int, int], ...]:
    """``score_field`` for every field of the schema at once, the same figures for less work
    (the Scenarios page scores every reviewed answer of a scenario: 10,000 at 100k results):
    each array of an answer is walked once for all its fields, and an answer approved unchanged
    is compared with itself only where that can fail (a number that is not one)."""
    left = _all_values(specs, model)
    if reviewed is not model:
        right = _all_values(specs, reviewed)
        return tuple(_score_values(spec, a, b, relative) for spec, a, b in zip(specs, left, right))
    out = []
    for spec, values in zip(specs, left):
        given = [v for v in values if v is not None]
        if spec.kind == "string" and spec.enum is None and not spec.many:
            out.append((len(given), len(given)))  # normalised text always equals itself
        else:
            out.append((sum(same_value(spec, v, v, relative) for v in given), len(given)))
    return tuple(out)


def _all_values(specs: list[FieldSpec], answer: Any) -> list[list[Any]]:
    if not isinstance(answer, dict):
        return [[] for _ in specs]
    items_of: dict[str, Any] = {}
    out = []
    for spec in specs:
        whole, array, rest = _parts(spec.path, spec.array, spec.many)
        if array is None:
            out.append([_walk(answer, whole)])
            continue
        if spec.array not in items_of:
            items_of[spec.array] = _walk(answer, array)
        items = items_of[spec.array]
        out.append([] if not isinstance(items, list) else [_walk(item, rest) for item in items] if rest else list(items))
    return out


def _score_values(spec: FieldSpec, left: list[Any], right: list[Any], relative: float) -> tuple[int, int]:
    compared = correct = 0
    for i in range(max(len(left), len(right))):
        a = left[i] if i < len(left) else None
        b = right[i] if i < len(right) else None
        if a is None and b is None:
            continue
        compared += 1
        correct += same_value(spec, a, b, relative)
    return correct, compared


# -- a version -----------------------------------------------------------------------------


@dataclass
class FieldScore:
    spec: FieldSpec
    right: int = 0
    compared: int = 0
    results: int = 0  # results in which the field was compared

    def as_dict(self) -> dict[str, Any]:
        return {"field": self.spec.path, "kind": self.spec.kind, "results": self.results,
                **{k: v for k, v in Rate(self.right, self.compared).as_dict().items() if k != "count"},
                "right": self.right}


@dataclass
class Agreement:
    version: str | None
    results: int = 0
    unreviewed: int = 0
    approved: int = 0
    edited: int = 0
    rejected: int = 0
    fields: list[FieldScore] = field(default_factory=list)

    @property
    def reviewed(self) -> int:
        return self.approved + self.edited + self.rejected

    def rate(self, state: str) -> Rate:
        return Rate(getattr(self, state), self.reviewed)

    def as_dict(self) -> dict[str, Any]:
        return {"version": self.version, "results": self.results, "reviewed": self.reviewed,
                "unreviewed": self.unreviewed,
                **{state: self.rate(state).as_dict() for state in ("approved", "edited", "rejected")},
                "fields": [f.as_dict() for f in self.fields]}


class ScoredRow(Protocol):
    """What agreement reads of a scored result (``scores.Scored``)."""

    state: str  # its review state
    fields: tuple[tuple[int, int], ...] | None  # (right, compared) per schema field; None: not compared


def agreement(version: str | None, rows: Iterable[ScoredRow], specs: list[FieldSpec]) -> Agreement:
    """Rates and per-field accuracy of one adapter version's results, from their scores
    (``scores.score``: each field scored once for agreement and calibration alike)."""
    out = Agreement(version, fields=[FieldScore(spec) for spec in specs])
    for row in rows:
        out.results += 1
        if row.state == ReviewState.UNREVIEWED:
            out.unreviewed += 1
            continue
        if row.state == ReviewState.APPROVED:
            out.approved += 1
        elif row.state == ReviewState.EDITED:
            out.edited += 1
        else:
            out.rejected += 1
            continue
        if row.fields is None:
            continue  # a free-text answer: only the rates
        for total, (right, compared) in zip(out.fields, row.fields):
            total.right += right
            total.compared += compared
            total.results += compared > 0
    return out
