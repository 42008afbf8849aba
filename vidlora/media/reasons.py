"""Why a video cannot be analysed: one vocabulary, in sentences a technician can act on.

Every reason says what is wrong, then what to do, in fixed words: no decoder log line
("h264: mmco: unref short failure"), no server path, nothing that changes between two runs of
the same file. The first words name the problem and stay stable (people filter on them:
"damaged video", "truncated", "not a video", "too long", ...); the rest of the sentence may be
reworded here, and only here. Each is under 160 characters: it is stored on the analysis row
and shown in lists.

Technical detail (which backend failed how) goes to the worker's log, not into the reason.
"""

from __future__ import annotations

REUPLOAD = "Upload a complete copy of the file."
REENCODE = "Re-encode it (for example to H.264 in MP4) and upload it again."

FILE_NOT_FOUND = "file not found: the stored upload is missing. Upload the file again."
EMPTY = "empty file (0 bytes): the upload holds no data. Upload the file again."
TEXT = "not a video file (text). Upload the video itself."
UNRECOGNISED = "not a video file (unrecognised data): no container format matches it. Upload the video itself."
NO_STREAMS = "not a video file: it holds no audio or video streams (its header may be damaged). Upload the video itself."
MOOV_MISSING = ("truncated or incomplete MP4 (cut short, or copied while still being written): the index "
                "(moov atom) is missing. " + REUPLOAD)
HEADER_CUT = "truncated or damaged header: the file ends or breaks inside its header. " + REUPLOAD
AUDIO_ONLY = "no video stream (audio-only file): there are no pictures to analyse. Upload a video."
NO_VIDEO = "no video stream: the file holds no pictures to analyse. Upload a video."
UNKNOWN_SIZE = "unknown frame size: the video header gives no picture size. " + REENCODE
EMPTY_CONTAINER = "zero duration: the file is a valid MP4 with no audio or video in it. Upload a recording that has pictures."
NO_FRAMES = "zero duration: the video track holds no frames. Upload a recording that has pictures."
PACKETS_UNREADABLE = "corrupt video stream: its packets cannot be read. " + REUPLOAD
PROBE_TIMED_OUT = "probe timed out: reading the file took longer than the time limit. Try again, or re-encode it."
DECODER_TIMED_OUT = ("decoder timed out: decoding the sampled frames took longer than the time limit. "
                     "Try again, or re-encode it.")
DECODING_FAILED = "decoding failed: no decoder could read the sampled pictures of this video. " + REENCODE


def image(fmt: str) -> str:
    return f"still image or animation ({fmt}), not a video. Convert it to a video file (for example MP4)."


def unsupported_fourcc(fourcc: str) -> str:
    return f"unsupported codec (fourcc {fourcc}): no decoder here reads it. {REENCODE}"


# Codecs every decoder here reads: "re-encode it to H.264" would tell the owner of an H.264
# file to turn it into what it already is. Such a file that yields no picture is damaged.
DECODABLE = frozenset({"h264", "hevc", "mpeg4", "mpeg2video", "mpeg1video", "vp8", "vp9", "av1", "mjpeg",
                       "prores", "dnxhd", "dvvideo", "theora", "h263", "msmpeg4v3", "wmv3", "vc1"})
# Advice for a file already in the codec REENCODE names.
REENCODE_SAME = "Re-encode it from the original recording and upload it again."


def undecodable(codec: str) -> str:
    if codec in DECODABLE:
        return (f"undecodable video ({codec}): the codec is supported, but no picture of this file decodes, "
                "so its data is damaged. Upload an undamaged copy.")
    return f"unsupported codec or undecodable video ({codec}): no picture decodes. {REENCODE}"


def decoding_failed(codec: str) -> str:
    """``DECODING_FAILED``, without advice to re-encode H.264 to H.264."""
    return DECODING_FAILED if codec != "h264" else DECODING_FAILED.replace(REENCODE, REENCODE_SAME)


def declared_but_unreadable(frames: int | None, seconds: float | None) -> str:
    said = f"{frames} frames" if frames else f"{seconds:g} s"
    return f"truncated or damaged video: the header declares {said}, but no frame can be read. {REUPLOAD}"


def too_large(w: int, h: int, limit: int) -> str:
    return f"resolution too large ({w}x{h} > {limit} pixels). Scale it down and upload it again."


def absurd_aspect(w: int, h: int, limit: int) -> str:
    return f"absurd resolution {w}x{h} (aspect ratio over {limit}:1): the model cannot take it. {REENCODE}"


def too_long(seconds: float, limit: float) -> str:
    return f"too long ({seconds:.0f} s > {limit:.0f} s limit). Cut it into shorter parts and upload those."


def damaged(bad: int, sampled: int, at: list[float]) -> str:
    where = ", ".join(f"{t:g} s" for t in at)
    return (f"damaged video: {bad} of {sampled} sampled frames decode only with errors and have no clean "
            f"frame nearby (at {where}). Upload an undamaged copy.")


def _spans(at: list[float]) -> str:
    """Sorted instants as runs: "3.6-4 s, 7.2 s" (neighbours within a second join a run)."""
    runs: list[list[float]] = []
    for t in sorted(at):
        if runs and t - runs[-1][1] <= 1.0:
            runs[-1][1] = t
        else:
            runs.append([t, t])
    shown = [f"{a:g}-{b:g} s" if b > a else f"{a:g} s" for a, b in runs[:2]]
    return ", ".join(shown) + (" and elsewhere" if len(runs) > 2 else "")


def replaced_damaged(moved: int, at: list[float]) -> str:
    """The frame set's note when sampled frames fell where the file lost data."""
    frames = "frame there was" if moved == 1 else "frames there were"
    return (f"the file is damaged at {_spans(at)} (data lost in recording or copying): {moved} sampled "
            f"{frames} replaced by the nearest clean frame, each shown with its own time")


def damaged_stretch(bad: int, sampled: int, at: list[float]) -> str:
    return (f"damaged video: {bad} of {sampled} sampled frames fall where the file is damaged ({_spans(at)}) "
            "and have no clean frame nearby. Upload an undamaged copy.")


def damaged_in_places(at: list[float]) -> str:
    return (f"damaged video: the file is damaged at {_spans(at)} and the sampled frames around it do not "
            "decode. Upload an undamaged copy.")


def window_after_end(start: float, duration: float) -> str:
    return (f"sampling window starts at {start:g} s, after the video ends ({duration:g} s). "
            "Change the scenario's start_s.")
