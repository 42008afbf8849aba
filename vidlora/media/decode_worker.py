"""The decode job: ``run(job)`` decodes one video's picks to JPEGs and says how it went.

It writes one JPEG per delivered frame (``{k:05d}.jpg`` in ``job["out_dir"]``, k = index among
the unique picks) and returns ``{"ok": true, "pts": [...]}`` or
``{"ok": false, "kind": "mismatch"|"damaged"|"error", "error": "..."}``; ``notes`` on success say
how it was decoded where that is worth keeping (a file that could not be sought in) (damaged: with the
table indices of the picks that decode only with errors). A job of kind ``first_picture`` is the
probe's decode check instead (``first_picture``).

It runs only in a worker that ``decode_server`` forks for the job, in a session of its own, so
that native decoders (which can hang holding the GIL, or crash) run in a process the caller can
kill with its whole group on timeout. As a second line of defence the job arms an alarm that
kills its own group (and any ffmpeg child) should the caller die without cleaning up.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

# PIL transpose for a clockwise display rotation (PIL's ROTATE_n turns counter-clockwise).
_TRANSPOSE = {90: "ROTATE_270", 180: "ROTATE_180", 270: "ROTATE_90"}


def run(job: dict) -> dict:
    if job.get("kind") == "first_picture":
        return first_picture(job)
    from PIL import Image

    from vidlora.media.decoders import Damaged, Mismatch, decode
    from vidlora.media.ffprobe import FrameTable

    if job.get("watchdog_s"):
        _watchdog(float(job["watchdog_s"]))
    out_dir = Path(job["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    rotation = int(job["rotation"])
    quality = int(job["quality"])
    transpose = getattr(Image.Transpose, _TRANSPOSE[rotation]) if rotation in _TRANSPOSE else None

    def emit(k: int, rgb) -> None:
        img = Image.fromarray(rgb, "RGB")
        if transpose is not None:
            img = img.transpose(transpose)
        img.save(out_dir / f"{k:05d}.jpg", "JPEG", quality=quality)

    replaced: list[int] = []
    notes: list[str] = []
    try:
        pts = decode(job["backend"], Path(job["path"]), FrameTable.from_json(job["table"]), job["picks"],
                     tuple(job["size"]), int(job["threads"]), emit, rotation, replaced,
                     deinterlace=bool(job.get("deinterlace")), container=job.get("container", ""),
                     floor=int(job.get("floor", -1)), notes=notes)
    except Mismatch as exc:
        return {"ok": False, "kind": "mismatch", "error": str(exc)[:300]}
    except Damaged as exc:
        return {"ok": False, "kind": "damaged", "error": str(exc), "picks": exc.picks, "sampled": exc.sampled}
    except Exception as exc:  # any decoder error is a failed attempt; the caller falls back
        return {"ok": False, "kind": "error", "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"ok": True, "pts": pts, "replaced": replaced, "notes": notes}


def first_picture(job: dict) -> dict:
    """Does the first video stream show a picture near its start? The probe's decode check in
    PyAV, which a warm server has loaded: ``{"ok": true, "picture": bool}``, or ``{"ok": false,
    "error": ...}``. One decoding thread: a frame-threaded decoder would decode frames ahead."""
    import av

    if job.get("watchdog_s"):
        _watchdog(float(job["watchdog_s"]))
    try:
        with av.open(job["path"]) as container:
            if not container.streams.video:
                return {"ok": True, "picture": False}
            stream = container.streams.video[0]
            stream.codec_context.thread_count = 1
            for _ in container.decode(stream):
                return {"ok": True, "picture": True}
    except Exception as exc:  # noqa: BLE001 - any failure leaves the verdict to ffmpeg's check
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"ok": True, "picture": False}


def _watchdog(seconds: float) -> None:
    def fire(signum, frame):  # noqa: ARG001
        os.killpg(0, signal.SIGKILL)

    signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
