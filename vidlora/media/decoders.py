"""Decoder backends behind one interface, and the rule that orders them per container.

Interface: ``decode(path, table, picks, size, threads, emit) -> list[int]``

- ``table``: the demuxer's frame table (``ffprobe.FrameTable``), the shared reference.
- ``picks``: ascending, unique indices into ``table`` to deliver.
- ``size``: (w, h) in *stored* orientation (rotation is applied by the caller, the same way for
  every backend).
- ``emit(k, rgb)`` receives the k-th delivered frame as an ``HxWx3`` uint8 array.
- returns the pts (table units) of the frames delivered, in order. The caller checks them
  against the requested picks: a backend that delivers another frame than asked fails the
  *timestamp-exactness check* and the next backend is tried. The one exception is a damaged
  pick (below): its replacement is an earlier frame of its own segment, and its pts says so.

Damage: PyAV and ffmpeg report decoding errors (PyAV's ``frame.is_corrupt``; ffmpeg's decoder
error lines before each frame). A frame is *dirty* when it, or any frame since the last clean
keyframe it depends on, decoded with errors. A dirty pick is replaced by the nearest clean frame
before it that lies after the previous pick (PyAV); when there is none (or the backend cannot
re-seek: ffmpeg), ``Damaged`` is raised, and the caller rejects the video with the count rather
than store smeared pictures. decord reports no errors, so it is tried only after PyAV.

These functions run only inside the decode worker subprocess (``decode_worker.py``); the native
libraries are imported lazily there, never in the parent.

Backend order (``default_backends``), from the measurements in DESIGN.md "Decoding":

- H.264 in MP4/MOV: PyAV, then decord, then ffmpeg. decord was first (exact here, and the
  decoder the design named) until damaged files were found stored as normal samples: decord
  cannot say a frame decoded with errors, PyAV can, at the same CPU cost
  (bench/results/sampling.md: PyAV 0.92-0.99x decord's CPU seconds).
- AVI, MPEG-PS, MPEG-TS and raw elementary streams: ffmpeg only. Every seek-based library
  (decord, PyAV, decord2) returned neighbouring frames there; a sequential decode through the
  ffmpeg CLI with ``select`` on exact pts is the only trustworthy path.
- Everything else (WebM/VP9, MKV, AV1, HEVC, ProRes, ...): PyAV, then ffmpeg. decord 0.6.0
  has no AV1, fails VP9 WebM, and its FFmpeg 4.1 is old; PyAV (FFmpeg 8) decoded every codec
  tried and is exact when it seeks by the packet table, as here.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from bisect import bisect_right
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from vidlora.media.ffprobe import FFMPEG, FrameTable
from vidlora.media.probe import ProbeInfo

if TYPE_CHECKING:  # numpy is imported lazily: the parent process should not load OpenBLAS threads
    import numpy as np

Emit = Callable[[int, "np.ndarray"], None]

BACKENDS = ("decord", "pyav", "ffmpeg")
# Containers where only a sequential decode is exact (see module docstring).
SEQUENTIAL_ONLY = frozenset({
    "avi", "mpeg", "mpegts", "mpegtsraw", "mpegvideo", "h264", "hevc", "m4v", "mjpeg", "vc1",
    "cavsvideo", "rawvideo", "yuv4mpegpipe", "obu", "h261", "h263",
})
DECORD_SAFE = {("mp4", "h264"), ("mov", "h264")}


class Mismatch(Exception):
    """The backend's view of the frames disagrees with the demuxer's frame table."""


class Damaged(Exception):
    """Picks (table indices) that decode only with errors and have no clean replacement."""

    def __init__(self, picks: list[int], sampled: int):
        super().__init__(f"{len(picks)} of {sampled} sampled frames decode with errors")
        self.picks, self.sampled = picks, sampled


def default_backends(info: ProbeInfo) -> list[str]:
    if info.container in SEQUENTIAL_ONLY:
        return ["ffmpeg"]
    if (info.container, info.codec) in DECORD_SAFE:
        return ["pyav", "decord", "ffmpeg"]
    return ["pyav", "ffmpeg"]


def decode(backend: str, path: Path, table: FrameTable, picks: list[int], size: tuple[int, int],
           threads: int, emit: Emit, rotation: int = 0, replaced: list[int] | None = None) -> list[int]:
    """``replaced`` (if given) receives the picks that were delivered as an earlier clean frame."""
    if backend == "decord":
        return decode_decord(path, table, picks, size, threads, emit, rotation)
    if backend == "pyav":
        return decode_pyav(path, table, picks, size, threads, emit, replaced)
    return decode_ffmpeg(path, table, picks, size, threads, emit)


# -- decord -----------------------------------------------------------------------------------

def decode_decord(path: Path, table: FrameTable, picks: list[int], size: tuple[int, int],
                  threads: int, emit: Emit, rotation: int = 0) -> list[int]:
    import decord
    import numpy as np

    # decord 0.6.0 applies the display rotation itself (unlike PyAV and ffmpeg -noautorotate),
    # and width/height then mean the displayed size. We ask for that and turn the frames back to
    # stored orientation, so the caller's single rotation step stays the same for all backends.
    w, h = (size[1], size[0]) if rotation in (90, 270) else size
    # num_threads=0 (decord's default) breaks VP9; an explicit count is safe everywhere.
    vr = decord.VideoReader(str(path), ctx=decord.cpu(0), width=w, height=h, num_threads=max(1, threads))
    n = len(vr)
    if n != len(table.pts):
        raise Mismatch(f"decord sees {n} frames, the demuxer {len(table.pts)}")
    starts = vr.get_frame_timestamp(list(range(n)))[:, 0].astype(np.float64)
    ref = np.asarray(table.times())
    # decord keeps float32 seconds since the first frame: allow its rounding, but never as much
    # as half the shortest frame gap (that would be a different frame).
    gaps = np.diff(ref)
    tol = max(1e-3, 3e-7 * float(ref[-1]))
    if len(gaps):
        tol = min(tol, 0.45 * float(gaps.min()))
    bad = np.flatnonzero(np.abs(starts - ref) > tol)
    if len(bad):
        i = int(bad[0])
        raise Mismatch(f"decord frame {i} at {starts[i]:.4f} s, demuxer says {ref[i]:.4f} s")
    k = 0
    for chunk in range(0, len(picks), 16):  # bounded memory for long pick lists
        idx = picks[chunk:chunk + 16]
        for arr in vr.get_batch(idx).asnumpy():
            if arr.shape[:2] != (h, w):
                raise Mismatch(f"decord returned {arr.shape[1]}x{arr.shape[0]}, asked {w}x{h}")
            if rotation:  # undo decord's clockwise display rotation (np.rot90 turns ccw)
                arr = np.ascontiguousarray(np.rot90(arr, k=rotation // 90))
            emit(k, arr)
            k += 1
    return [table.pts[i] for i in picks]


# -- PyAV ---------------------------------------------------------------------------------------

def decode_pyav(path: Path, table: FrameTable, picks: list[int], size: tuple[int, int],
                threads: int, emit: Emit, replaced: list[int] | None = None) -> list[int]:
    import av
    import av.logging

    key_idx = [i for i, k in enumerate(table.keyframe) if k]
    index_of = {p: i for i, p in enumerate(table.pts)}
    delivered: list[int] = []
    damaged: list[int] = []
    # FFmpeg's own error messages count as damage too: some decoders (VP9) never flag a frame,
    # and a damaged container shows only in the demuxer's complaints.
    av.logging.set_level(av.logging.ERROR)
    with av.logging.Capture() as logs, av.open(str(path)) as container:
        seen_logs = len(logs)
        stream = container.streams.video[0]
        # One decoding thread: FFmpeg logs from its frame threads into PyAV's log capture, and
        # that deadlocks (seen: 2 of 3 damaged H.264 runs hung until the timeout). CPU seconds
        # are the same; this runs in one process per video, and videos run side by side.
        stream.thread_type = "NONE"
        stream.codec_context.thread_count = 1
        frames = None
        last_pts: int | None = None
        dirty = False  # this frame, or one since the last clean keyframe, decoded with errors
        last_clean = None  # (pts, frame): the latest clean frame decoded, a replacement candidate
        floor = None  # a replacement must come after the previous pick
        for k, i in enumerate(picks):
            want = table.pts[i]
            kf = table.pts[key_idx[max(0, bisect_right(key_idx, i) - 1)]]
            # Seek (by the packet table's keyframe, so we never land after the target) unless
            # decoding on from where we are is at least as cheap.
            if frames is None or last_pts is None or kf > last_pts:
                container.seek(kf, backward=True, any_frame=False, stream=stream)
                frames = container.decode(stream)
                last_pts, dirty, last_clean = None, False, None
            got, lost = None, False
            try:
                for frame in frames:
                    if frame.pts is None:
                        raise Mismatch("PyAV frame without pts")
                    last_pts = frame.pts
                    bad = frame.is_corrupt or len(logs) > seen_logs
                    seen_logs = len(logs)
                    dirty = bad if frame.key_frame else (dirty or bad)
                    if frame.pts == want:
                        got = frame
                        break
                    if frame.pts > want:
                        if dirty:  # the decoder dropped the target on damaged data
                            raise av.error.InvalidDataError(0, "frame lost to damaged data")
                        raise Mismatch(f"PyAV skipped pts {want} (next frame {frame.pts})")
                    if not dirty:
                        last_clean = (frame.pts, frame)
            except av.error.InvalidDataError:
                # The decoder refused a packet on the way to this pick: damaged data. The next
                # pick starts from its own keyframe.
                frames, last_pts, lost = None, None, True
            if got is None and not lost:
                raise Mismatch(f"PyAV ended before pts {want}")
            if dirty or lost:  # the nearest clean frame of this segment, or none
                if last_clean is None or (floor is not None and last_clean[0] <= floor) \
                        or last_clean[0] not in index_of:
                    damaged.append(i)
                    continue
                want, got = last_clean
                if replaced is not None:
                    replaced.append(i)
            emit(k, got.to_ndarray(width=size[0], height=size[1], format="rgb24", interpolation="BICUBIC"))
            delivered.append(want)
            floor = table.pts[i]
            if not (dirty or lost):
                last_clean = (got.pts, got)
    if damaged:
        raise Damaged(damaged, len(picks))
    return delivered


# -- ffmpeg CLI ---------------------------------------------------------------------------------

_SHOWINFO = re.compile(r"Parsed_showinfo_(\d+).*\bn:\s*\d+\s+pts:\s*(-?\d+).*\biskey:(\d)")
# A decoder's complaint about the frame it is decoding ("[h264 @ 0x..] error while decoding MB",
# "concealing ... errors", "Invalid NAL unit size"); demuxer/muxer lines are not frames'.
_DECODE_ERROR = re.compile(r"^\[(?!Parsed_|mov,|matroska|mpeg(?:ts)? @|avi @|NULL @)[\w-]+ @ 0x[0-9a-f]+\].*"
                           r"(?:error|conceal|invalid|corrupt|missing)", re.IGNORECASE)


def decode_ffmpeg(path: Path, table: FrameTable, picks: list[int], size: tuple[int, int],
                  threads: int, emit: Emit) -> list[int]:
    """Sequential decode; ``select`` keeps exactly the picked pts, ``showinfo`` reports them.

    ``-copyts`` keeps the container's raw pts (the filter time base is the stream's), so the
    selection is integer-exact; ``-noautorotate`` because rotation is applied by the caller.
    """
    import numpy as np

    w, h = size
    # Frames are picked by pts; in a file without timestamps, by their index in decode order.
    expr = _any_of([f"eq(n,{i})" if table.synthetic else f"eq(pts,{table.pts[i]})" for i in picks])
    # The first showinfo sees every decoded frame (to place decoder errors), the last the picks.
    vf = f"showinfo,select='{expr}',scale={w}:{h}:flags=bicubic,format=rgb24,showinfo"
    cmd = [FFMPEG, "-nostdin", "-hide_banner", "-loglevel", "info", "-copyts", "-noautorotate",
           "-threads", str(threads or 0), "-i", str(path), "-map", "0:v:0", "-an", "-sn", "-dn",
           "-vf", vf, "-vsync", "passthrough", "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"]
    frame_bytes = w * h * 3
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL)
        k = 0
        try:
            while True:
                buf = _read_exact(proc.stdout, frame_bytes)
                if buf is None:
                    break
                emit(k, np.frombuffer(buf, np.uint8).reshape(h, w, 3))
                k += 1
        finally:
            proc.stdout.close()
            rc = proc.wait()
        err.seek(0)
        log = err.read().decode("utf-8", "replace")
    if rc != 0:  # report the first error line, not the generic "Conversion failed!"
        errs = [ln for ln in log.splitlines() if "rror" in ln or "nvalid" in ln] or [f"exit {rc}"]
        raise RuntimeError(f"ffmpeg failed: {errs[0][:200]}")
    pts, dirty_at = _read_showinfo(log)
    if len(pts) != k:
        raise Mismatch(f"ffmpeg delivered {k} frames but reported {len(pts)} timestamps")
    if table.synthetic:  # showinfo's n is the output count; the selection by index is exact
        if k != len(picks):
            return pts
        pts = [table.pts[i] for i in picks]
        damaged = [i for n, i in enumerate(picks) if dirty_at.get(("n", i))]
    else:
        damaged = [i for i in picks if dirty_at.get(table.pts[i])]
    if damaged:
        raise Damaged(damaged, len(picks))
    return pts


def _read_showinfo(log: str) -> tuple[list[int], dict]:
    """(pts of the delivered frames, {pts or ("n", index): True for every dirty decoded frame})."""
    delivered: list[int] = []
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
        dirty = bool(errors) if key else (dirty or bool(errors))
        errors = 0
        if dirty:
            dirty_at[p] = dirty_at[("n", n)] = True
        n += 1
    return delivered, dirty_at


def _any_of(terms: list[str]) -> str:
    """OR of terms as a balanced tree: ffmpeg's expression parser rejects a flat chain of ~100+."""
    if len(terms) <= 8:
        return "+".join(terms)
    mid = len(terms) // 2
    return f"({_any_of(terms[:mid])})+({_any_of(terms[mid:])})"


def _read_exact(stream, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        b = stream.read(n - got)
        if not b:
            if got:
                raise RuntimeError("ffmpeg output ended mid-frame")
            return None
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def default_threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))
