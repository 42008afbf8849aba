"""Resumable uploads (tus 1.0) through the real server: `vidlora web` (gunicorn) in its own
process, a real cpu worker ingesting what a batch takes, PostgreSQL holding every offset."""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import time
from pathlib import Path

import pytest
import requests
from sqlalchemy import select, update

from tests.support.web_server import WebServer
from tests.support.workers import wait_for
from vidlora.config import get_settings, reset_settings
from vidlora.db import session_scope
from vidlora.models import BatchItem, ResumableUpload, Video

TUS = {"Tus-Resumable": "1.0.0"}
MiB = 1024 * 1024


def footage(size: int, seed: bytes = b"") -> bytes:
    """Cheap content that is no other known format (an MP4-like head, then noise)."""
    return b"\x00\x00\x00\x18ftypmp42" + hashlib.sha256(seed).digest() + os.urandom(size - 44)


def meta(**values: str) -> str:
    return ",".join(f"{k} {base64.b64encode(v.encode()).decode()}" for k, v in values.items())


@pytest.fixture(scope="module")
def account(database):
    from web.auth.tokens import create_token
    from web.auth.users import create_user

    with session_scope() as session:
        user = create_user(session, "field-team", "correct horse battery")
        other = create_user(session, "other-team", "correct horse battery")
        token = create_token(session, user, "field laptop", "review").token
        reader = create_token(session, user, "dashboard", "read").token
        stranger = create_token(session, other, "theirs", "review").token
    return {"token": token, "reader": reader, "stranger": stranger}


@pytest.fixture(scope="module")
def server(database, broker, artifacts_dir):
    web = WebServer(artifacts_dir / "resumable-web.log")
    yield web
    web.stop()


def auth(token: str) -> dict[str, str]:
    return {**TUS, "Authorization": f"Bearer {token}"}


def create(server, token: str, length: int, filename: str = "trench.mp4") -> str:
    r = requests.post(f"{server.url}/api/v1/uploads", headers={
        **auth(token), "Upload-Length": str(length), "Upload-Metadata": meta(filename=filename)}, timeout=30)
    assert r.status_code == 201, r.text
    assert r.headers["Tus-Resumable"] == "1.0.0"
    return server.url + r.headers["Location"]


def patch(url: str, token: str, offset: int, body: bytes, **headers: str) -> requests.Response:
    return requests.patch(url, data=body, timeout=60, headers={
        **auth(token), "Upload-Offset": str(offset), "Content-Type": "application/offset+octet-stream", **headers})


def offset_of(url: str, token: str) -> int:
    r = requests.head(url, headers=auth(token), timeout=30)
    assert r.status_code == 200, r.status_code
    return int(r.headers["Upload-Offset"])


def cut_mid_patch(url: str, token: str, offset: int, total: int, sent: bytes) -> None:
    """A PATCH announcing ``total`` bytes whose connection drops after ``sent``."""
    path = url.split("//", 1)[1].split("/", 1)[1]
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall((f"PATCH /{path} HTTP/1.1\r\nHost: {host}\r\nTus-Resumable: 1.0.0\r\n"
                      f"Authorization: Bearer {token}\r\nUpload-Offset: {offset}\r\n"
                      f"Content-Type: application/offset+octet-stream\r\nContent-Length: {total}\r\n\r\n").encode())
        sock.sendall(sent)
        time.sleep(1.0)  # the server has read what arrived; then the link dies (RST, no FIN)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST


def start_batch(server, token: str, keys: list[str]) -> requests.Response:
    return requests.post(f"{server.url}/api/v1/batches", headers={"Authorization": f"Bearer {token}"}, timeout=30,
                         data={"uploads": keys, "scenarios": ["artifact_identification"], "name": "field day"})


def stored_video(batch_id: int) -> Video | None:
    with session_scope() as session:
        return session.scalar(select(Video).join(BatchItem, BatchItem.video_id == Video.id)
                              .where(BatchItem.batch_id == batch_id))


def test_discovery_is_public(server):
    r = requests.options(f"{server.url}/api/v1/uploads", timeout=30)
    assert r.status_code == 204
    assert r.headers["Tus-Version"] == "1.0.0"
    assert set(r.headers["Tus-Extension"].split(",")) == {"creation", "termination", "checksum"}
    assert int(r.headers["Tus-Max-Size"]) > 2 * 1024**3
    assert set(r.headers["Tus-Checksum-Algorithm"].split(",")) == {"sha1", "sha256"}


