"""Probe a video: what it is, how big, how long, how many frames really are there.

``probe`` either returns a ``ProbeInfo`` for a file we can sample, or raises ``BadVideo`` with a
short reason a person can act on ("empty file", "no video stream (audio-only file)", ...). The
reason is stored on the analysis row and shown in the UI, so it is deliberately plain text.

All work happens in child processes with a timeout (settings.decode_timeout_s): ``ffprobe`` and
``ffmpeg``, and a worker of this thread's warm decode server (``decode_server``) for the first
picture; no native reader is ever opened in the calling process.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from fractions import Fraction
from itertools import islice
from pathlib import Path

from vidlora.config import Settings, get_settings
from vidlora.media import decode_server, reasons
from vidlora.media.cut_ends import cut_mid_box, cut_mid_element
from vidlora.media.ffprobe import (
    DISCONTINUOUS, INTERLACED, FrameTable, ProbeError, cut_mid_packet, decodes_near_start, detect_field_order,
    probe_header_and_packets, read_frame_table,
)

MAX_ASPECT = 200  # the VLM's resizer (Qwen smart_resize) refuses more extreme shapes
# Codecs that have no interlaced mode: no need to run idet on them.
PROGRESSIVE_CODECS = frozenset({"vp8", "vp9", "av1", "theora", "gif", "png", "apng", "webp"})


def plain_words(message: str, path: Path | str | None = None, limit: int = 120) -> str:
    """A decoder's message fit for a person: no server path, no ``[h264 @ 0x55...]`` prefix,
    and cut at a word (with an ellipsis), never mid-word."""
    text = str(message)
    if path is not None:
        for form in {str(path), str(Path(path).resolve())}:
            text = text.replace(form + ": ", "").replace(form, "the file")
    text = re.sub(r"\[[\w,]+ @ 0x[0-9a-f]+\]\s*", "", text)
    text = re.sub(r"(?:/[^\s/:]+){2,}", "the file", text)  # any other absolute path
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0].rstrip(",;:")
    return cut + "..."


class BadVideo(Exception):
    """The file cannot be sampled. ``reason`` is a sentence from ``reasons`` (what is wrong,
    what to do); ``str(e) == reason``. ``detail``: what the decoders said, for logs only."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.detail = detail

    def __str__(self) -> str:
        return self.reason


@dataclass(frozen=True)
class ProbeInfo:
    container: str  # short name: mp4, mov, webm, matroska, avi, mpegts, mpeg, ...
    codec: str  # ffmpeg codec name: h264, hevc, vp9, av1, mjpeg, ...
    width: int  # displayed size: stored pixels stretched by the sample aspect, then rotated
    height: int
    rotation: int  # clockwise degrees applied to the stored picture for display (0/90/180/270)
    fps: float  # average frame rate
    duration_s: float  # first frame to end of last frame, from the packets
    frame_count: int  # frames the demuxer actually delivers (not the header's claim)
    bit_rate: int | None
    # Shape of one stored pixel ("128:117": 128/117 times as wide as tall); the displayed size
    # already includes it, and every resize works from the displayed size.
    sample_aspect: str = "1:1"
    # "progressive", or how the two fields are woven: "tt"/"bb" (top/bottom field first, also
    # "tb"/"bt"), from the stream's flags or, where it has none, from ffmpeg's idet.
    field_order: str = "progressive"
    # The span the file's header declares, when it declares one; a partial file (a copy cut
    # short, a card that filled up) declares more than its packets hold.
    declared_duration_s: float | None = None
    # The file ends before its declared end, or part-way through a packet, element or box (cut
    # short, or copied while still being written): it is analysed as
    # far as it decodes, and flagged.
    truncated: bool = False

    @property
    def has_video(self) -> bool:
        return self.frame_count > 0

    @property
    def interlaced(self) -> bool:
        return self.field_order in INTERLACED

    def as_dict(self) -> dict:
        return {**asdict(self), "has_video": self.has_video}


def probe(path: Path, settings: Settings | None = None) -> ProbeInfo:
    """Return facts about a video or raise ``BadVideo``."""
    return probe_with_table(Path(path), settings)[0]


