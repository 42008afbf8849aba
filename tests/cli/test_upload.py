"""`vidlora upload URL FILES -s S`: killed mid-file, run again, it resumes from the server's
offset and the file is ingested whole (the real server, a real cpu worker, the real CLI)."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from tests.support.env import ROOT
from tests.support.web_server import WebServer
from tests.support.workers import free_port, wait_for
from vidlora.db import session_scope
from vidlora.models import Batch, BatchItem, ResumableUpload, Video

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def server(database, broker, artifacts_dir):
    web = WebServer(artifacts_dir / "upload-cli-web.log")
    yield web
    web.stop()


@pytest.fixture(scope="module")
def token(database) -> str:
    from web.auth.tokens import create_token
    from web.auth.users import create_user

    with session_scope() as session:
        return create_token(session, create_user(session, "site-office", "correct horse battery"), "laptop", "review").token


def upload_cmd(server, token: str, *files: Path) -> list[str]:
    return [sys.executable, "-m", "cli", "upload", server.url, *map(str, files), "-s", "artifact_identification",
            "--name", "site office", "--token", token, "--chunk-mb", "1"]


def test_killed_mid_file_resumes_and_the_file_arrives_whole(server, token, cpu_worker, tmp_path):
    footage = tmp_path / "day 3.mts"
    with footage.open("wb") as fh:  # MPEG-TS sync bytes, then noise: cheap, no other known format
        fh.write(b"\x47" + os.urandom(40 * MiB - 1))
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("VIDLORA_UPLOAD_CACHE_DIR", None)

    first = subprocess.Popen(upload_cmd(server, token, footage), cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    assert first.stderr is not None
    for line in first.stderr:
        sent = re.match(r".*: (\d+) of (\d+) bytes", line)
        if sent and int(sent.group(1)) >= 6 * MiB:
            first.send_signal(signal.SIGKILL)
            break
    first.wait(timeout=30)
    assert first.returncode == -signal.SIGKILL

    def server_offset() -> tuple[int, str]:
        with session_scope() as session:
            row = session.scalar(select(ResumableUpload).where(ResumableUpload.filename == footage.name))
            return row.offset, row.key

    # The chunk in flight when the client died may still land; the resume must start from what
    # the server holds once it has settled, whatever that is.
    kept, key = server_offset()
    for _ in range(30):
        time.sleep(1.0)
        settled, _key = server_offset()
        if settled == kept:
            break
        kept = settled
    assert 6 * MiB <= kept < footage.stat().st_size
    assert list((tmp_path / "cache" / "vidlora").glob("uploads.json"))

    second = subprocess.run(upload_cmd(server, token, footage), cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    assert f"resuming at {kept} of {footage.stat().st_size} bytes" in second.stderr
    batch_id = int(re.search(r"batch (\d+): 1 file\(s\) uploaded", second.stdout).group(1))

    def stored():
        with session_scope() as session:
            return session.scalar(select(Video).join(BatchItem, BatchItem.video_id == Video.id)
                                  .where(BatchItem.batch_id == batch_id))

    video = wait_for(stored, timeout=120, what="the uploaded file ingested")
    assert video.sha256 == hashlib.sha256(footage.read_bytes()).hexdigest()
    with session_scope() as session:
        rows = session.scalars(select(ResumableUpload).where(ResumableUpload.filename == footage.name)).all()
        assert [r.key for r in rows] == [key]  # one upload, resumed: never started over
        assert session.get(Batch, batch_id).source == "api"


def test_refusals_are_said_in_words(server, token, tmp_path):
    notes = tmp_path / "notes.pdf"
    notes.write_bytes(b"%PDF-1.7\n")
    done = subprocess.run(upload_cmd(server, token, notes), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "not a video or an archive" in done.stderr

    disguised = tmp_path / "clip.mp4"
    disguised.write_bytes(b"%PDF-1.7\n" + b"0" * 4096)
    done = subprocess.run(upload_cmd(server, token, disguised), cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert done.returncode == 1 and "its content is a PDF document, not a video" in done.stderr

    wrong = subprocess.run(upload_cmd(server, "vl_not-a-token", disguised), cwd=ROOT, capture_output=True, text=True,
                           timeout=120, env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert wrong.returncode == 1 and "unknown, revoked" in wrong.stderr

    # The server out of reach: said so, and that running the command again resumes.
    class Unreachable:
        url = f"http://127.0.0.1:{free_port()}"

    clip = tmp_path / "a.mp4"
    clip.write_bytes(b"\0" * 4096)
    down = subprocess.run(upload_cmd(Unreachable, token, clip), cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert down.returncode == 1 and "run the same command again to resume" in down.stderr
