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
  (decord, PyAV, decord2) returned neighbouring frames there. The ffmpeg backend seeks too,
  but by the packet table, not by the library's guess: it starts at a keyframe's byte offset
  (TS/PS) or indexed time (AVI), and a pass counts only if that keyframe and every pick come out
  with their exact pts; otherwise it falls back to decoding from the start (``decode_ffmpeg``).
  Long TS/PS/AVI files used to be decoded start to end once per policy (41 CPU-s for 10 min of
  720p TS; bench/results/footage_cost.md has the cost now).
- Interlaced video (``ProbeInfo.interlaced``): ffmpeg only, deinterlaced by ``bwdif`` before
  the resize; PyAV and decord would deliver combed pictures.
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
from vidlora.media.ffprobe import read_showinfo as _read_showinfo
from vidlora.media.probe import ProbeInfo

if TYPE_CHECKING:  # numpy is imported lazily: the parent process should not load OpenBLAS threads
    import numpy as np

Emit = Callable[[int, "np.ndarray"], None]

BACKENDS = ("decord", "pyav", "ffmpeg")
# Containers where only the ffmpeg backend, seeking by the packet table, is exact (see above).
SEQUENTIAL_ONLY = frozenset({
    "avi", "mpeg", "mpegts", "mpegtsraw", "mpegvideo", "h264", "hevc", "m4v", "mjpeg", "vc1",
    "cavsvideo", "rawvideo", "yuv4mpegpipe", "obu", "h261", "h263",
})
DECORD_SAFE = {("mp4", "h264"), ("mov", "h264")}


# Codecs whose I-frames may open a GOP that the previous one's pictures complete (the
# pictures shown before the I-frame reference it and the GOP before). A VP9/AV1 keyframe
# resets the decoder: an error at one is damage, and decoding it again from further back
# would only let the demuxer's complaint about a damaged cluster go unheard.
OPEN_GOP_CODECS = frozenset({"h264", "hevc", "mpeg2video", "vc1"})


# What a decoder says, before the first keyframe of a stream comes out, about the leading
# pictures of an open GOP whose references were cut away with the GOP before it (a recording
# trimmed with -c copy). ffmpeg drops those pictures and shows the rest whole; so does PyAV.
_LEADING = re.compile(r"mmco: unref short failure|reference picture missing|Missing reference picture|"
                      r"co located POCs unavailable|Frame num gap|number of reference frames")


def leading_only(said) -> bool:
    """Every line of a decoder's log (PyAV's (level, name, message) or text lines) is one
    of ``_LEADING``'s."""
    return all(_LEADING.search(x[-1] if isinstance(x, tuple) else str(x)) for x in said)


class Mismatch(Exception):
    """The backend's view of the frames disagrees with the demuxer's frame table."""


class Damaged(Exception):
    """Picks (table indices) that decode only with errors and have no clean replacement."""

    def __init__(self, picks: list[int], sampled: int):
        super().__init__(f"{len(picks)} of {sampled} sampled frames decode with errors")
        self.picks, self.sampled = picks, sampled


def default_backends(info: ProbeInfo) -> list[str]:
    if info.container in SEQUENTIAL_ONLY or info.interlaced:
        return ["ffmpeg"]
    if (info.container, info.codec) in DECORD_SAFE:
        return ["pyav", "decord", "ffmpeg"]
    return ["pyav", "ffmpeg"]


