"""A camcorder day through the resumable upload API: memory of the web process and loopback
throughput, with the connection cut several times mid-chunk.

Issue 59. A real `vidlora web` (gunicorn, one worker process) on a fresh PostgreSQL database
takes one file of ``--size-gb`` (generated: a 4 MiB noise block repeated, each block stamped
with its offset, so no two blocks are equal; nothing is read from disk on the client side)
over tus 1.0 with an API token. Each PATCH carries everything that is left (so one request
streams gigabytes, past the 2 GiB form cap), and ``--disconnects`` times the client resets
the TCP connection mid-body (RST, no goodbye), asks the server for its offset (HEAD) and
resumes from there. The web worker's resident set (VmRSS) is sampled every 0.25 s; flat
means its peak stays within ``--flat-mib`` of the level it had after the first gigabyte.

Side by side, the same number of bytes written to a file on the same disk with the same
fsync cadence (``--baseline-gb`` of it, then scaled): the upload's MB/s over the disk's.
With ``--verify`` the received file's sha256 is compared with the sent one's. The upload is
terminated (DELETE) at the end, so its bytes are gone.

    .venv/bin/python bench/upload_resume.py --size-gb 20 --disconnects 3 --out bench/results/upload_resume
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import socket
import struct
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.rss import rss_kib  # noqa: E402  (after the path: runs as a script too)

BLOCK = 4 * 1024 * 1024
MiB = 1024 * 1024
FSYNC_EVERY = 64 * MiB  # vidlora.resumable.COMMIT_EVERY


def content(offset: int, length: int, noise: bytes):
    """Blocks of the generated file from ``offset``: the noise block with its offset stamped."""
    end = offset + length
    while offset < end:
        start = offset - offset % BLOCK
        block = struct.pack(">Q", start) + noise[8:]
        piece = block[offset - start:min(BLOCK, end - start)]
        yield piece
        offset += len(piece)


class Sampler(threading.Thread):
    def __init__(self, pid: int, sent: list[int]) -> None:
        super().__init__(daemon=True)
        self.pid, self.sent, self.samples, self.stop = pid, sent, [], threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self.stop.is_set():
            kib = rss_kib(self.pid)
            if kib is not None:
                self.samples.append((round(time.monotonic() - self.t0, 2), self.sent[0], kib))
            self.stop.wait(0.25)


def head(host: str, port: int, path: str, token: str) -> int:
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request("HEAD", path, headers={"Tus-Resumable": "1.0.0", "Authorization": f"Bearer {token}"})
    response = conn.getresponse()
    response.read()
    conn.close()
    assert response.status == 200, response.status
    return int(response.headers["Upload-Offset"])


def patch(host: str, port: int, path: str, token: str, offset: int, length: int, noise: bytes,
          cut_after: int | None, sent: list[int], digest) -> tuple[int, str]:
    """Stream ``length`` bytes from ``offset``; with ``cut_after``, reset the connection once
    that many are sent. Returns (status, answer)."""
    conn = http.client.HTTPConnection(host, port, timeout=600)
    conn.putrequest("PATCH", path, skip_accept_encoding=True)
    for name, value in {"Tus-Resumable": "1.0.0", "Authorization": f"Bearer {token}", "Upload-Offset": str(offset),
                        "Content-Type": "application/offset+octet-stream", "Content-Length": str(length)}.items():
        conn.putheader(name, value)
    conn.endheaders()
    done = 0
    for piece in content(offset, length if cut_after is None else cut_after, noise):
        conn.sock.sendall(piece)
        done += len(piece)
        sent[0] = offset + done
        if digest is not None and cut_after is None:
            digest.update(piece)
    if cut_after is not None:
        time.sleep(0.5)  # what is in flight arrives; then the link dies
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.sock.close()
        return 0, "cut"
    response = conn.getresponse()
    body = response.read().decode(errors="replace")
    conn.close()
    return response.status, response.headers.get("Upload-Offset") or body


def disk_baseline(folder: Path, size: int, noise: bytes) -> float:
    """MB/s writing ``size`` bytes of the same content to a file beside the upload's."""
    path = folder / "baseline.part"
    t0 = time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        written = synced = 0
        for piece in content(0, size, noise):
            os.write(fd, piece)
            written += len(piece)
            if written - synced >= FSYNC_EVERY:
                os.fsync(fd)
                synced = written
        os.fsync(fd)
    finally:
        os.close(fd)
        path.unlink()
    return size / (time.monotonic() - t0) / 1e6


