"""Generated test videos: a good corpus (every container/codec we claim to handle) and a bad one.

Everything is made by the system ``ffmpeg`` from lavfi sources, so nothing binary is checked in.
Files are cached under the directory you pass; the file name carries a hash of the recipe, so
changing a recipe regenerates that file and nothing else. Generation writes to a temporary name
and renames, so parallel test processes never see half-written files.

Frame code: every good video (except the 1080p one) carries a strip along the top of the
*stored* picture, in four quarters of grey levels ``16 + 14*k``: k = 0, N mod 16, N div 16, 15,
where ``N`` is the source frame number (the outer quarters calibrate the reading).
``read_frame_code`` recovers ``N`` from a decoded JPEG, so tests can prove a decoder returned
the frame it claims, not a neighbour. For the VFR clip ``N`` is the source frame number at
30 fps, so the frame shown at pts ``t`` must carry code ``round(t * 30)``.

Usage (other tests use this too)::

    from tests.support.corpus import good_videos, bad_videos
    vids = good_videos(cache_dir)            # {name: Path}
    bad = bad_videos(cache_dir)              # {name: (Path, expected reason substring)}
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import zlib
import struct
from pathlib import Path

FFMPEG = shutil.which("ffmpeg") or "/usr/bin/ffmpeg"
CORPUS_VERSION = "1"  # bump to regenerate everything

CODE_LEVELS = 16
CODE_STEP = 14
VFR_SOURCE_FPS = 30


def _encoders() -> str:
    out = subprocess.run([FFMPEG, "-hide_banner", "-encoders"], capture_output=True, text=True)
    return out.stdout


def _coded(w: int, h: int, rate: str, seconds: float, extra_vf: str = "", source: str = "testsrc2") -> list[str]:
    """ffmpeg input+filter args: testsrc2 (or ``source``) with a frame-code strip overlaid at the top."""
    strip_h = max(8, (h // 6) // 2 * 2)
    q = "floor(4*X/W)"  # strip quarters: [level 0 | N mod 16 | N div 16 | level 15]
    lum = (f"{16}+{CODE_STEP}*if(eq({q},0),0,if(eq({q},1),mod(N,{CODE_LEVELS}),"
           f"if(eq({q},2),mod(floor(N/{CODE_LEVELS}),{CODE_LEVELS}),{CODE_LEVELS - 1})))")
    graph = (
        f"{source}=s={w}x{h}:r={rate}:d={seconds}[bg];"
        f"color=c=black:s={w}x{strip_h}:r={rate}:d={seconds},format=yuv444p,"
        f"geq=lum='{lum}':cb=128:cr=128[strip];"
        f"[bg][strip]overlay=0:0:shortest=1{extra_vf}[v]"
    )
    return ["-filter_complex", graph, "-map", "[v]"]


def _plain(w: int, h: int, rate: str, seconds: float) -> list[str]:
    return ["-f", "lavfi", "-i", f"testsrc2=s={w}x{h}:r={rate}:d={seconds}"]


X264 = ["-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p"]


def _good_recipes() -> dict[str, tuple[str, list[list[str]]]]:
    """name -> (file name suffix, list of ffmpeg arg lists run in order; '{out}'/'{prev}')."""
    enc = _encoders()
    r: dict[str, tuple[str, list[list[str]]]] = {
        "h264_mp4": (".mp4", [[*_coded(320, 240, "30", 2), *X264, "{out}"]]),
        "vp9_webm": (".webm", [[*_coded(320, 240, "25", 2), "-c:v", "libvpx-vp9", "-deadline", "realtime",
                                "-cpu-used", "8", "-b:v", "0", "-crf", "35", "{out}"]]),
        "mjpeg_avi": (".avi", [[*_coded(320, 240, "25", 2), "-c:v", "mjpeg", "-q:v", "3",
                                "-pix_fmt", "yuvj420p", "{out}"]]),
        "h264_ts": (".ts", [[*_coded(320, 240, "25", 2), *X264, "-f", "mpegts", "{out}"]]),
        "h264_1080p": (".mp4", [[*_plain(1920, 1080, "30", 2), *X264, "{out}"]]),
        # Stored landscape 320x240, display rotation 90: must come out portrait (240 wide).
        # ffmpeg 5.1 has no -display_rotation; the legacy rotate tag works on a stream copy.
        "portrait_mp4": (".mp4", [
            [*_coded(320, 240, "30", 2), *X264, "{tmp}"],
            ["-i", "{tmp}", "-c", "copy", "-metadata:s:v:0", "rotate=90", "{out}"],
        ]),
        # Variable frame rate: drop source frames 3..6 of every 10 -> 1/30 s and 5/30 s gaps.
        "vfr_mp4": (".mp4", [[*_coded(320, 240, str(VFR_SOURCE_FPS), 3,
                                      ",select='not(between(mod(n\\,10)\\,3\\,6))'"),
                              *X264, "-vsync", "vfr", "{out}"]]),
        # Odd sizes: testsrc2 rounds to even, so scale after; H.264 needs 4:4:4 for odd sides.
        "odd_size_mp4": (".mp4", [[*_coded(332, 198, "24", 2, ",scale=333:199"), "-c:v", "libx264", "-preset", "veryfast",
                                   "-pix_fmt", "yuv444p", "{out}"]]),
    }
    if "libsvtav1" in enc:
        r["av1_mkv"] = (".mkv", [[*_coded(320, 240, "24", 1), "-c:v", "libsvtav1", "-preset", "12",
                                  "-pix_fmt", "yuv420p", "{out}"]])
    elif "libaom-av1" in enc:
        r["av1_mkv"] = (".mkv", [[*_coded(320, 240, "24", 1), "-c:v", "libaom-av1", "-cpu-used", "8",
                                  "-row-mt", "1", "-pix_fmt", "yuv420p", "{out}"]])
    return r


def _digest(*parts: object) -> str:
    return hashlib.sha1(repr((CORPUS_VERSION, parts)).encode()).hexdigest()[:10]


def _run_ffmpeg(steps: list[list[str]], out: Path) -> None:
    tmp_final = out.with_name(f".{out.stem}.{os.getpid()}{out.suffix}")
    tmp_mid = out.with_name(f".{out.stem}.{os.getpid()}.mid{out.suffix}")
    try:
        for step in steps:
            args = [a.replace("{out}", str(tmp_final)).replace("{tmp}", str(tmp_mid)) for a in step]
            subprocess.run([FFMPEG, "-nostdin", "-v", "error", "-y", *args], check=True, timeout=120,
                           env={**os.environ, "SVT_LOG": "1"})  # SVT-AV1 ignores -v; 1 = errors
        os.replace(tmp_final, out)
    finally:
        for p in (tmp_final, tmp_mid):
            p.unlink(missing_ok=True)


def good_videos(cache_dir: Path) -> dict[str, Path]:
    """Generate (once) and return the good corpus, keyed by a short name.

    Names: h264_mp4, vp9_webm, mjpeg_avi, h264_ts, h264_1080p, portrait_mp4, vfr_mp4,
    odd_size_mp4, and av1_mkv when the local ffmpeg has an AV1 encoder (absent otherwise).
    """
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    for name, (suffix, steps) in _good_recipes().items():
        path = cache_dir / f"{name}-{_digest(steps)}{suffix}"
        if not path.exists():
            _run_ffmpeg(steps, path)
        out[name] = path
    return out


def coded_videos() -> set[str]:
    """Names of good videos that carry the frame-code strip."""
    return {n for n in _good_recipes() if n != "h264_1080p"}


def read_frame_code(jpeg: Path, rotation: int = 0) -> int:
    """Recover the source frame number from a sampled JPEG (see module docstring).

    ``rotation`` is the clockwise display rotation the sampler applied; the strip sits at the
    top of the stored picture, so after 90 cw it is the right-hand column, and so on.
    """
    import numpy as np
    from PIL import Image

    img = np.asarray(Image.open(jpeg).convert("L"), dtype=np.float64)
    # Undo the display rotation so the strip is at the top again (np.rot90 turns ccw).
    img = np.rot90(img, k={0: 0, 90: 1, 180: 2, 270: 3}[rotation % 360])
    h, w = img.shape
    band = img[max(0, h // 60): max(2, h // 6 - h // 30)]  # inside the strip, off its edges
    m = w // 32
    q = [band[:, i * w // 4 + m: (i + 1) * w // 4 - m].mean() for i in range(4)]
    # The outer quarters are levels 0 and 15: calibrate against them, so it does not matter
    # whether the decoder mapped limited-range luma to full range (MJPEG is full range).
    step = (q[3] - q[0]) / (CODE_LEVELS - 1)
    lo = int(round((q[1] - q[0]) / step))
    hi = int(round((q[2] - q[0]) / step))
    return hi * CODE_LEVELS + lo


# -- fidelity corpus: real-world shapes the first probe got wrong (issue 13) ------------------

def _fidelity_recipes() -> dict[str, tuple[str, list[list[str]]]]:
    coded = _coded(176, 144, "25", 3)
    return {
        # Cut with -ss and stream copy: the file starts at the keyframe before 0.5 s and an
        # edit list discards the packets up to 0.5 s, so the first packet is never shown.
        "edit_list_mp4": (".mp4", [[*coded, *X264, "-g", "25", "{tmp}"],
                                   ["-ss", "0.5", "-i", "{tmp}", "-c", "copy", "{out}"]]),
        # Non-square pixels: stored 176x144 with SAR 128:117, shown 193x144.
        "sar_mp4": (".mp4", [[*_coded(176, 144, "25", 2, ",setsar=128/117"), *X264, "{out}"]]),
        # Raw elementary streams: no container, no timestamps.
        "mpeg2_es_mpv": (".mpv", [[*coded, "-c:v", "mpeg2video", "-q:v", "3", "-f", "mpeg2video", "{out}"]]),
        "h264_es": (".h264", [[*coded, *X264, "-f", "h264", "{out}"]]),
        # An MPEG program stream, to be cut mid-stream (fidelity_videos cuts it).
        "ps_full_mpg": (".mpg", [[*coded, "-c:v", "mpeg2video", "-q:v", "3", "-g", "12", "-f", "vob", "{out}"]]),
    }


def fidelity_videos(cache_dir: Path) -> dict[str, Path]:
    """Generate (once): the fidelity corpus (names above) plus ``ps_cut_mpg``, the program
    stream with its first third cut off mid-packet, as a copy from a camera card that lost its
    start. Every one carries the frame-code strip."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    for name, (suffix, steps) in _fidelity_recipes().items():
        path = cache_dir / f"{name}-{_digest(steps)}{suffix}"
        if not path.exists():
            _run_ffmpeg(steps, path)
        out[name] = path
    full = out.pop("ps_full_mpg")
    cut = full.with_name(full.name.replace("ps_full_mpg", "ps_cut_mpg"))
    if not cut.exists():
        data = full.read_bytes()
        tmp = cut.with_name(f".{cut.name}.{os.getpid()}")
        tmp.write_bytes(data[len(data) // 3 + 777:])
        os.replace(tmp, cut)
    out["ps_cut_mpg"] = cut
    return out


# -- camcorder, broadcast and DVD footage (issue 31) ------------------------------------------

FOOTAGE_FPS = 25
LONG_TS_S = 20 * 60  # the long recording: 20 minutes at 1 frame a second, 64x36
LONG_TS_FPS = 1
# Interlaced clips are woven from a 50 fps source (two fields per frame): the frame at pts t
# holds source frames 2k (first field) and 2k+1, k = round(t * 25). Deinterlaced, it shows the
# first field's picture, so its frame code is 2k; woven, the strip reads neither.
WOVEN_FROM = 2 * FOOTAGE_FPS


def _woven(w: int, h: int, seconds: float, top_first: bool = True) -> list[str]:
    """A frame-coded 50 fps source woven into 25 fps interlaced frames (first field = even
    source frame), flagged top or bottom field first."""
    mode, flag = ("interleave_top", "tff") if top_first else ("interleave_bottom", "bff")
    return _coded(w, h, str(WOVEN_FROM), seconds, f",tinterlace={mode},setfield={flag}")


def _footage_recipes() -> dict[str, tuple[str, list[list[str]]]]:
    sine = ["-f", "lavfi", "-i", "sine=f=440:d=4"]
    coded = _coded(176, 144, str(FOOTAGE_FPS), 4)
    half = [*X264, "-g", "25", "-f", "mpegts"]
    return {
        # AVCHD-like: interlaced (MBAFF, top field first) H.264 in MPEG-TS with AC-3 audio,
        # tiny instead of 1920x1080 so CI stays fast; named .MTS as cameras do.
        "avchd_mts": (".MTS", [[*sine, *_woven(192, 128, 3), "-map", "0:a", *X264, "-flags", "+ildct+ilme",
                                "-x264-params", "tff=1", "-g", "12", "-c:a", "ac3", "-shortest",
                                "-f", "mpegts", "{out}"]]),
        # A long broadcast-like recording, cheap to make and to scan: 20 min, 64x36, 1 fps,
        # a keyframe every 10 s.
        "long_ts": (".ts", [[*_coded(64, 36, str(LONG_TS_FPS), LONG_TS_S), *X264, "-g", "10",
                             "-f", "mpegts", "{out}"]]),
        # DVD: interlaced MPEG-2 in a program stream (.VOB), top field first, MP2 audio.
        "dvd_vob": (".VOB", [[*sine, *_woven(176, 144, 3), "-map", "0:a", "-c:v", "mpeg2video", "-q:v", "3",
                              "-g", "12", "-flags", "+ildct+ilme", "-top", "1", "-c:a", "mp2", "-shortest",
                              "-f", "vob", "{out}"]]),
        # Old tapes: DV in AVI (PAL DV is 720x576, bottom field first: DV allows no other size).
        "dv_avi": (".avi", [[*_woven(720, 576, 1, top_first=False), "-c:v", "dvvideo", "-pix_fmt", "yuv420p",
                             "-top", "0", "{out}"]]),
        # MJPEG carries no field order, so the probe asks ffmpeg's idet; testsrc2 fools idet
        # into "top field first" even when progressive (its fine line pattern), testsrc does not.
        "mjpeg_avi": (".avi", [[*_coded(176, 144, str(FOOTAGE_FPS), 4, source="testsrc"), "-c:v", "mjpeg", "-q:v", "3",
                                "-pix_fmt", "yuvj420p", "{out}"]]),
        # H.264 in AVI: AVI stores no pts; without B-frames they are the dts (no decode to learn them).
        "h264_avi": (".avi", [[*coded, *X264, "-bf", "0", "{out}"]]),
        # Two recordings joined: both halves start at the same pts (footage_videos cats them);
        # the codes run on, 0..49 then 50..99.
        "joined_a": (".ts", [[*_coded(176, 144, str(FOOTAGE_FPS), 2), *half, "{out}"]]),
        "joined_b": (".ts", [[*_coded(176, 144, str(FOOTAGE_FPS), 4, ",trim=start_frame=50,setpts=PTS-STARTPTS"),
                              *half, "{out}"]]),
        # MKV whose timestamps start below zero (B-frames, no shift): ffprobe sees no pts at all.
        "negative_mkv": (".mkv", [[*coded, *X264, "-bf", "2", "-output_ts_offset", "-0.5",
                                   "-avoid_negative_ts", "disabled", "{out}"]]),
        # Full files cut in half (footage_videos cuts them): index at the front, so the MP4
        # still declares its 4 s; the TS ends part-way through a packet.
        "full_mp4": (".mp4", [[*coded, *X264, "-movflags", "+faststart", "{out}"]]),
        "full_ts": (".ts", [[*coded, *X264, "-g", "25", "-f", "mpegts", "{out}"]]),
    }


def footage_videos(cache_dir: Path) -> dict[str, Path]:
    """Generate (once): avchd_mts, long_ts, dvd_vob, dv_avi, mjpeg_avi, h264_avi, joined_ts (two TS
    recordings joined with ``cat``: 4 s, timestamps start over at 2 s), negative_mkv,
    truncated_mp4 and truncated_ts (the first 55 % of a 4 s file). All 25 fps except long_ts
    (1 fps), all frame-coded; the interlaced ones see ``WOVEN_FROM``."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    made: dict[str, Path] = {}
    for name, (suffix, steps) in _footage_recipes().items():
        path = cache_dir / f"{name}-{_digest(steps)}{suffix}"
        if not path.exists():
            _run_ffmpeg(steps, path)
        made[name] = path

    def derived(name: str, suffix: str, parts: list[Path], keep: float = 1.0) -> Path:
        path = cache_dir / f"{name}-{_digest([p.name for p in parts], keep)}{suffix}"
        if not path.exists():
            data = b"".join(p.read_bytes() for p in parts)
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            if keep < 1:  # cut at a byte that never falls on a packet edge (7k+3 is odd)
                data = data[: int(len(data) * keep) // 7 * 7 + 3]
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return path

    out = {k: v for k, v in made.items() if not k.startswith(("joined_", "full_"))}
    out["joined_ts"] = derived("joined_ts", ".ts", [made["joined_a"], made["joined_b"]])
    out["truncated_mp4"] = derived("truncated_mp4", ".mp4", [made["full_mp4"]], 0.55)
    out["truncated_ts"] = derived("truncated_ts", ".ts", [made["full_ts"]], 0.55)
    return out


# -- footage, second round (issue 49): open GOPs, AVI B-frames, honest partial notices -------

ROUND2_S = 4  # every clip: 4 s (3 s of video in the audio cases), 176x144, 25 fps, frame-coded
OPEN_GOP = ["-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p", "-bf", "3",
            "-x264-params", "open-gop=1:keyint=25:min-keyint=25:scenecut=0"]
DECLARED_HOURS = 100


def _round2_recipes() -> dict[str, tuple[str, list[list[str]]]]:
    coded = _coded(176, 144, str(FOOTAGE_FPS), ROUND2_S)
    short = _coded(176, 144, str(FOOTAGE_FPS), 3)
    longer_audio = ["-f", "lavfi", "-i", "sine=f=440:d=5"]
    # MPEG-4 ASP says no field order: testsrc, not testsrc2, so idet sees progressive (above)
    asp = _coded(176, 144, str(FOOTAGE_FPS), ROUND2_S, source="testsrc")
    return {
        # Broadcast / AVCHD H.264 (open GOPs: B-frames shown before each I-frame reference the
        # previous GOP) remuxed with -c copy, as users do with .MTS files.
        "open_gop_mp4": (".mp4", [[*coded, *OPEN_GOP, "{out}"]]),
        "open_gop_mkv": (".mkv", [[*coded, *OPEN_GOP, "{tmp}"], ["-i", "{tmp}", "-c", "copy", "{out}"]]),
        # XviD (MPEG-4 ASP, two B-frames) in AVI with MP3, as DVD rips and old cameras made them;
        # and H.264 with B-pyramids in AVI (decoder delay 2). AVI stores no pts for them.
        "xvid_avi": (".avi", [["-f", "lavfi", "-i", f"sine=f=440:d={ROUND2_S}", *asp, "-map", "0:a",
                               "-c:v", "mpeg4", "-vtag", "XVID", "-bf", "2", "-q:v", "4", "-g", "25",
                               "-c:a", "libmp3lame", "{out}"]]),
        "h264_bframes_avi": (".avi", [[*coded, *X264, "-bf", "3", "-g", "25", "{out}"]]),
        # Complete files whose audio outlasts the pictures (MKV), or starts a second before
        # them (WebM): Matroska keeps no per-stream duration, so the file's is the audio's.
        "audio_longer_mkv": (".mkv", [[*longer_audio, *short, "-map", "0:a", *X264, "-c:a", "aac", "{out}"]]),
        "audio_first_webm": (".webm", [["-f", "lavfi", "-i", "sine=f=440:d=4",
                                        *_coded(176, 144, str(FOOTAGE_FPS), 3, ",setpts=PTS+1/TB"), "-map", "0:a",
                                        "-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8",
                                        "-g", "25", "-c:a", "libopus", "{out}"]]),
        # An AVI whose header is rewritten to declare DECLARED_HOURS (round2_videos patches it).
        "short_avi": (".avi", [[*_coded(176, 144, str(FOOTAGE_FPS), 3, source="testsrc"), "-c:v", "mpeg4", "-q:v", "4",
                                "-g", "25", "{out}"]]),
    }


def _avi_declares(data: bytes, frames: int) -> bytes:
    """The AVI with its main header's total frames and its video stream header's length set to
    ``frames`` (a header that claims far more than the file holds)."""
    out = bytearray(data)
    strh = out.index(b"strh")
    assert out[strh + 8:strh + 12] == b"vids"
    out[strh + 40:strh + 44] = struct.pack("<I", frames)  # dwLength
    avih = out.index(b"avih")
    out[avih + 24:avih + 28] = struct.pack("<I", frames)  # dwTotalFrames
    return bytes(out)


def round2_videos(cache_dir: Path) -> dict[str, Path]:
    """Generate (once): open_gop_mp4, open_gop_mkv, xvid_avi, h264_bframes_avi (4 s each),
    audio_longer_mkv, audio_first_webm (3 s of video, complete), cut_avi (xvid_avi cut to its
    first 55 %, index lost), declares_100h_avi (3 s of video, header declares 100 hours).
    All 25 fps, frame-coded."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    made: dict[str, Path] = {}
    for name, (suffix, steps) in _round2_recipes().items():
        path = cache_dir / f"{name}-{_digest(steps)}{suffix}"
        if not path.exists():
            _run_ffmpeg(steps, path)
        made[name] = path

    def derived(name: str, source: Path, change) -> Path:
        path = cache_dir / f"{name}-{_digest(source.name)}{source.suffix}"
        if not path.exists():
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_bytes(change(source.read_bytes()))
            os.replace(tmp, path)
        return path

    out = {k: v for k, v in made.items() if k != "short_avi"}
    out["cut_avi"] = derived("cut_avi", made["xvid_avi"], lambda d: d[: int(len(d) * 0.55) // 7 * 7 + 3])
    out["declares_100h_avi"] = derived("declares_100h_avi", made["short_avi"],
                                       lambda d: _avi_declares(d, DECLARED_HOURS * 3600 * FOOTAGE_FPS))
    return out


# -- footage, third round (issue 62): drop-outs, cut open GOPs, files still being written -------

ROUND3_S = 4  # 176x144, 25 fps, frame-coded
DROPOUT_AT_S = 2.8  # where the transport stream loses packets: inside its second GOP (2..4 s)
DROPOUT_PACKETS = 14
OPEN_GOP_CUT_S = 1.5  # ffmpeg's stream-copy cut lands on a keyframe: source frame 50 comes first
OPEN_GOP_CUT_FRAMES = 50  # the frame code of the cut file's first frame


def _round3_recipes() -> dict[str, tuple[str, list[list[str]]]]:
    coded = _coded(176, 144, str(FOOTAGE_FPS), ROUND3_S)
    open_gop_src = [*_coded(176, 144, str(FOOTAGE_FPS), 5), *OPEN_GOP, "-f", "mpegts", "{tmp}"]
    return {
        # A broadcast recording (keyframe every 2 s) that dropout_videos damages in one place.
        "dropout_src_ts": (".ts", [[*coded, *X264, "-g", "50", "-f", "mpegts", "{out}"]]),
        # Open-GOP H.264 (broadcast/AVCHD) cut with -c copy, as users trim recordings: the file
        # starts at an I-frame whose leading pictures are gone with the GOP before it.
        "open_gop_cut_mp4": (".mp4", [open_gop_src, ["-ss", str(OPEN_GOP_CUT_S), "-i", "{tmp}", "-c", "copy", "{out}"]]),
        "open_gop_cut_mkv": (".mkv", [open_gop_src, ["-ss", str(OPEN_GOP_CUT_S), "-i", "{tmp}", "-c", "copy", "{out}"]]),
        "open_gop_cut_ts": (".ts", [open_gop_src, ["-ss", str(OPEN_GOP_CUT_S), "-i", "{tmp}", "-c", "copy",
                                                   "-f", "mpegts", "{out}"]]),
        # The same cut of an interlaced (MBAFF) camcorder recording: read by the ffmpeg backend.
        "open_gop_cut_avchd": (".MTS", [[*_woven(176, 144, 5), *OPEN_GOP, "-flags", "+ildct+ilme", "-x264-params",
                                         "open-gop=1:keyint=25:min-keyint=25:scenecut=0:tff=1", "-f", "mpegts", "{tmp}"],
                                        ["-ss", str(OPEN_GOP_CUT_S), "-i", "{tmp}", "-c", "copy", "-f", "mpegts", "{out}"]]),
        # Audio that starts 5 s before the pictures, Opus (its pre-skip puts the file's start
        # below zero, and ffprobe then gives the video that start and a span to the file's end).
        "audio_5s_first_mkv": (".mkv", [["-f", "lavfi", "-i", "sine=f=440:d=8",
                                         *_coded(176, 144, str(FOOTAGE_FPS), 3, ",setpts=PTS+5/TB"), "-map", "0:a",
                                         *X264, "-c:a", "libopus", "{out}"]]),
        # Recordings written as a stream (no seeking back to finish the header: a recorder still
        # writing, or writing to a pipe): growing_videos takes snapshots of them part-way.
        "live_mkv": (".mkv", [[*coded, *X264, "-g", "25", "-f", "matroska", "-live", "1", "{out}"]]),
        "live_fmp4": (".mp4", [[*coded, *X264, "-g", "25", "-movflags", "frag_keyframe+empty_moov+default_base_moof",
                                "{out}"]]),
        "live_ts": (".ts", [[*coded, *X264, "-g", "25", "-f", "mpegts", "{out}"]]),
    }


def _drop_packets(ts: Path, at_s: float, count: int) -> bytes:
    """The transport stream with ``count`` 188-byte packets lost inside the video frame shown
    at ``at_s`` (its PES header kept, so the demuxer sees the gap only by the continuity
    counter), as a reception drop-out or a bad sector leaves it."""
    out = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries",
                          "packet=pts_time,pos", "-of", "csv=p=0", str(ts)], capture_output=True, text=True,
                         check=True).stdout
    rows = [(float(t), int(p)) for t, p in (ln.split(",")[:2] for ln in out.split() if ln.count(",") >= 1)]
    start = rows[0][0]
    pos = min(rows, key=lambda r: abs(r[0] - start - at_s))[1]
    data = ts.read_bytes()
    first = pos // 188 * 188 + 188
    return data[:first] + data[first + count * 188:]


def round3_videos(cache_dir: Path) -> dict[str, Path]:
    """Generate (once): dropout_ts (dropout_src_ts, 4 s, losing ``DROPOUT_PACKETS`` packets
    at ``DROPOUT_AT_S``), open_gop_cut_mp4 / open_gop_cut_mkv (3.5 s cut from 5 s of open-GOP
    H.264 with -c copy), audio_5s_first_mkv (3 s of video 5 s into 8 s of audio), and the
    streamed recordings live_mkv, live_fmp4, live_ts (4 s; ``snapshot`` cuts them)."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    for name, (suffix, steps) in _round3_recipes().items():
        path = cache_dir / f"{name}-{_digest(steps)}{suffix}"
        if not path.exists():
            _run_ffmpeg(steps, path)
        out[name] = path
    src = out["dropout_src_ts"]
    drop = cache_dir / f"dropout_ts-{_digest(src.name, DROPOUT_AT_S, DROPOUT_PACKETS)}.ts"
    if not drop.exists():
        tmp = drop.with_name(f".{drop.name}.{os.getpid()}")
        tmp.write_bytes(_drop_packets(src, DROPOUT_AT_S, DROPOUT_PACKETS))
        os.replace(tmp, drop)
    out["dropout_ts"] = drop
    return out


def snapshot(src: Path, dst: Path, keep: float) -> Path:
    """What a copy of ``src`` taken while it was being written holds: its first ``keep`` part,
    cut where a writer's buffer would end (not on a packet, box or element edge)."""
    data = src.read_bytes()
    dst.write_bytes(data[: int(len(data) * keep) // 7 * 7 + 3])
    return dst


DVD_TITLE_S = 6  # the title: 6 s, 176x144, 25 fps, MPEG-2 with MP2 audio, frame-coded


def dvd_title_set(cache_dir: Path) -> tuple[Path, list[bytes], bytes]:
    """A DVD title as a disc holds it: (the whole program stream, its three parts
    VTS_01_1..3.VOB cut at pack boundaries part-way through GOPs, as the disc's 1 GB limit
    cuts them, and the set's VTS_01_0.IFO, declaring the title's sectors)."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    steps = [["-f", "lavfi", "-i", f"sine=f=440:d={DVD_TITLE_S}", *_coded(176, 144, str(FOOTAGE_FPS), DVD_TITLE_S),
              "-map", "0:a", "-c:v", "mpeg2video", "-q:v", "3", "-g", "12", "-c:a", "mp2", "-shortest",
              "-f", "vob", "{out}"]]
    whole = cache_dir / f"dvd_title-{_digest(steps)}.VOB"
    if not whole.exists():
        _run_ffmpeg(steps, whole)
    data = whole.read_bytes()
    cuts = [len(data) * 37 // 100 // 2048 * 2048, len(data) * 71 // 100 // 2048 * 2048]
    parts = [data[:cuts[0]], data[cuts[0]:cuts[1]], data[cuts[1]:]]
    sectors = -(-len(data) // 2048)
    # VTSI_MAT: the IFO is sector 0 (last IFO sector 0), the title VOBs start at sector 1, the
    # backup IFO takes the sector after them, which is the set's last.
    ifo = bytearray(2048)
    ifo[:12] = b"DVDVIDEO-VTS"
    ifo[0x0C:0x10] = (1 + sectors).to_bytes(4, "big")
    ifo[0x1C:0x20] = (0).to_bytes(4, "big")
    ifo[0xC4:0xC8] = (1).to_bytes(4, "big")
    return whole, parts, bytes(ifo)


# -- damaged copies: bit flips in the coded data of each codec ----------------------------------

DAMAGE_CODECS = {
    "h264_mp4": (".mp4", ["-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p", "-g", "50"]),
    "hevc_mkv": (".mkv", ["-c:v", "libx265", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-x265-params",
                          "log-level=error:keyint=50"]),
    "vp9_webm": (".webm", ["-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8", "-g", "50"]),
    "mpeg4_avi": (".avi", ["-c:v", "mpeg4", "-q:v", "4", "-g", "50"]),
}


def damaged_videos(cache_dir: Path, flips: int = 60, seed: int = 7) -> dict[str, tuple[Path, Path]]:
    """name -> (clean original, a copy with ``flips`` single-bit flips spread over the coded data
    after the first fifth of the file, headers and index left alone). 4 s, 25 fps, frame-coded."""
    import random

    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, (suffix, enc) in DAMAGE_CODECS.items():
        steps = [[*_coded(176, 144, "25", 4), *enc, "{out}"]]
        clean = cache_dir / f"{name}-{_digest(steps)}{suffix}"
        if not clean.exists():
            _run_ffmpeg(steps, clean)
        bad = clean.with_name(f"{clean.stem}-flip{flips}-{seed}{suffix}")
        if not bad.exists():
            data = bytearray(clean.read_bytes())
            rng = random.Random(seed)
            lo, hi = len(data) // 5, len(data) - max(4096, len(data) // 10)  # mp4 index at the end
            for _ in range(flips):
                i = rng.randrange(lo, hi)
                data[i] ^= 1 << rng.randrange(8)
            tmp = bad.with_name(f".{bad.name}.{os.getpid()}")
            tmp.write_bytes(bytes(data))
            os.replace(tmp, bad)
        out[name] = (clean, bad)
    return out


# -- bad corpus -------------------------------------------------------------------------------

def _png_bytes() -> bytes:
    """A valid 8x8 grey PNG, built by hand (no encoder needed)."""
    raw = b"".join(b"\x00" + bytes([128] * 8) for _ in range(8))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", 8, 8, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def bad_videos(cache_dir: Path) -> dict[str, tuple[Path, str]]:
    """Generate (once) and return files that ``probe`` must reject.

    Value: (path, a substring the ``BadVideo`` reason must contain). Cases:

    - ``empty``: zero bytes.
    - ``truncated_mp4``: H.264 mp4 (moov at the end, ffmpeg's default) cut to 40 %.
    - ``text_as_mp4`` / ``png_as_mp4``: text and a PNG named ``.mp4``.
    - ``audio_only``: AAC sine in an mp4, no video stream.
    - ``unsupported_codec``: MJPEG avi with its fourcc rewritten to the made-up ``VLRX``.
    - ``zero_duration``: an mp4 with a video track that holds no frames (``-t 0``).
    - ``huge_resolution``: one 8256x8192 MJPEG frame (> 8192*8192, the default
      ``max_video_pixels``); the largest cheap size ffmpeg makes, ~0.4 MB.
    - ``absurd_aspect``: one 20000x20 MJPEG frame (aspect ratio > 200:1, which the model's
      resizer cannot represent).
    - ``too_long``: two MJPEG frames 15,000 s apart in mkv: 30,000 s > the 6 h default.
    """
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, tuple[Path, str]] = {}

    def made(name: str, suffix: str, steps: list[list[str]]) -> Path:
        path = cache_dir / f"bad-{name}-{_digest(steps)}{suffix}"
        if not path.exists():
            _run_ffmpeg(steps, path)
        return path

    def written(name: str, suffix: str, data: bytes) -> Path:
        path = cache_dir / f"bad-{name}-{_digest(data)}{suffix}"
        if not path.exists():
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return path

    out["empty"] = (written("empty", ".mp4", b""), "empty file")

    full = made("full_for_truncation", ".mp4", [[*_plain(320, 240, "30", 2), *X264, "{out}"]])
    data = full.read_bytes()
    out["truncated_mp4"] = (written("truncated", ".mp4", data[: int(len(data) * 0.4)]), "truncated")

    out["text_as_mp4"] = (written("text", ".mp4", b"this is not a video\n" * 50), "not a video")
    out["png_as_mp4"] = (written("png", ".mp4", _png_bytes()), "still image")
    out["audio_only"] = (made("audio_only", ".mp4", [["-f", "lavfi", "-i", "sine=f=440:d=1",
                                                      "-c:a", "aac", "{out}"]]), "no video stream")
    mj = made("mjpeg_for_fourcc", ".avi", [[*_plain(64, 48, "10", 0.5), "-c:v", "mjpeg", "{out}"]])
    out["unsupported_codec"] = (written("unsupported_codec", ".avi", mj.read_bytes().replace(b"MJPG", b"VLRX")),
                                "unsupported codec")
    out["zero_duration"] = (made("zero_duration", ".mp4", [[*_plain(320, 240, "30", 1), "-t", "0",
                                                           *X264, "{out}"]]), "zero duration")
    out["huge_resolution"] = (made("huge", ".avi", [["-f", "lavfi", "-i", "color=black:s=8256x8192:r=1",
                                                     "-frames:v", "1", "-c:v", "mjpeg",
                                                     "-pix_fmt", "yuvj420p", "{out}"]]), "resolution")
    out["absurd_aspect"] = (made("aspect", ".avi", [["-f", "lavfi", "-i", "color=black:s=20000x20:r=1",
                                                     "-frames:v", "1", "-c:v", "mjpeg",
                                                     "-pix_fmt", "yuvj420p", "{out}"]]), "aspect ratio")
    out["too_long"] = (made("too_long", ".mkv", [["-f", "lavfi", "-i", "color=black:s=64x64:r=1/15000",
                                                  "-frames:v", "2", "-c:v", "mjpeg",
                                                  "-pix_fmt", "yuvj420p", "{out}"]]), "too long")
    return out


if __name__ == "__main__":  # python -m tests.support.corpus DIR : generate and list
    import sys

    d = Path(sys.argv[1] if len(sys.argv) > 1 else "test-artifacts/media-corpus")
    for k, v in good_videos(d).items():
        print("good", k, v)
    for k, (p, why) in bad_videos(d).items():
        print("bad ", k, p, repr(why))