def decode(backend: str, path: Path, table: FrameTable, picks: list[int], size: tuple[int, int],
           threads: int, emit: Emit, rotation: int = 0, replaced: list[int] | None = None,
           deinterlace: bool = False, container: str = "", floor: int = -1,
           notes: list[str] | None = None) -> list[int]:
    """``replaced`` (if given) receives the picks that were delivered as an earlier clean frame;
    such a replacement never lies at or before table index ``floor`` (a window's start).
    ``deinterlace``: only the ffmpeg backend deinterlaces; the others refuse (Mismatch), so an
    interlaced video is never stored combed."""
    if deinterlace and backend != "ffmpeg":
        raise Mismatch(f"{backend} cannot deinterlace")
    if len(table.segments) > 1 and backend != "ffmpeg":
        raise Mismatch(f"{backend} cannot follow timestamps that start over (a joined recording)")
    if backend == "decord":
        return decode_decord(path, table, picks, size, threads, emit, rotation)
    if backend == "pyav":
        return decode_pyav(path, table, picks, size, threads, emit, replaced, floor)
    return decode_ffmpeg(path, table, picks, size, threads, emit, deinterlace, container, notes)


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
                threads: int, emit: Emit, replaced: list[int] | None = None, floor_index: int = -1) -> list[int]:
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
        # A replacement must come after the previous pick, and after the window's start.
        floor = table.pts[floor_index] if floor_index >= 0 else None
        for k, i in enumerate(picks):
            want = table.pts[i]
            at_key = max(0, bisect_right(key_idx, i) - 1)
            # back = 1: an open GOP (broadcast, AVCHD remuxed to MP4/MKV). After a seek to its
            # keyframe the decoder drops the pictures shown before it, which reference the
            # previous GOP, and logs that ("mmco: unref short failure") before the keyframe
            # comes out. Such a pick is decoded again from one keyframe earlier, where every
            # reference exists: clean there means the file is clean, damage stays damage.
            for back in (0, 1):
                kf = table.pts[key_idx[max(0, at_key - back)]]
                sought = bool(back) or frames is None or last_pts is None or kf > last_pts
                # Seek (by the packet table's keyframe, so we never land after the target) unless
                # decoding on from where we are is at least as cheap.
                if sought:
                    container.seek(kf, backward=True, any_frame=False, stream=stream)
                    frames = container.decode(stream)
                    last_pts, dirty, last_clean = None, False, None
                got, lost, first_dirty = None, False, None
                try:
                    for frame in frames:
                        if frame.pts is None:
                            raise Mismatch("PyAV frame without pts")
                        last_pts = frame.pts
                        said = logs[seen_logs:]
                        seen_logs = len(logs)
                        if said and first_dirty is None and sought and at_key == 0 and frame.key_frame \
                                and stream.codec_context.name in OPEN_GOP_CODECS and leading_only(said):
                            said = []  # the first GOP's leading pictures: nothing before it to step back to
                        bad = frame.is_corrupt or bool(said)
                        first_dirty = bad if first_dirty is None else first_dirty
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
                if (dirty or lost) and sought and not back and at_key > 0 and first_dirty is not False \
                        and stream.codec_context.name in OPEN_GOP_CODECS:
                    frames, last_pts = None, None
                    continue
                break
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

DEINTERLACE = "bwdif=mode=send_frame:parity=auto:deint=all"
# Picks whose keyframes lie this close together are decoded in one pass: starting a process
# costs about as much as decoding a couple of seconds of video.
MERGE_S = 2.0
# Containers read from a byte offset (the demuxer finds its streams from any packet there);
# the others seek by time, through the container's index.
BYTE_SEEK = frozenset({"mpegts", "mpegtsraw", "mpeg"})


class _Run:
    """What one ffmpeg pass showed: delivered pts, dirty decoded pts, every decoded (pts, key)."""

    def __init__(self, delivered: list[int], dirty_at: dict, decoded: list[tuple[int, bool]]):
        self.delivered, self.dirty_at, self.decoded = delivered, dirty_at, decoded