def test_resumes_after_a_dropped_connection_and_is_ingested_whole(server, account, cpu_worker):
    token = account["token"]
    data = footage(6 * MiB, b"resume")
    url = create(server, token, len(data))
    cut_mid_patch(url, token, 0, len(data), data[:2 * MiB + 12345])
    # What reached the disk is kept: the server reports it once it has seen the cut.
    kept = wait_for(lambda: offset_of(url, token), timeout=30, what="bytes kept after the cut")
    assert 0 < kept <= 2 * MiB + 12345
    # A client resuming from a stale offset is told where the upload stands.
    stale = patch(url, token, 0, data[:100])
    assert stale.status_code == 409 and f"has {kept} bytes" in stale.json()["detail"]
    done = patch(url, token, kept, data[kept:], **{
        "Upload-Checksum": "sha256 " + base64.b64encode(hashlib.sha256(data[kept:]).digest()).decode()})
    assert done.status_code == 204, done.text
    assert int(done.headers["Upload-Offset"]) == len(data)

    key = url.rsplit("/", 1)[1]
    r = start_batch(server, token, [key])
    assert r.status_code == 201, r.text
    video = wait_for(lambda: stored_video(r.json()["batch_id"]), timeout=90, what="the upload ingested")
    assert video.sha256 == hashlib.sha256(data).hexdigest() and video.size_bytes == len(data)
    # Its place in the resumable area is empty now; used twice, it is refused in words.
    assert not list((get_settings().media_root / "resumable").glob(f"{key}*"))
    again = start_batch(server, token, [key])
    assert again.status_code == 400 and "already sent to batch" in again.json()["detail"]


def test_hostile_requests_are_refused_in_words(server, account):
    token = account["token"]
    data = footage(MiB, b"hostile")
    url = create(server, token, len(data))

    no_version = requests.patch(url, data=b"x", headers={"Authorization": f"Bearer {token}", "Upload-Offset": "0",
                                                          "Content-Type": "application/offset+octet-stream"}, timeout=30)
    assert no_version.status_code == 412 and no_version.headers["Tus-Version"] == "1.0.0"
    forged = patch(url, token, 4096, data[4096:8192])
    assert forged.status_code == 409 and "has 0 bytes" in forged.json()["detail"]
    past_end = patch(url, token, 0, data + b"more")
    assert past_end.status_code == 413 and "past the end" in past_end.json()["detail"]
    wrong_sum = patch(url, token, 0, data[:4096], **{"Upload-Checksum": "sha1 " + base64.b64encode(b"\0" * 20).decode()})
    assert wrong_sum.status_code == 460 and "does not match" in wrong_sum.json()["detail"]
    not_octets = requests.patch(url, data=b"x", headers={**auth(token), "Upload-Offset": "0"}, timeout=30)
    assert not_octets.status_code == 415
    assert offset_of(url, token) == 0  # nothing refused was kept

    # Someone else's upload does not exist for them; a read-only token cannot write.
    assert requests.head(url, headers=auth(account["stranger"]), timeout=30).status_code == 404
    assert patch(url, account["reader"], 0, data).status_code == 403
    assert requests.head(url, headers=TUS, timeout=30).status_code == 401

    def refused(length: str, filename: str) -> requests.Response:
        return requests.post(f"{server.url}/api/v1/uploads", timeout=30, headers={
            **auth(token), "Upload-Length": length, "Upload-Metadata": meta(filename=filename)})

    path_name = refused("100", "../../etc/cron.d/x.mp4")
    assert path_name.status_code == 400 and "is a path" in path_name.json()["detail"]
    assert refused("100", "notes.pdf").status_code == 415
    lying = refused("-5", "a.mp4")
    assert lying.status_code == 400 and "whole number" in lying.json()["detail"]
    assert refused(str(10**20), "a.mp4").status_code == 400

    # The type check reads the first chunk before any byte is kept.
    pdf_url = create(server, token, MiB, "day1.mp4")
    pdf = patch(pdf_url, token, 0, b"%PDF-1.7\n" + b"0" * (MiB - 9))
    assert pdf.status_code == 415 and "PDF" in pdf.json()["detail"]
    assert offset_of(pdf_url, token) == 0

    # An incomplete upload cannot start a batch; termination removes it and its bytes.
    partial = patch(url, token, 0, data[:1000])
    assert partial.status_code == 204
    unfinished = start_batch(server, token, [url.rsplit("/", 1)[1]])
    assert unfinished.status_code == 400 and "1000 of" in unfinished.json()["detail"]
    with session_scope() as session:
        part = get_settings().media_root / session.scalar(select(ResumableUpload.path).where(
            ResumableUpload.key == url.rsplit("/", 1)[1]))
    assert part.stat().st_size == 1000
    assert requests.delete(url, headers=auth(token), timeout=30).status_code == 204
    assert not part.exists()
    assert requests.head(url, headers=auth(token), timeout=30).status_code == 404


def test_limits_per_file_and_free_space(server, database, broker, artifacts_dir, account):
    # Made while the disk had room; its chunks come after the room is gone.
    earlier = create(server, account["token"], MiB)
    web = WebServer(artifacts_dir / "resumable-limits-web.log", {
        "VIDLORA_RESUMABLE_MAX_BYTES": str(8 * MiB), "VIDLORA_RESUMABLE_MIN_FREE_BYTES": str(10**16)})
    try:
        def ask(length: int) -> requests.Response:
            return requests.post(f"{web.url}/api/v1/uploads", timeout=30, headers={
                **auth(account["token"]), "Upload-Length": str(length), "Upload-Metadata": meta(filename="a.mp4")})

        big = ask(9 * MiB)
        assert big.status_code == 413 and "limit of 8.0 MiB per file" in big.json()["detail"]
        full = ask(MiB)
        assert full.status_code == 507 and "free" in full.json()["detail"]
        chunk = patch(web.url + earlier[len(server.url):], account["token"], 0, footage(MiB))
        assert chunk.status_code == 507 and "the upload keeps what it has" in chunk.json()["detail"]
        assert offset_of(earlier, account["token"]) == 0
    finally:
        web.stop()


