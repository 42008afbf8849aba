"""Sample a video's frames to JPEG files: plan, decode in a killable subprocess, verify, store.

``sample_video`` is the one entry point. Steps:

1. ``probe`` (unless given) and the demuxer's frame table (ffprobe child processes).
2. ``plan_timestamps`` gives target instants; each maps to the frame whose real pts is at or
   before it (the first frame if none is). Timestamps returned are those frames' pts, in
   seconds since the first frame, so they are exact on variable-frame-rate video.
3. Backends are tried in order (``decoders.default_backends`` unless ``backends`` is given).
   Each attempt runs ``decode_worker.run`` in a worker that this thread's warm
   ``decode_server`` forks, in a new session, with a timeout of ``settings.decode_timeout_s``;
   on timeout the whole process group is killed. An attempt
   fails on error, crash, timeout, or when the pts it delivered differ from the ones asked for
   (the timestamp-exactness check); then the next backend is tried. So the worst case is
   ``len(backends) * decode_timeout_s``. If all fail: ``BadVideo("decoder timed out")`` when
   any attempt timed out, else ``BadVideo("decoding failed (...)")``.
4. JPEGs (``settings.jpeg_quality``) land in ``out_dir`` as ``00000.jpg, 00001.jpg, ...`` by
   sample index; an attempt writes into a temporary sibling directory first, so a failed or
   killed attempt never leaves partial output in ``out_dir``.

``SampledFrames.files`` are relative to ``out_dir.parent`` (``"<out_dir name>/00000.jpg"``), so
the media store can move as a whole; ``SampledFrames.paths(out_dir.parent)`` makes them absolute.

A caller sampling one video for several policies passes one ``FrameReuse`` to every call: a
policy that asks for exactly the frames, size and filters an earlier one decoded gets copies of
its JPEGs, not a second decode. The shipped scenarios' two policies pick the same 8 frames of a
20 s clip, so half of the CPU worker's decoding was repeated work (bench/results/cpu_feed.md).
"""

from __future__ import annotations

import logging
import os
import shutil
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

from vidlora.config import Settings, get_settings
from vidlora.media import decode_server, reasons
from vidlora.media.decoders import BACKENDS, default_backends, default_threads
from vidlora.media.ffprobe import FrameTable, ProbeError, read_frame_table
from vidlora.media.probe import BadVideo, ProbeInfo, plain_words, probe_with_table
from vidlora.media.sampling import SamplingPolicy, plan_timestamps, target_size

log = logging.getLogger(__name__)

# Times a decode is tried again around damage a decoder found (each round moves the picks
# it called dirty to clean frames): a file damaged in more places than this is refused.
DAMAGE_ROUNDS = 3


@dataclass(frozen=True)
class SampledFrames:
    timestamps: list[float]  # real pts of each sampled frame, seconds since the first frame
    files: list[str]  # JPEG paths relative to out_dir.parent, one per timestamp
    width: int  # size of every JPEG (displayed orientation)
    height: int
    backend: str  # the decoder that produced them
    deinterlace: str | None = None  # "bwdif" when the video is interlaced and was deinterlaced
    note: str | None = None  # how it was decoded, where that is worth keeping (no seeking possible)

    def paths(self, base: Path) -> list[Path]:
        """Absolute paths, given the directory the files are relative to (``out_dir.parent``)."""
        return [Path(base) / f for f in self.files]


class FrameReuse:
    """One video's decoded frames, by decode job, for the policies sampled after it (in memory:
    a frame set is a few JPEGs of at most ``max_pixels``)."""

    def __init__(self) -> None:
        self._done: dict[tuple, tuple[SampledFrames, list[bytes]]] = {}
        self.hits = 0

    def get(self, job: tuple, out_dir: Path) -> SampledFrames | None:
        hit = self._done.get(job)
        if hit is None:
            return None
        frames, blobs = hit
        out_dir.mkdir(parents=True, exist_ok=True)
        for old in out_dir.glob("[0-9][0-9][0-9][0-9][0-9].jpg"):
            old.unlink()
        files = []
        for i, blob in enumerate(blobs):
            (out_dir / f"{i:05d}.jpg").write_bytes(blob)
            files.append(f"{out_dir.name}/{i:05d}.jpg")
        self.hits += 1
        return SampledFrames(timestamps=list(frames.timestamps), files=files, width=frames.width,
                             height=frames.height, backend=frames.backend, deinterlace=frames.deinterlace,
                             note=frames.note)

    def keep(self, job: tuple, frames: SampledFrames, out_dir: Path) -> None:
        self._done[job] = (frames, [p.read_bytes() for p in frames.paths(out_dir.parent)])


