"""JSON Merge Patch (RFC 7396): a partial edit of a structured answer.

An object in the patch merges into the target member by member; ``null`` removes a member;
anything else (a string, a number, an array) replaces the target's value whole, so an array
of finds is sent whole or not at all. The result is then validated against the scenario's
schema like any edit.
"""

from __future__ import annotations

import copy
from typing import Any

MEDIA_TYPE = "application/merge-patch+json"


def merge_patch(target: Any, patch: Any) -> Any:
    """The RFC's MergePatch(Target, Patch); ``target`` is not changed."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged
