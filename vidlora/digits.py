"""Whole numbers as the ASCII digits 0-9, and nothing else.

``str.isdigit`` is true for ``"²"`` and ``"①"``, which ``int`` then refuses (a ValueError that
surfaced as a 500); ``int`` itself takes Arabic-Indic digits, spaces and ``1_000``. A version,
an index or an id typed or sent by a client is read here, so every caller agrees on what a
number is and none can be tripped.
"""

from __future__ import annotations

import re

_DIGITS = re.compile(r"[0-9]+")
_SIGNED = re.compile(r"[+-]?[0-9]+")


def whole_number(text: str | None, most_digits: int = 11) -> int | None:
    """``text`` as a non-negative int when it is 1..``most_digits`` ASCII digits, else None."""
    if text is None or len(text) > most_digits or not _DIGITS.fullmatch(text):
        return None
    return int(text)


def signed_whole_number(text: str | None, most_digits: int = 18) -> int | None:
    """``text`` as an int when it is ASCII digits with an optional sign, else None."""
    if text is None or len(text) > most_digits + 1 or not _SIGNED.fullmatch(text):
        return None
    return int(text)