@dataclass
class _Attempt:
    ok: bool
    pts: list[int] | None = None
    error: str = ""
    timed_out: bool = False
    damaged: list[int] | None = None  # table indices of picks that decode only with errors
    replaced: tuple[int, ...] = ()  # picks delivered as an earlier clean frame of their segment
    notes: tuple[str, ...] = ()


def sample_video(path: Path, policy: SamplingPolicy, out_dir: Path, info: ProbeInfo | None = None,
                 settings: Settings | None = None, backends: list[str] | None = None,
                 table: FrameTable | None = None, reuse: FrameReuse | None = None) -> SampledFrames:
    """Sample ``path`` by ``policy`` into ``out_dir``; raise ``BadVideo`` if it cannot be done.

    ``info`` and ``table`` (from ``probe_with_table`` / ``frame_table``) spare a second probe
    and packet scan, and ``reuse`` a second decode of the same frames; a caller sampling
    several policies passes the same ones to each call."""
    s = settings or get_settings()
    path, out_dir = Path(path), Path(out_dir)
    if info is None:
        info, table = probe_with_table(path, s)
    elif table is None:
        table = frame_table(path, info, s)
    targets = plan_timestamps(info, policy)
    times = table.times()
    chosen = [max(0, bisect_right(times, t + 1e-9) - 1) for t in targets]
    picks = sorted(set(chosen))
    # A damaged pick's replacement stays inside the window: after the frame shown before it.
    floor = max(0, bisect_right(times, policy.start_s + 1e-9) - 1) - 1 if policy.start_s else -1
    # Frames that decode from damaged data (the demuxer's word, then the decoder's) are never
    # stored as pictures of the recording: a pick there moves to the nearest clean frame.
    targets_at = list(chosen)
    end = bisect_right(times, policy.end_s + 1e-9) if policy.end_s is not None else len(times)
    unclean = set(table.unclean)
    damage_note = None

    def avoid_damage() -> None:
        nonlocal chosen, picks, damage_note
        chosen, moved, lost = clean_picks(targets_at, unclean, floor, end)
        if lost:
            raise BadVideo(reasons.damaged_stretch(len(lost), len(chosen), [round(times[i], 2) for i in sorted(unclean)]))
        damage_note = reasons.replaced_damaged(moved, [round(times[i], 2) for i in sorted(unclean)]) if moved else None
        picks = sorted(set(chosen))

    if unclean:
        avoid_damage()
    deinterlace = info.interlaced and policy.deinterlace == "auto"
    width, height = target_size(info.width, info.height, policy.max_pixels, policy.min_pixels)
    stored = (height, width) if info.rotation in (90, 270) else (width, height)

    order = list(backends) if backends else default_backends(info)
    unknown = [b for b in order if b not in BACKENDS]
    if unknown:
        raise ValueError(f"unknown decoder backend(s) {unknown}; known: {list(BACKENDS)}")

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    job_key = (str(path.resolve()), tuple(chosen), stored, info.rotation, s.jpeg_quality, deinterlace, floor,
               tuple(order))
    if reuse is not None and (again := reuse.get(job_key, out_dir)) is not None:
        return again
    errors: list[str] = []
    timed_out = False
    rounds = 0
    left = list(order)
    while left:
        backend = left[0]
        tmp = out_dir.parent / f".{out_dir.name}.{backend}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            job = {"backend": backend, "path": str(path.resolve()), "table": table.to_json(), "picks": picks,
                   "size": list(stored), "rotation": info.rotation, "quality": s.jpeg_quality,
                   "threads": default_threads(), "out_dir": str(tmp),
                   "watchdog_s": s.decode_timeout_s + 30, "deinterlace": deinterlace,
                   "container": info.container, "floor": floor}
            att = _run_worker(job, s.decode_timeout_s)
            if att.damaged and rounds < DAMAGE_ROUNDS:
                # Damage the demuxer did not name: those picks, and what decodes after them up
                # to the next keyframe, are unclean; decode again around them.
                rounds += 1
                unclean |= dirty_until_key(table, att.damaged)
                avoid_damage()
                continue
            if att.damaged:
                # Another backend would decode the same damaged data, maybe without saying so.
                worst = [round(times[i], 2) for i in sorted(att.damaged)[:3]]
                bad = sum(1 for i in chosen if i in set(att.damaged))
                raise BadVideo(reasons.damaged(bad, len(chosen), worst))
            delivered = _delivered(att.pts, picks, table, att.replaced, floor) if att.ok else None
            if att.ok and delivered is None:
                att = _Attempt(False, error="delivered frames with other timestamps than asked for")
            if att.ok:
                files = _publish(tmp, out_dir, chosen, picks)
                # A damaged pick replaced by an earlier clean frame reports that frame's time.
                shown = [delivered[picks.index(i)] for i in chosen]
                result = SampledFrames(
                    timestamps=[round(times[i], 6) for i in shown], files=files,
                    width=width, height=height, backend=backend,
                    deinterlace="bwdif" if deinterlace else None,
                    note="; ".join([*([damage_note] if damage_note else []), *att.notes]) or None)
                if reuse is not None:
                    reuse.keep(job_key, result, out_dir)
                return result
            timed_out |= att.timed_out
            errors.append(f"{backend}: {att.error}")
            left.pop(0)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    # What each backend said goes to the log; the reason is the vocabulary's sentence.
    log.info("sampling %s failed: %s", path.name, plain_words("; ".join(errors), path, 600))
    if timed_out:
        raise BadVideo(reasons.DECODER_TIMED_OUT, detail="; ".join(errors))
    if unclean:  # a file damaged in places is not fixed by re-encoding it
        raise BadVideo(reasons.damaged_in_places([round(times[i], 2) for i in sorted(unclean)]),
                       detail=plain_words("; ".join(errors), path, 600))
    raise BadVideo(reasons.decoding_failed(info.codec), detail=plain_words("; ".join(errors), path, 600))