def run(args) -> dict[str, Any]:
    from bench.pipeline import Services, machine
    from tests.support.web_server import WebServer
    from vidlora.config import DEMO_MODEL, get_settings
    from vidlora.db import session_scope
    from web.auth.tokens import create_token
    from web.auth.users import create_user

    os.environ.setdefault("VIDLORA_MODEL", str(DEMO_MODEL / "base"))  # no engine here; skip the tiny model build
    os.environ.setdefault("VIDLORA_ADAPTER_ROOT", str(DEMO_MODEL / "adapters"))
    from tests.conftest import _claim_redis_db, _release_redis_db

    size = int(args.size_gb * 1e9)
    noise = os.urandom(BLOCK)
    redis_db = _claim_redis_db()  # never another session's: Services flushes it
    try:
        return _run(args, size, noise, redis_db)
    finally:
        _release_redis_db(redis_db)


def _run(args, size: int, noise: bytes, redis_db: int) -> dict[str, Any]:
    from bench.pipeline import Services, machine
    from tests.support.web_server import WebServer
    from vidlora.config import get_settings
    from vidlora.db import session_scope
    from web.auth.tokens import create_token
    from web.auth.users import create_user

    with Services("upload", redis_db, {"VIDLORA_RESUMABLE_MAX_BYTES": str(max(size, 2**31))}) as services:
        with session_scope() as session:
            token = create_token(session, create_user(session, "bench", "correct horse battery"), "bench", "review").token
        web = WebServer(services.run_dir / "web.log")
        try:
            host, port = "127.0.0.1", web.port
            conn = http.client.HTTPConnection(host, port, timeout=60)
            conn.request("POST", "/api/v1/uploads", headers={
                "Tus-Resumable": "1.0.0", "Authorization": f"Bearer {token}", "Upload-Length": str(size),
                "Upload-Metadata": "filename Y2FtY29yZGVyLWRheS5tdHM="})  # camcorder-day.mts
            created = conn.getresponse()
            created.read()
            assert created.status == 201, created.status
            path = created.headers["Location"]
            sent = [0]
            sampler = Sampler(web.worker_pid(), sent)
            sampler.start()
            cuts = [size * (i + 1) // (args.disconnects + 1) for i in range(args.disconnects)]
            digest = hashlib.sha256() if args.verify else None
            segments, offset, t0 = [], 0, time.monotonic()
            while offset < size:
                cut = next((c for c in cuts if c > offset), None)
                s0 = time.monotonic()
                status, answer = patch(host, port, path, token, offset, size - offset, noise,
                                       None if cut is None else cut - offset, sent, None)
                if cut is not None:
                    cuts.remove(cut)
                    for _ in range(120):  # the server may still be writing what arrived
                        time.sleep(0.5)
                        now = head(host, port, path, token)
                        if now == head(host, port, path, token):
                            break
                    segments.append({"from": offset, "sent_to": cut, "server_offset": now,
                                     "lost_bytes": cut - now, "s": round(time.monotonic() - s0, 2)})
                    offset = now
                    continue
                assert status == 204, (status, answer)
                segments.append({"from": offset, "to": int(answer), "s": round(time.monotonic() - s0, 2)})
                offset = int(answer)
            elapsed = time.monotonic() - t0
            sampler.stop.set()
            sampler.join()
            media = Path(get_settings().media_root)
            part = next((media / "resumable").glob("*.part"))
            received_size = part.stat().st_size
            verified = None
            if args.verify:
                for piece in content(0, size, noise):
                    digest.update(piece)
                local = hashlib.sha256()
                with part.open("rb") as fh:
                    for chunk in iter(lambda: fh.read(8 * MiB), b""):
                        local.update(chunk)
                verified = local.hexdigest() == digest.hexdigest()
            conn = http.client.HTTPConnection(host, port, timeout=60)
            conn.request("DELETE", path, headers={"Tus-Resumable": "1.0.0", "Authorization": f"Bearer {token}"})
            assert conn.getresponse().status == 204
            assert not part.exists()
            baseline_size = min(size, int(args.baseline_gb * 1e9))
            disk_mbs = disk_baseline(media / "resumable", baseline_size, noise)
        finally:
            web.stop()
    rss = [kib for _, _, kib in sampler.samples]
    settled = [kib for _, done, kib in sampler.samples if done >= min(1e9, size / 4)]
    upload_mbs = size / elapsed / 1e6
    return {
        "command": "python bench/upload_resume.py " + " ".join(sys.argv[1:]),
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(), "load_average_at_end": [round(x, 1) for x in os.getloadavg()], "size_bytes": size, "received_bytes": received_size, "disconnects": args.disconnects,
        "segments": segments, "elapsed_s": round(elapsed, 1), "upload_mb_s": round(upload_mbs, 1),
        "disk_baseline_mb_s": round(disk_mbs, 1), "baseline_bytes": baseline_size,
        "upload_over_disk": round(upload_mbs / disk_mbs, 3), "sha256_verified": verified,
        "rss_mib": {"first": round(rss[0] / 1024, 1), "settled": round(settled[0] / 1024, 1),
                    "peak": round(max(rss) / 1024, 1), "last": round(rss[-1] / 1024, 1),
                    "peak_over_settled": round(max(rss) / settled[0], 3)},
        "flat": max(rss) - settled[0] <= args.flat_mib * 1024,
        "rss_samples": sampler.samples[:: max(1, len(sampler.samples) // 400)],
    }


def write(result: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    r, m = result["rss_mib"], result["machine"]
    lines = [
        "# Resumable upload: a large file over tus with forced disconnects (issue 59)", "",
        f"Command: `{result['command']}` ({result['when']}, {m['cpus']} CPUs, {m['platform']}; load average "
        f"{result['load_average_at_end']} at the end: the machine was shared).", "",
        f"- File: {result['size_bytes'] / 1e9:.1f} GB generated, sent to a real `vidlora web` (gunicorn, 1 worker) "
        f"over loopback with an API token; {result['disconnects']} TCP resets mid-PATCH, each followed by HEAD and a "
        "PATCH from the server's offset.",
        f"- Received: {result['received_bytes']} bytes of {result['size_bytes']}"
        + (f"; sha256 {'matches' if result['sha256_verified'] else 'DIFFERS'}" if result["sha256_verified"] is not None else ""),
        f"- Throughput: **{result['upload_mb_s']} MB/s** over {result['elapsed_s']} s including the cuts and resumes; "
        f"writing the same bytes straight to a file on the same disk ({result['baseline_bytes'] / 1e9:.1f} GB, same fsync "
        f"cadence): {result['disk_baseline_mb_s']} MB/s; ratio upload/disk **{result['upload_over_disk']}**.",
        f"- Web worker RSS: {r['first']} MiB at the start, {r['settled']} MiB after the first GB, peak {r['peak']} MiB, "
        f"last {r['last']} MiB: peak/settled **{r['peak_over_settled']}** ({'flat' if result['flat'] else 'NOT flat'}).",
        "", "| segment | from (bytes) | to / cut at | server offset after | lost at the cut | seconds |",
        "|---|---|---|---|---|---|",
    ]
    for i, s in enumerate(result["segments"], 1):
        if "sent_to" in s:
            lines.append(f"| {i} (cut) | {s['from']} | {s['sent_to']} | {s['server_offset']} | {s['lost_bytes']} | {s['s']} |")
        else:
            lines.append(f"| {i} | {s['from']} | {s['to']} | {s['to']} | 0 | {s['s']} |")
    lines += ["", "RSS samples (seconds, bytes sent, KiB) are in the .json beside this file.", ""]
    out.with_suffix(".md").write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=20.0)
    parser.add_argument("--disconnects", type=int, default=3)
    parser.add_argument("--baseline-gb", type=float, default=4.0)
    parser.add_argument("--flat-mib", type=float, default=32.0)
    parser.add_argument("--verify", action="store_true", help="Compare the received file's sha256 with the sent one's.")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    free = os.statvfs("/tmp").f_bavail * os.statvfs("/tmp").f_frsize
    if free < args.size_gb * 1e9 + 4e9:
        sys.exit(f"needs {args.size_gb + 4:.0f} GB free for the upload and the store's margin; {free / 1e9:.0f} GB free")
    result = run(args)
    print(json.dumps({k: v for k, v in result.items() if k != "rss_samples"}, indent=1))
    if args.out:
        write(result, args.out)


if __name__ == "__main__":
    main()