def decode_ffmpeg(path: Path, table: FrameTable, picks: list[int], size: tuple[int, int],
                  threads: int, emit: Emit, deinterlace: bool = False, container: str = "",
                  notes: list[str] | None = None) -> list[int]:
    """Seek to each pick's keyframe and decode from there; ``select`` keeps exactly the picked
    pts and ``showinfo`` reports them.

    One packet scan (the frame table) gives every frame's pts, keyframe flag and byte offset.
    Picks are grouped by keyframe (groups closer than ``MERGE_S`` share a pass); each pass
    starts one keyframe before its own, so frames that reference the previous group of pictures
    (open GOPs: camcorders, broadcast) decode whole, and reads the file from that keyframe's
    byte offset (MPEG-TS/PS) or seeks to its time (AVI and the rest). A pass counts only if the
    group's keyframe itself was decoded and every pick came out with its exact pts; otherwise it
    starts one keyframe further back, and after that the file is decoded from the start (the
    old, exact, slow way), which is said in ``notes``. Files without timestamps (raw elementary
    streams) are always decoded from the start: there is nothing to seek by.
    """
    if table.synthetic or not table.pos and container in BYTE_SEEK:
        if notes is not None:
            notes.append("this file carries no usable timestamps, so it was decoded from the start")
        return _decode_sequential(path, table, picks, size, threads, emit, deinterlace, container)
    key_idx = [i for i, k in enumerate(table.keyframe) if k]
    groups: list[list[int]] = []
    for i in picks:
        kf = key_idx[max(0, bisect_right(key_idx, i) - 1)]
        seg = table.segment_of(i)[0]
        if groups:
            last = groups[-1][-1]
            if table.segment_of(last)[0] == seg and \
                    (kf <= last or table.seconds(kf) - table.seconds(last) < MERGE_S):
                groups[-1].append(i)
                continue
        groups.append([i])
    delivered: list[int] = []
    damaged: list[int] = []
    k = 0
    for group in groups:
        kf = key_idx[max(0, bisect_right(key_idx, group[0]) - 1)]
        seg_first = table.segment_of(group[0])[0]
        run = None
        for back in (1, 2, 4):
            pos_in_keys = bisect_right(key_idx, kf) - 1
            start = key_idx[max(0, pos_in_keys - back)]
            if start < seg_first:
                start = next((j for j in key_idx if j >= seg_first), seg_first)
            run = _ffmpeg_pass(path, table, group, size, threads, emit, k, deinterlace, container, start)
            if run is not None:
                break
            if start == seg_first:
                break  # already from the start of its segment: seeking cannot do better
        if run is None:
            if notes is not None:
                notes.append("seeking in this file did not return the frames asked for, so it was "
                             "decoded from the start")
            return _decode_sequential(path, table, picks, size, threads, emit, deinterlace, container)
        k += len(group)
        delivered += [table.pts[i] for i in group]
        damaged += [i for i in group if run.dirty_at.get(table.raw_pts(i))]
    if damaged:
        raise Damaged(damaged, len(picks))
    return delivered


def _ffmpeg_pass(path: Path, table: FrameTable, group: list[int], size: tuple[int, int], threads: int,
                 emit: Emit, k0: int, deinterlace: bool, container: str, start: int) -> _Run | None:
    """One pass from keyframe ``start`` over ``group``; None when it did not prove exact."""
    seg_first, _, seg_end = table.segment_of(start)
    tb = table.time_base
    if container in BYTE_SEEK:
        end = seg_end if seg_end >= 0 else 0
        # MPEG-PS leaves some packets without a byte offset: start at the nearest earlier frame
        # that has one (still before the group's keyframe, which must be decoded to count).
        at = next((table.pos[j] for j in range(start, seg_first - 1, -1) if table.pos[j] >= 0), -1)
        if at < 0:
            at = table.pos[seg_first] if seg_first and table.pos[seg_first] >= 0 else 0
        src = f"subfile,,start,{at},end,{end},,:{path}"
        span = float((table.raw_pts(group[-1]) - table.raw_pts(start)) * tb) + 2.0
        inputs = ["-f", container, "-t", f"{span:.3f}", "-i", src]
    else:  # the index's keyframe at or before this time: the start keyframe itself
        at = float(table.raw_pts(start) * tb) + 0.25 * float(table.last_duration * tb)
        inputs = ["-seek_timestamp", "1", "-ss", f"{at:.6f}", "-i", str(path)] if start > seg_first \
            else ["-i", str(path)]
    raw = [table.raw_pts(i) for i in group]
    run = _ffmpeg_run(inputs, raw, size, threads, emit, k0, deinterlace, path, limit=len(group))
    kf = max(j for j in range(group[0] + 1) if table.keyframe[j])
    decoded = {p for p, _ in run.decoded}
    if table.raw_pts(kf) not in decoded or run.delivered != raw:
        return None
    return run