def dirty_until_key(table: FrameTable, picks: list[int]) -> set[int]:
    """Frames a decoder found dirty, and those after each up to the next keyframe: they
    reference it, and the decoders call them dirty too."""
    out: set[int] = set()
    for i in picks:
        j = i
        while j < len(table.pts) and (j == i or not table.keyframe[j]):
            out.add(j)
            j += 1
    return out


def clean_picks(chosen: list[int], unclean: set[int], floor: int, end: int) -> tuple[list[int], int, list[int]]:
    """Each chosen frame that decodes from damaged data moved to the nearest clean frame
    between its neighbours' (after the previous one, and after ``floor``, a window's start;
    before the next one, and before ``end``, a window's end); where the damage spans that
    whole gap, to the clean frame before it (the one the previous sample shows, at worst:
    a picture of the recording, never a concealed one). Returns (chosen, how many moved,
    the chosen frames that have no clean frame there)."""
    out, moved, lost = [], 0, []
    for n, c in enumerate(chosen):
        if c not in unclean:
            out.append(c)
            continue
        lo = max(floor, chosen[n - 1] if n else -1)
        hi = min(end, chosen[n + 1] if n + 1 < len(chosen) else end)
        near = [j for j in range(lo + 1, hi) if j not in unclean]
        if not near:  # times stay in order: no earlier than the previous sample's frame
            lo = max(floor, out[-1] - 1 if out else -1)
            near = [j for j in range(c - 1, lo, -1) if j not in unclean][:1]
        if not near:
            lost.append(n)
            out.append(c)
            continue
        out.append(min(near, key=lambda j: (abs(j - c), j)))
        moved += 1
    return out, moved, [out[n] for n in lost]


