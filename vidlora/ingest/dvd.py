"""DVD title sets: ``VTS_nn_1.VOB``, ``VTS_nn_2.VOB``, ... are one recording.

A DVD keeps each title set's video as one MPEG program stream cut into files of at most 1 GB
(``VTS_01_1.VOB`` .. ``VTS_01_3.VOB``), at pack boundaries, wherever the size limit fell: in
the middle of a GOP, with the clock running on into the next file. Taken one by one they are
three videos, each clock from 0, and the pictures at each seam (those whose GOP started in
the previous file) are analysed nowhere. Joined in part order they are the title as the
player shows it. ``VTS_nn_0.VOB`` is the set's menu, not part of the title.

The parts are found by name; the set's ``VTS_nn_0.IFO``, where it is there, says how many
bytes of title video the set holds, so a missing part is said, not silently skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import BinaryIO, Callable

_PART = re.compile(r"^(?P<dir>(?:.*/)?)VTS_(?P<set>\d\d)_(?P<part>[1-9])\.VOB$", re.IGNORECASE)
_IFO = re.compile(r"^(?P<dir>(?:.*/)?)VTS_(?P<set>\d\d)_0\.IFO$", re.IGNORECASE)
SECTOR = 2048
CHUNK = 1024 * 1024
JOINED = "joined"  # the stable code of a part's reason
INCOMPLETE = "incomplete_title"


@dataclass(frozen=True)
class Title:
    name: str  # what the joined video is called: "VIDEO_TS/VTS_01_1-3.VOB"
    parts: tuple[str, ...]  # the parts' names, in part order
    ifo: str | None  # the set's IFO, where the archive or folder has it

    def part_reason(self, part: str) -> str:
        k = self.parts.index(part) + 1
        return f"{JOINED}: part {k} of {len(self.parts)} of a DVD title, stored joined as {self.name}"


def is_part(name: str) -> bool:
    """A title part's name (``VTS_nn_k.VOB``, k >= 1), wherever it stands."""
    return _PART.match(name) is not None


def is_ifo(name: str) -> bool:
    """A title set's IFO (``VTS_nn_0.IFO``)."""
    return _IFO.match(name) is not None


def titles(names: list[str]) -> dict[str, Title]:
    """Each part's name -> its title, for every title set of two or more parts (one part is
    a video on its own, as it always was)."""
    sets: dict[tuple[str, str], dict[int, str]] = {}
    ifos: dict[tuple[str, str], str] = {}
    for name in names:
        if (m := _PART.match(name)) is not None:
            sets.setdefault((m["dir"], m["set"]), {})[int(m["part"])] = name
        elif (m := _IFO.match(name)) is not None:
            ifos[(m["dir"], m["set"])] = name
    out: dict[str, Title] = {}
    for key, parts in sets.items():
        if len(parts) < 2:
            continue
        order = tuple(parts[k] for k in sorted(parts))
        first, last = min(parts), max(parts)
        stem = order[0].rsplit("/", 1)[-1]
        name = f"{key[0]}{stem[:7]}{first}-{last}{stem[8:]}"  # VTS_01_1.VOB -> VTS_01_1-3.VOB
        title = Title(name, order, ifos.get(key))
        out.update({p: title for p in order})
    return out


def ifo_title_bytes(head: bytes) -> int | None:
    """Bytes of title video a title set's IFO declares (its VTSI_MAT: the set's last sector,
    the IFO's last sector, and where the title VOBs start; the backup IFO follows them), or
    None if ``head`` is no VTS IFO."""
    if len(head) < 0xC8 or head[:12] != b"DVDVIDEO-VTS":
        return None
    last_set = int.from_bytes(head[0x0C:0x10], "big")
    last_ifo = int.from_bytes(head[0x1C:0x20], "big")
    title_start = int.from_bytes(head[0xC4:0xC8], "big")
    sectors = last_set - last_ifo - title_start
    return sectors * SECTOR if title_start and sectors > 0 else None


def incomplete(title: Title, sizes: list[int], declared: int | None) -> str | None:
    """Why the joined title is not the whole title, in words (None: nothing is missing)."""
    numbers = [int(_PART.match(p)["part"]) for p in title.parts]  # type: ignore[index]
    gaps = sorted(set(range(1, max(numbers) + 1)) - set(numbers))
    if gaps:
        which = ", ".join(f"VTS_xx_{k}.VOB" for k in gaps).replace("xx", title.parts[0].rsplit("/", 1)[-1][4:6])
        return f"{INCOMPLETE}: {which} of this DVD title is missing; the parts were joined without it"
    if declared is not None and sum(sizes) < declared:
        return (f"{INCOMPLETE}: the title set's IFO declares {declared:,} bytes of video, its parts hold "
                f"{sum(sizes):,}: a part is missing or cut short")
    return None


class Joined:
    """The parts read one after another, as one stream (each opened when the one before ends)."""

    def __init__(self, opens: list[Callable[[], BinaryIO]]) -> None:
        self._opens = list(opens)
        self._current: BinaryIO | None = None

    def read(self, n: int = -1) -> bytes:
        while True:
            if self._current is None:
                if not self._opens:
                    return b""
                self._current = self._opens.pop(0)()
            data = self._current.read(n if n >= 0 else CHUNK)  # never a whole 1 GB part at once
            if data:
                return data
            self._current.close()
            self._current = None

    def close(self) -> None:
        if self._current is not None:
            self._current.close()
            self._current = None
        self._opens = []
