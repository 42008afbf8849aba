"""Decode jobs that misbehave, for ``decode_server`` to run in place of the real one
(``decode_server.ENTRY = "tests.support.fake_decoders:NAME"``): what the sampling side must
survive, in a worker forked exactly as a real decode is."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

# Where ``hang`` writes the pid of the child it starts (the server's environment carries it).
PIDFILE_ENV = "VIDLORA_TEST_PIDFILE"


def neighbouring_frames(job: dict) -> dict:
    """Claims success with the pts of each pick's next frame: the exactness check's case."""
    from PIL import Image

    out = Path(job["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    for k, _ in enumerate(job["picks"]):
        Image.new("RGB", tuple(job["size"])).save(out / f"{k:05d}.jpg")
    pts = job["table"]["pts"]
    return {"ok": True, "pts": [pts[min(i + 1, len(pts) - 1)] for i in job["picks"]]}


def hang(job: dict) -> dict:
    """Starts a child (as the ffmpeg backend does) and never returns."""
    child = subprocess.Popen(["sleep", "300"])
    Path(os.environ[PIDFILE_ENV]).write_text(str(child.pid))
    time.sleep(300)
    return {"ok": False, "kind": "error", "error": "unreachable"}


def crash(job: dict) -> dict:
    """Dies as a native decoder does on a bad pointer."""
    os.write(2, b"about to crash\n")
    os.kill(os.getpid(), signal.SIGSEGV)
    return {}


def chatty(job: dict) -> dict:
    """Prints to stdout and stderr, as native libraries do, then answers: nothing it prints
    may reach the server's protocol."""
    print("a line on stdout\n{\"pid\": 1}", flush=True)
    os.write(1, b"raw bytes on fd 1\n")
    os.write(2, b"a warning on stderr\n")
    return {"ok": True, "pid": os.getpid(), "marker": job.get("marker")}


_STATE: dict[str, int] = {}


def remember(job: dict) -> dict:
    """Counts its calls in a module global: every job starts from the server's state, so the
    count never grows."""
    _STATE["calls"] = _STATE.get("calls", 0) + 1
    return {"ok": True, "calls": _STATE["calls"], "pid": os.getpid(), "pgid": os.getpgid(0)}


def burn(job: dict) -> dict:
    """Uses ``job["cpu_s"]`` CPU seconds."""
    end = time.process_time() + float(job["cpu_s"])
    while time.process_time() < end:
        pass
    return {"ok": True}
