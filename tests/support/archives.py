"""Archives built in memory, as a user's zip arrives: members in the order given, names as given
(duplicates and unnormalised names included, which is what the ingest tests need)."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterable


def zip_bytes(members: Iterable[tuple[str, bytes]], compression: int = zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as zf:
        for name, data in members:
            zf.writestr(name, data)
    return buf.getvalue()
