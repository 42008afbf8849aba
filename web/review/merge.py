"""A three-way merge of structured answers, for a reviewer whose save met another's change.

``base`` is the answer the reviewer's page showed, ``theirs`` what it is now, ``mine`` what
the reviewer posted. A field only one side changed takes that side's value; a field both
changed differently is a conflict and keeps the reviewer's value (they see both and decide).
Objects merge key by key, lists of equal length item by item (the second reviewer's period
of find 1 and the first's material of find 1 both survive); anything else is one value.
"""

from __future__ import annotations

from typing import Any

_ABSENT = object()


def merge3(base: Any, theirs: Any, mine: Any, path: str = "") -> tuple[Any, list[str]]:
    """The merged answer and the paths ("finds[0].material") both sides changed differently."""
    if mine == base or mine == theirs:
        return theirs, []
    if theirs == base:
        return mine, []
    if all(isinstance(v, dict) for v in (base, theirs, mine)):
        merged: dict[str, Any] = {}
        conflicts: list[str] = []
        for key in dict.fromkeys([*theirs, *mine]):
            value, found = merge3(base.get(key, _ABSENT), theirs.get(key, _ABSENT), mine.get(key, _ABSENT),
                                  f"{path}.{key}" if path else str(key))
            conflicts += found
            if value is not _ABSENT:
                merged[key] = value
        return merged, conflicts
    if all(isinstance(v, list) for v in (base, theirs, mine)) and len(base) == len(theirs) == len(mine):
        items, conflicts = [], []
        for index, (b, t, m) in enumerate(zip(base, theirs, mine)):
            value, found = merge3(b, t, m, f"{path}[{index}]")
            items.append(value)
            conflicts += found
        return items, conflicts
    return mine, [path or "the answer"]