def probe_with_table(path: Path, settings: Settings | None = None) -> tuple[ProbeInfo, FrameTable]:
    """``probe`` plus the frame table (used by ``sample_video`` to avoid a second packet scan)."""
    s = settings or get_settings()
    path = Path(path)
    timeout = s.decode_timeout_s
    if not path.is_file():
        raise BadVideo(reasons.FILE_NOT_FOUND)
    if path.stat().st_size == 0:
        raise BadVideo(reasons.EMPTY)
    head_bytes = _head(path)
    if _looks_like_text(head_bytes):
        raise BadVideo(reasons.TEXT)

    try:
        head, packets = probe_header_and_packets(path, timeout)
    except ProbeError as exc:
        raise BadVideo(_header_reason(exc, head_bytes, path)) from None
    fmt = head.get("format", {})
    fmt_name = fmt.get("format_name", "")
    if fmt_name == "image2" or fmt_name.endswith("_pipe"):
        raise BadVideo(reasons.image(fmt_name.removesuffix("_pipe")))

    streams = head.get("streams", [])
    videos = [st for st in streams if st.get("codec_type") == "video"
              and not st.get("disposition", {}).get("attached_pic")]
    if not streams and (_float(fmt.get("duration")) or 0.0) <= 0:
        # An MP4 whose index parsed (no "moov not found") and lists nothing was written empty;
        # any other container with nothing in it, or a format guessed from a few bytes, most
        # likely has a damaged header.
        raise BadVideo(reasons.EMPTY_CONTAINER if _iso_box(head_bytes) else reasons.NO_STREAMS)
    if not videos:
        audio = any(st.get("codec_type") == "audio" for st in streams)
        raise BadVideo(reasons.AUDIO_ONLY if audio else reasons.NO_VIDEO)
    st = videos[0]
    codec = st.get("codec_name") or ""
    if not codec or codec == "none":
        raise BadVideo(reasons.unsupported_fourcc(str(st.get("codec_tag_string", "?"))))

    stored_w, stored_h = int(st.get("width") or 0), int(st.get("height") or 0)
    if stored_w <= 0 or stored_h <= 0:
        raise BadVideo(reasons.UNKNOWN_SIZE)
    if stored_w * stored_h > s.max_video_pixels:
        raise BadVideo(reasons.too_large(stored_w, stored_h, s.max_video_pixels))
    if max(stored_w, stored_h) > MAX_ASPECT * min(stored_w, stored_h):
        raise BadVideo(reasons.absurd_aspect(stored_w, stored_h, MAX_ASPECT))

    time_base = Fraction(st.get("time_base", "1/1000"))
    fps = _rate(st.get("avg_frame_rate")) or _rate(st.get("r_frame_rate"))
    # The length limit is applied to what the packets hold (below), not to this: a header that
    # declares 100 hours over 3 s of video is a partial or mislabelled file, not a long one.
    declared = _declared_span(st, fmt, streams, _container(fmt_name, path), fps, _first_pts_s(packets, time_base))
    frame_dur = int(round(1 / (fps * time_base))) if fps else 0
    try:
        table = read_frame_table(path, time_base, frame_dur, timeout, _container(fmt_name, path), declared or None,
                                 no_reorder=_int(st.get("has_b_frames")) == 0, packets=packets,
                                 reorder_delay=_int(st.get("has_b_frames")) or 0)
    except ProbeError as exc:
        raise BadVideo(reasons.PROBE_TIMED_OUT if exc.timed_out else reasons.PACKETS_UNREADABLE) from None
    if not table.pts:
        frames_said = _int(st.get("nb_frames"))
        if frames_said or declared > 0:  # the header promised pictures the packets do not hold
            raise BadVideo(reasons.declared_but_unreadable(frames_said, declared))
        raise BadVideo(reasons.NO_FRAMES)
    duration = table.duration_s
    if duration <= 0:
        raise BadVideo(reasons.NO_FRAMES)
    if duration > s.max_duration_s:
        raise BadVideo(_too_long(duration, s))

    try:
        decodes = _first_picture_in_server(path, timeout) or decodes_near_start(path, timeout)
    except ProbeError as exc:
        raise BadVideo(reasons.PROBE_TIMED_OUT if exc.timed_out else reasons.undecodable(codec)) from None
    if not decodes:
        raise BadVideo(reasons.undecodable(codec))

    rotation = _rotation(st)
    sar = _sample_aspect(st)
    shown_w = max(1, round(stored_w * sar))  # non-square pixels: the width the picture is shown at
    width, height = (stored_h, shown_w) if rotation in (90, 270) else (shown_w, stored_h)
    n = len(table.pts)
    if n > 1 or not fps:
        # What the packets show, not the header's nominal rate: the same for constant-rate
        # video, the real average for variable-rate video (a phone's "30 fps" that is 18).
        fps = n / duration
    bit_rate = _int(fmt.get("bit_rate")) or _int(st.get("bit_rate"))
    field_order = str(st.get("field_order") or "unknown")
    if codec in PROGRESSIVE_CODECS:
        field_order = "progressive"
    elif field_order not in INTERLACED and field_order != "progressive":
        try:
            field_order = detect_field_order(path, timeout)
        except ProbeError:
            raise BadVideo(reasons.PROBE_TIMED_OUT) from None
    container = _container(fmt_name, path)
    # A header that declares more than the packets hold (beyond rounding and a last frame's
    # length): the file was cut short. MPEG-TS declares nothing; it shows a cut by ending
    # part-way through a packet.
    if container in DISCONTINUOUS or declared < duration:
        # ffprobe's figure for TS/PS is its own estimate from the packets, and a header that
        # declares less than the packets hold (MKV written with negative timestamps) is wrong.
        declared = 0.0
    truncated = bool(declared and declared - duration > max(1.0, 0.02 * declared))
    if not truncated and _ends_mid_structure(container, path):
        # A snapshot of a recording still being written (MKV, fragmented MP4) declares no more
        # than it holds (ffprobe's span of a fragmented MP4 is that of the fragments present):
        # it shows the cut only by ending inside its last cluster or box.
        truncated, declared = True, 0.0
    info = ProbeInfo(
        container=container, codec=codec, width=width, height=height,
        rotation=rotation, fps=round(float(fps), 6), duration_s=round(duration, 6),
        frame_count=n, bit_rate=bit_rate, sample_aspect=f"{sar.numerator}:{sar.denominator}",
        field_order=field_order, declared_duration_s=round(declared, 3) if declared else None,
        truncated=truncated,
    )
    return info, table


