"""A word-level diff of two texts as (op, text) pieces; templates render them escaped."""

from __future__ import annotations

import difflib
import re

_TOKENS = re.compile(r"\s+|[^\s]+")


def word_diff(before: str, after: str) -> list[tuple[str, str]]:
    """Pieces tagged "same", "del" or "ins"; words and whitespace are kept as written."""
    a, b = _TOKENS.findall(before), _TOKENS.findall(after)
    pieces: list[tuple[str, str]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            pieces.append(("same", "".join(a[i1:i2])))
            continue
        if op in ("delete", "replace"):
            pieces.append(("del", "".join(a[i1:i2])))
        if op in ("insert", "replace"):
            pieces.append(("ins", "".join(b[j1:j2])))
    return pieces