def _decode_sequential(path: Path, table: FrameTable, picks: list[int], size: tuple[int, int],
                       threads: int, emit: Emit, deinterlace: bool, container: str) -> list[int]:
    """Decode from the start (each segment of a joined recording on its own byte range)."""
    if table.synthetic:  # frames are picked by their index in decode order
        run = _ffmpeg_run(["-i", str(path)], [], size, threads, emit, 0, deinterlace, path,
                          by_index=picks)
        if len(run.delivered) != len(picks):
            return run.delivered
        damaged = [i for i in picks if run.dirty_at.get(("n", i))]
        if damaged:
            raise Damaged(damaged, len(picks))
        return [table.pts[i] for i in picks]
    by_seg: dict[int, list[int]] = {}
    for i in picks:
        by_seg.setdefault(table.segment_of(i)[0], []).append(i)
    delivered: list[int] = []
    damaged: list[int] = []
    k = 0
    for first, group in by_seg.items():
        _, _, seg_end = table.segment_of(first)
        if len(table.segments) > 1 and table.pos:
            if first > 0 and table.pos[first] < 0:  # reading from the start would meet the first half's pts
                raise Mismatch("a joined recording's second part has no byte offset to start from")
            at = max(0, table.pos[first])
            src = f"subfile,,start,{at},end,{seg_end if seg_end >= 0 else 0},,:{path}"
            inputs = ["-f", container, "-i", src] if container in BYTE_SEEK else ["-i", src]
        else:
            inputs = ["-i", str(path)]
        raw = [table.raw_pts(i) for i in group]
        run = _ffmpeg_run(inputs, raw, size, threads, emit, k, deinterlace, path)
        if run.delivered != raw:
            return delivered + [p + table.segment_of(first)[1] for p in run.delivered]
        k += len(group)
        delivered += [table.pts[i] for i in group]
        damaged += [i for i in group if run.dirty_at.get(table.raw_pts(i))]
    if damaged:
        raise Damaged(damaged, len(picks))
    return delivered


def _ffmpeg_run(inputs: list[str], want: list[int], size: tuple[int, int], threads: int, emit: Emit,
                k0: int, deinterlace: bool, path: Path, limit: int = 0,
                by_index: list[int] | None = None) -> _Run:
    """One ffmpeg process; emits frames k0, k0+1, ... as they come.

    ``-copyts`` keeps the container's raw pts (the filter time base is the stream's), so the
    selection is integer-exact; ``-noautorotate`` because rotation is applied by the caller;
    ``-noaccurate_seek`` because ``select`` picks the frames, not the seek. One decoding thread
    (``threads`` is unused here): frame threads log a frame's errors out of order, and the
    damage count in a reason must not change between two runs of one file; the CPU seconds are
    the same, and a pass decodes a few keyframe intervals, not the file."""
    import numpy as np

    w, h = size
    # bwdif halves the time base (it can send a frame per field), so pts after it are doubled.
    scale = 2 if deinterlace else 1
    expr = _any_of([f"eq(n,{i})" for i in by_index] if by_index is not None
                   else [f"eq(pts,{p * scale})" for p in want])
    # The first showinfo sees every decoded frame (to place decoder errors), the last the picks;
    # the deinterlacer sits before the selection, so it sees each pick's neighbouring fields.
    deint = f"{DEINTERLACE}," if deinterlace else ""
    vf = f"showinfo,{deint}select='{expr}',scale={w}:{h}:flags=bicubic,format=rgb24,showinfo"
    cmd = [FFMPEG, "-nostdin", "-hide_banner", "-loglevel", "info", "-copyts", "-noautorotate",
           "-noaccurate_seek", "-threads", "1", *inputs, "-map", "0:v:0", "-an", "-sn", "-dn",
           "-vf", vf, "-vsync", "passthrough", *(["-frames:v", str(limit)] if limit else []),
           "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"]
    frame_bytes = w * h * 3
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL)
        k = 0
        try:
            while True:
                buf = _read_exact(proc.stdout, frame_bytes)
                if buf is None:
                    break
                emit(k0 + k, np.frombuffer(buf, np.uint8).reshape(h, w, 3))
                k += 1
        finally:
            proc.stdout.close()
            rc = proc.wait()
        err.seek(0)
        log = err.read().decode("utf-8", "replace")
    if rc != 0:  # report the first error line, not the generic "Conversion failed!"
        errs = [ln for ln in log.splitlines() if "rror" in ln or "nvalid" in ln] or [f"exit {rc}"]
        raise RuntimeError(f"ffmpeg failed: {errs[0][:200]}")
    pts, dirty_at, decoded = _read_showinfo(log)
    pts = [p // scale for p in pts]
    if len(pts) != k:
        raise Mismatch(f"ffmpeg delivered {k} frames but reported {len(pts)} timestamps")
    return _Run(pts, dirty_at, decoded)


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