def _first_pts_s(packets, time_base: Fraction) -> float | None:
    """The video's first presentation time from its first packets (reordering puts it among
    the first few), or None where the packets were not read with the header."""
    if packets is None:
        return None
    first = [row[0] for row in islice(packets, 64) if row[0] is not None]
    return float(min(first) * time_base) if first else None


def _ends_mid_structure(container: str, path: Path) -> bool:
    """The file ends part-way through a packet (TS), element (Matroska) or box (MP4)."""
    if container in ("mpegts", "mpegtsraw"):
        return cut_mid_packet(path)
    if container in ("matroska", "webm"):
        return cut_mid_element(path)
    if container in ("mp4", "mov"):
        return cut_mid_box(path)
    return False


def _declared_span(st: dict, fmt: dict, streams: list[dict], container: str, fps: float,
                   first_s: float | None = None) -> float:
    """The video stream's own span as the header declares it (0.0: it declares none).

    Per stream, never the file's: the file's duration is its longest stream's, and audio that
    outlasts the pictures (or starts before them) is no missing video.

    - AVI: the header's frame count at the header's rate. ffprobe's duration there is an
      estimate from the data present, so a cut AVI looked complete.
    - Matroska/WebM keep no per-stream duration field; the muxer's ``DURATION`` tag is the
      stream's end time, so its span is that tag less the stream's first picture (``first_s``).
      ffprobe's own start and duration for such a stream are the file's where the file starts
      below zero (Opus audio's pre-skip): audio 5 s ahead of the video read as 5 s missing.
    - Elsewhere the stream's duration (MP4/MOV index), else the file's where the video is the
      file's only stream.
    """
    frames = _int(st.get("nb_frames"))
    if container == "avi" and frames and fps:
        return frames / fps
    tags = {str(k).lower(): v for k, v in (st.get("tags") or {}).items()}
    end = _clock(tags.get("duration"))
    if end and container in ("matroska", "webm"):
        start = first_s if first_s is not None else _float(st.get("start_time")) or 0.0
        return max(0.0, end - start)
    own = _float(st.get("duration"))
    if own:
        return own
    if end:
        return max(0.0, end - (_float(st.get("start_time")) or 0.0))
    if len(streams) == 1:
        return _float(fmt.get("duration")) or 0.0
    return 0.0


def _clock(s) -> float | None:
    """"01:02:03.5" (Matroska's DURATION tag) as seconds."""
    try:
        h, m, sec = str(s).split(":")
        return int(h) * 3600 + int(m) * 60 + float(sec)
    except (TypeError, ValueError):
        return None


