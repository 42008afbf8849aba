"""Does a Matroska or MP4 file end part-way through its own structure?

That is how a copy taken while the recording was still being written ends (a recorder writing
MKV or fragmented MP4, a file still arriving on a share), and how a copy cut short ends: the
last element or box says it is longer than what the file holds. Such a file is analysed as
far as it goes and flagged partial, as a transport stream that ends mid-packet is
(``ffprobe.cut_mid_packet``). Only headers are read: a few bytes per cluster or fragment.
"""

from __future__ import annotations

from pathlib import Path

# A walk that meets this many elements without reaching the end gives up (says "not cut"):
# only clusters of unknown size (some live writers) are walked block by block.
MAX_STEPS = 200_000
_SEGMENT = 0x18538067


def cut_mid_element(path: Path) -> bool:
    """A Matroska/WebM file whose last element (a cluster, usually) runs past the file's end.
    Elements of unknown size (a segment or cluster written by a live muxer) are entered, not
    skipped; anything unreadable counts as "not cut": this only ever adds a partial notice."""
    size = Path(path).stat().st_size
    with open(path, "rb") as f:
        pos, steps = 0, 0
        while pos < size and steps < MAX_STEPS:
            steps += 1
            f.seek(pos)
            head = f.read(12)
            id_len = _vint_len(head[0])
            if not id_len or id_len > 4:
                return False  # not an element: nothing to say
            if len(head) < id_len + 1:
                return True  # an element header cut in two
            size_len = _vint_len(head[id_len])
            if not size_len:
                return False
            if len(head) < id_len + size_len:
                return True
            ident = int.from_bytes(head[:id_len], "big")
            raw = int.from_bytes(head[id_len:id_len + size_len], "big") & ((1 << (7 * size_len)) - 1)
            body = pos + id_len + size_len
            if raw == (1 << (7 * size_len)) - 1 or ident == _SEGMENT:
                pos = body  # unknown size, or the segment: walk its children
                continue
            pos = body + raw
        return pos > size


def cut_mid_box(path: Path) -> bool:
    """An MP4/MOV file whose last top-level box (an ``mdat``, or a fragment's ``moof``/``mdat``)
    runs past the file's end."""
    size = Path(path).stat().st_size
    with open(path, "rb") as f:
        pos, steps = 0, 0
        while pos < size and steps < MAX_STEPS:
            steps += 1
            f.seek(pos)
            head = f.read(16)
            if len(head) < 8:
                return True  # a box header cut in two
            length = int.from_bytes(head[:4], "big")
            if length == 1:
                if len(head) < 16:
                    return True
                length = int.from_bytes(head[8:16], "big")
            elif length == 0:
                return False  # "to the end of the file": a box that cannot be cut short by its size
            if length < 8:
                return False  # not a box: nothing to say
            pos += length
        return pos > size


def _vint_len(first: int) -> int:
    """Length of an EBML variable-size integer from its first byte (0: invalid)."""
    for n in range(8):
        if first & (0x80 >> n):
            return n + 1
    return 0
