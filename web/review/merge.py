"""A three-way merge of structured answers, for a reviewer whose save met another's change.

``base`` is the answer the reviewer's page showed, ``theirs`` what it is now, ``mine`` what
the reviewer posted. A field only one side changed takes that side's value; a field both
changed differently is a conflict and keeps the reviewer's value (they see both and decide).
Objects merge key by key. Lists merge item by item *by identity*: each side's list is aligned
with the base (equal items first, then items changed in place), so an item one side removed
is gone from the merge, one side's added items are added, and an item both kept merges field
by field. An item the other reviewer removed never comes back: where this reviewer had
changed it, it stays removed and is named (``Removed``) so the page can say so.
"""

from __future__ import annotations

import json
from difflib import SequenceMatcher
from typing import Any

_ABSENT = object()


class Removed(str):
    """A conflict path ("chambers[1]") whose item the other reviewer removed while this one
    changed it: the merge leaves it removed (adding it back is the reviewer's explicit act)."""


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
    if all(isinstance(v, list) for v in (base, theirs, mine)):
        return _merge_lists(base, theirs, mine, path)
    return mine, [path or "the answer"]


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _likeness(a: Any, b: Any) -> int:
    """How much of an item survived a change: the fields two objects share unchanged."""
    if isinstance(a, dict) and isinstance(b, dict):
        return sum(1 for k, v in a.items() if k in b and b[k] == v)
    return 0


def _align(base: list, side: list) -> tuple[dict[int, int], list[int]]:
    """base index -> side index of each base item the side kept (as it was, or changed in
    place), and the side's indices of items it added."""
    kept: dict[int, int] = {}
    added: list[int] = []
    matcher = SequenceMatcher(None, [_key(v) for v in base], [_key(v) for v in side], autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal" or (op == "replace" and i2 - i1 == j2 - j1):
            kept.update(zip(range(i1, i2), range(j1, j2)))
            continue
        # Items removed and others added or changed in one stretch: a changed item is the one
        # still most like its old self (in order); what is left was removed or added.
        after = j1
        for i in range(i1, i2):
            scores = [(_likeness(base[i], side[j]), -j) for j in range(after, j2)]
            best = max(scores, default=(0, 0))
            if best[0] > 0:
                kept[i] = -best[1]
                after = -best[1] + 1
        paired = set(kept.values())
        added += [j for j in range(j1, j2) if j not in paired]
    return kept, added


def _merge_lists(base: list, theirs: list, mine: list, path: str) -> tuple[list, list[str]]:
    in_theirs, their_new = _align(base, theirs)
    in_mine, my_new = _align(base, mine)
    conflicts: list[str] = []
    # Each base item as the merge keeps it (or _ABSENT), found by its place in their list.
    by_their_index: dict[int, Any] = {}
    for i, old in enumerate(base):
        label = f"{path}[{i}]"
        t, m = in_theirs.get(i), in_mine.get(i)
        if t is None:
            if m is not None and mine[m] != old:
                conflicts.append(Removed(label))  # they removed it, I changed it: stays removed
            continue
        if m is None:
            if theirs[t] != old:
                conflicts.append(label)  # I removed it, they changed it: my removal holds
            continue
        value, found = merge3(old, theirs[t], mine[m], label)
        conflicts += found
        by_their_index[t] = value
    # My added items go after the kept item that precedes them in my list (or first).
    mine_base = {m: i for i, m in in_mine.items()}
    their_keys = {_key(theirs[t]) for t in their_new}
    after: dict[int | None, list[Any]] = {}
    for j in my_new:
        if _key(mine[j]) in their_keys:
            continue  # both added the same item
        anchor = next((in_theirs[mine_base[k]] for k in range(j - 1, -1, -1)
                       if k in mine_base and in_theirs.get(mine_base[k]) in by_their_index), None)
        after.setdefault(anchor, []).append(mine[j])
    merged: list[Any] = list(after.get(None, []))
    for t, item in enumerate(theirs):
        if t in by_their_index:
            merged.append(by_their_index[t])
            merged += after.get(t, [])
        elif t in their_new:
            merged.append(item)  # theirs added it
    return merged, conflicts
