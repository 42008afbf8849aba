"""Names as people type them: one Unicode form (NFC) for storing and comparing.

A Mac sends ``Ölgefäß`` decomposed (NFD: ``O`` + combining diaeresis), Windows and Linux
composed (NFC); both draw the same, so a batch showed two "identical" names and a typed search
missed the decomposed ones. NFC, not NFKC: only the form changes, never what was typed
(``²``, ``ﬁ`` and full-width letters stay as sent), so the page shows what the person sent.
"""

from __future__ import annotations

import unicodedata


def canonical(name: str) -> str:
    """``name`` in NFC: how names are stored, compared and searched."""
    return unicodedata.normalize("NFC", name)