def test_stalled_uploads_expire_with_their_bytes(server, account, monkeypatch):
    from tasks.reconcile import reconcile

    token = account["token"]
    url = create(server, token, MiB)
    assert patch(url, token, 0, footage(MiB)[:300_000]).status_code == 204
    fresh = create(server, token, MiB)
    key = url.rsplit("/", 1)[1]
    with session_scope() as session:
        part = get_settings().media_root / session.scalar(select(ResumableUpload.path).where(ResumableUpload.key == key))
        session.execute(update(ResumableUpload).where(ResumableUpload.key == key)
                        .values(updated_at=ResumableUpload.updated_at - _days(2)))
    assert part.stat().st_size == 300_000
    stray = part.parent / "never-committed.part"  # a creation whose transaction was lost
    stray.write_bytes(b"x")
    os.utime(stray, (time.time() - 3 * 86400,) * 2)
    monkeypatch.setenv("VIDLORA_RESUMABLE_EXPIRE_AFTER_S", str(24 * 3600))
    reset_settings()
    try:
        counts = reconcile.apply().get()
    finally:
        monkeypatch.undo()
        reset_settings()
    assert counts.get("expired_uploads") == 2
    assert not part.exists() and not stray.exists()
    assert requests.head(url, headers=auth(token), timeout=30).status_code == 404
    assert offset_of(fresh, token) == 0  # one touched within the time stays


def _days(n: int):
    from datetime import timedelta

    return timedelta(days=n)


def test_the_page_session_needs_its_csrf_token(server, account):
    """The upload page sends tus requests with its session cookie: a write without the page's
    CSRF token (as a hostile site's would be) is refused; with it, accepted."""
    from tests.support.web import _META_CSRF

    browser = requests.Session()
    token = _META_CSRF.search(browser.get(f"{server.url}/auth/login", timeout=30).text).group(1)
    signed_in = browser.post(f"{server.url}/auth/login", timeout=30, allow_redirects=False, data={
        "username": "field-team", "password": "correct horse battery", "csrf_token": token})
    assert signed_in.status_code == 302
    page_token = _META_CSRF.search(browser.get(f"{server.url}/upload/", timeout=30).text).group(1)
    ask = {**TUS, "Upload-Length": "100", "Upload-Metadata": meta(filename="a.mp4")}
    assert browser.post(f"{server.url}/api/v1/uploads", headers=ask, timeout=30).status_code == 403
    made = browser.post(f"{server.url}/api/v1/uploads", headers={**ask, "X-CSRFToken": page_token}, timeout=30)
    assert made.status_code == 201
    url = server.url + made.headers["Location"]
    chunk = {**TUS, "Upload-Offset": "0", "Content-Type": "application/offset+octet-stream"}
    assert browser.patch(url, data=footage(100), headers=chunk, timeout=30).status_code == 403
    done = browser.patch(url, data=footage(100), headers={**chunk, "X-CSRFToken": page_token}, timeout=30)
    assert done.status_code == 204 and done.headers["Upload-Offset"] == "100"


def test_a_batch_that_fails_midway_leaves_every_upload_whole_and_sendable(server, account, cpu_worker):
    """Two complete uploads, the second's bytes gone from the server's disk: the batch is refused
    in words, and the first, already moved into the batch's area when the second failed, is back
    where its record says, whole, so it can be sent again and is ingested (was: its file stayed
    in uploads/ with no record, its record naming a file that no longer existed)."""
    token = account["token"]
    first, second = footage(1 * MiB, b"first"), footage(1 * MiB, b"second")
    keys = []
    for data, name in ((first, "trench 1.mp4"), (second, "trench 2.mp4")):
        url = create(server, token, len(data), filename=name)
        assert patch(url, token, 0, data).status_code == 204
        keys.append(url.rsplit("/", 1)[1])
    with session_scope() as session:
        rows = {r.key: r.path for r in session.scalars(select(ResumableUpload).where(ResumableUpload.key.in_(keys)))}
    (get_settings().media_root / rows[keys[1]]).unlink()

    refused = start_batch(server, token, keys)
    assert refused.status_code == 400, refused.text
    assert "The bytes of trench 2.mp4 are no longer on the server" in refused.json()["detail"]
    assert (get_settings().media_root / rows[keys[0]]).read_bytes() == first

    r = start_batch(server, token, keys[:1])
    assert r.status_code == 201, r.text
    video = wait_for(lambda: stored_video(r.json()["batch_id"]), timeout=90, what="the first upload ingested")
    assert video.sha256 == hashlib.sha256(first).hexdigest()