def _first_picture_in_server(path: Path, timeout: float) -> bool:
    """The decode check in a worker of this thread's warm decode server (PyAV, loaded once):
    0.08 CPU-s of a 1080p clip where starting ffmpeg costs 0.17 (bench/results/cpu_feed.md).
    True: a picture came out. False where it did not, or the worker failed: then ffmpeg's own
    check (``decodes_near_start``) decides, as it always has, so this can only pass a file
    sooner, never turn one away."""
    try:
        out = decode_server.server().run({"kind": "first_picture", "path": str(path), "watchdog_s": timeout + 5},
                                         timeout)
    except decode_server.ServerGone:
        return False
    return bool(out.status == 0 and not out.timed_out and (out.result or {}).get("picture"))


def _head(path: Path, n: int = 512) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def _looks_like_text(b: bytes) -> bool:
    """Plain text (UTF-8 without control bytes other than whitespace)? No video container is."""
    try:
        t = b.decode("utf-8")
    except UnicodeDecodeError:
        if len(b) < 512:
            return False
        try:  # the sample may end inside a multi-byte character
            t = b[:-3].decode("utf-8")
        except UnicodeDecodeError:
            return False
    return all(c.isprintable() or c in "\r\n\t\f" for c in t)


def _iso_box(b: bytes) -> bool:
    """Does the file start like an ISO-BMFF (mp4/mov) box?"""
    return len(b) >= 8 and b[4:8] in (b"ftyp", b"moov", b"mdat", b"free", b"wide", b"skip", b"pnot")


def _known_container(b: bytes) -> bool:
    """Does the file start like a container we know (so a short read means it was cut off)?"""
    return (_iso_box(b) or b[:4] == b"\x1a\x45\xdf\xa3" or b[:4] == b"RIFF" or b[:4] == b"\x00\x00\x01\xba"
            or b[:1] == b"\x47" and len(b) > 188 and b[188:189] == b"\x47" or b[:4] == b"OggS"
            or b[:3] == b"FLV" or b[:4] == b"\x30\x26\xb2\x75")


def _header_reason(exc: ProbeError, head: bytes, path: Path) -> str:
    if exc.timed_out:
        return reasons.PROBE_TIMED_OUT
    err = exc.stderr
    if "moov atom not found" in err:
        if not _iso_box(head):  # ffprobe picked the mp4 demuxer from the name only
            return reasons.UNRECOGNISED
        return reasons.MOOV_MISSING
    if "Invalid data found when processing input" in err:
        return reasons.UNRECOGNISED
    if "End of file" in err or "truncat" in err.lower():
        return reasons.HEADER_CUT if _known_container(head) else reasons.UNRECOGNISED
    return reasons.HEADER_CUT if _known_container(head) else reasons.UNRECOGNISED


def _too_long(duration: float, s: Settings) -> str:
    return reasons.too_long(duration, s.max_duration_s)


def _container(fmt_name: str, path: Path) -> str:
    ext = path.suffix.lower()
    if fmt_name.startswith("mov,"):
        return "mov" if ext == ".mov" else "mp4"
    if fmt_name.startswith("matroska"):
        return "webm" if ext == ".webm" else "matroska"
    return fmt_name.split(",")[0]


def _rotation(st: dict) -> int:
    """Clockwise display rotation, following ffmpeg's autorotate (the display matrix is CCW)."""
    for sd in st.get("side_data_list", []) or []:
        if "rotation" in sd:
            return int(round(-float(sd["rotation"]) / 90.0)) * 90 % 360
    tag = (st.get("tags") or {}).get("rotate")  # very old ffprobe builds
    if tag is not None:
        return int(round(float(tag) / 90.0)) * 90 % 360
    return 0


def _sample_aspect(st: dict) -> Fraction:
    """The stream's sample (pixel) aspect ratio; "0:1", "N/A" or absurd values mean square."""
    try:
        num, den = (int(x) for x in str(st.get("sample_aspect_ratio") or "1:1").split(":"))
        sar = Fraction(num, den)
    except (ValueError, ZeroDivisionError):
        return Fraction(1)
    return sar if Fraction(1, 10) <= sar <= 10 else Fraction(1)


def _rate(s: str | None) -> float:
    try:
        r = Fraction(s or "0/0")
    except (ValueError, ZeroDivisionError):
        return 0.0
    return float(r) if r > 0 else 0.0


def _float(s) -> float | None:
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


def _int(s) -> int | None:
    try:
        return int(s)
    except (TypeError, ValueError):
        return None
