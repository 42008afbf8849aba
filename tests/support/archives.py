"""Archives built in memory, as a user's zip arrives: members in the order given, names as given
(duplicates and unnormalised names included, which is what the ingest tests need)."""

from __future__ import annotations

import io
import tarfile
import zipfile
from collections.abc import Iterable


def zip_bytes(members: Iterable[tuple[str, bytes]], compression: int = zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as zf:
        for name, data in members:
            zf.writestr(name, data)
    return buf.getvalue()


def tar_bytes(members: Iterable[tuple[str, bytes]], mode: str = "w") -> bytes:
    """A tar (``mode`` "w:gz" etc. for a compressed one) with the members in the order given."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()
