"""Characters that change how a name reads without being seen.

Bidi controls reorder what follows them ("report\\u202Efdp.mp4" reads "reportpdf.mp4" while it
is an .mp4; a user named "\\u202Enimda" reads "admin"), and zero-width characters make a twin of
an existing name. Pages show each as a visible mark (``visible``), exports flag the names that
hold any (``warning``), and new usernames may not contain them. The pattern is plain ASCII
escapes, so the pages' scripts use the very same one (base.html's data-invisible).
"""

from __future__ import annotations

import re

PATTERN = r"[\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]"
INVISIBLE = re.compile(PATTERN)


def mark(char: str) -> str:
    return f"[U+{ord(char):04X}]"


def visible(text: str | None) -> str | None:
    """``text`` with each invisible or direction-changing character shown as [U+XXXX]."""
    if not text:
        return text
    return INVISIBLE.sub(lambda m: mark(m.group()), text)


def warning(text: str | None) -> str | None:
    """A flag for exports: which such characters a name holds, or None."""
    found = sorted(set(INVISIBLE.findall(text or "")))
    if not found:
        return None
    return "holds invisible or direction-changing characters: " + " ".join(mark(c) for c in found)