def _delivered(pts: list[int] | None, picks: list[int], table: FrameTable,
               replaced: tuple[int, ...], floor: int = -1) -> list[int] | None:
    """Table indices of what was delivered for each pick: the pick itself, or, for a pick the
    backend says it replaced (damaged), a clean frame after the previous pick (and after table
    index ``floor``: a window's start) and before it.
    None: anything else (the exactness check fails and the next backend is tried)."""
    if pts is None or len(pts) != len(picks):
        return None
    index_of = {p: i for i, p in enumerate(table.pts)}
    out, prev = [], floor
    for want, got in zip(picks, pts):
        i = index_of.get(got)
        if i is None or (i != want and (want not in replaced or not prev < i < want)):
            return None
        out.append(i)
        prev = want
    return out


def frame_table(path: Path, info: ProbeInfo, s: Settings) -> FrameTable:
    """The packet table of a video already probed (``info`` from the database)."""
    from fractions import Fraction

    from vidlora.media.ffprobe import probe_header_and_packets

    try:  # the time base is not in ProbeInfo: the header comes with the packets
        head, packets = probe_header_and_packets(path, s.decode_timeout_s)
        st = next(x for x in head.get("streams", []) if x.get("codec_type") == "video")
        tb = Fraction(st.get("time_base", "1/1000"))
        return read_frame_table(path, tb, int(round(1 / (info.fps * tb))) if info.fps else 0, s.decode_timeout_s,
                                info.container, info.declared_duration_s,
                                no_reorder=str(st.get("has_b_frames", "")) == "0", packets=packets,
                                reorder_delay=int(st.get("has_b_frames") or 0))
    except (ProbeError, StopIteration) as exc:
        raise BadVideo(reasons.PROBE_TIMED_OUT if getattr(exc, "timed_out", False)
                       else reasons.PACKETS_UNREADABLE) from None


def _run_worker(job: dict, timeout: float) -> _Attempt:
    try:
        out = decode_server.server().run(job, timeout)
    except decode_server.ServerGone as exc:
        return _Attempt(False, error=str(exc)[:300])
    if out.timed_out:
        return _Attempt(False, error=f"timed out after {out.seconds:.1f} s", timed_out=True)
    res = out.result
    if out.status != 0:
        how = f"signal {-out.status}" if out.status < 0 else f"exit {out.status}"
        return _Attempt(False, error=f"worker crashed ({how}) {out.stderr[:200]}".strip())
    if res is None:
        return _Attempt(False, error="worker gave no result")
    if res.get("ok"):
        return _Attempt(True, pts=res["pts"], replaced=tuple(int(i) for i in res.get("replaced", ())),
                        notes=tuple(str(n) for n in res.get("notes", ())))
    if res.get("kind") == "damaged":
        return _Attempt(False, error=res.get("error", "damaged"), damaged=[int(i) for i in res["picks"]])
    return _Attempt(False, error=res.get("error", "unknown error"))


def _publish(tmp: Path, out_dir: Path, chosen: list[int], picks: list[int]) -> list[str]:
    """Move the attempt's JPEGs into out_dir, one per sample, named by sample index."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("[0-9][0-9][0-9][0-9][0-9].jpg"):  # a previous run's frames
        old.unlink()
    slot = {p: k for k, p in enumerate(picks)}
    first: dict[int, Path] = {}
    files = []
    for i, frame in enumerate(chosen):
        dst = out_dir / f"{i:05d}.jpg"
        if frame in first:  # two targets on one frame (VFR gaps): copy, so names stay simple
            shutil.copyfile(first[frame], dst)
        else:
            os.replace(tmp / f"{slot[frame]:05d}.jpg", dst)
            first[frame] = dst
        files.append(f"{out_dir.name}/{dst.name}")
    return files
