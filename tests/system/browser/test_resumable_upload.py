"""The upload page sends a file resumably (tus) in a real browser against `vidlora web`:
its connection is cut mid-file and it carries on; the page is reloaded mid-file and, the same
file chosen again, it resumes from the server's offset instead of starting over; the batch
then ingests exactly the file that was chosen."""

from __future__ import annotations

import hashlib
import os
import re

import pytest
from sqlalchemy import select

from tests.support.web import sign_in
from tests.support.web_server import WebServer
from tests.support.workers import wait_for
from vidlora.db import session_scope
from vidlora.models import BatchItem, ResumableUpload, Video

pytestmark = pytest.mark.browser
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def web(database, broker, artifacts_dir):
    server = WebServer(artifacts_dir / "resumable-browser-web.log",
                       {"VIDLORA_RESUMABLE_CHUNK_BYTES": str(MiB)})
    yield server
    server.stop()


def test_cut_and_reload_mid_upload_resume(web, reviewer, browser, cpu_worker, tmp_path, screenshots):
    clip = tmp_path / "trench 7.mp4"
    clip.write_bytes(b"\x00\x00\x00\x18ftypmp42" + os.urandom(12 * MiB))
    size = clip.stat().st_size

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(30_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    sign_in(page, web.url)

    seen = {"created": 0, "patches": [], "blocked": False}

    def uploads(route, request):
        if request.method == "POST":
            seen["created"] += 1
        if request.method == "PATCH":
            seen["patches"].append(int(request.headers["upload-offset"]))
            if len(seen["patches"]) == 3 or seen["blocked"]:
                return route.abort("connectionreset")  # the link drops mid-file
        return route.continue_()

    page.route(re.compile(r".*/api/v1/uploads.*"), uploads)

    def choose_and_send():
        page.goto(f"{web.url}/upload/")
        page.set_input_files("[data-testid=file-input]", str(clip))
        page.check("[data-testid=scenario-artifact_identification]")
        page.fill("[data-testid=batch-name]", "trench 7, resumed")
        page.click("[data-testid=upload-submit]")

    choose_and_send()

    def sent_at_least(n: int) -> bool:
        page.wait_for_timeout(50)
        return len(seen["patches"]) >= n

    # The third chunk's connection is cut; tus-js-client asks the server where it stands and
    # goes on: the chunk after the cut starts where the server's offset is, not at 0.
    wait_for(lambda: sent_at_least(6), timeout=60, interval=0, what="chunks after the cut")
    assert seen["patches"][:5] == [0, MiB, 2 * MiB, 2 * MiB, 3 * MiB]
    # Now the page goes away mid-file (the link stays down while it reloads).
    seen["blocked"] = True
    wait_for(lambda: sent_at_least(8), timeout=60, interval=0, what="a failing chunk")
    page.screenshot(path=str(screenshots / "upload-resumable-cut.png"))
    with session_scope() as session:
        kept = session.scalar(select(ResumableUpload.offset).where(ResumableUpload.filename == clip.name))
    assert MiB * 4 <= kept < size
    seen["blocked"] = False
    page.reload()
    resumed_from = len(seen["patches"])
    choose_and_send()
    page.wait_for_url(re.compile(r".*/batches/\d+"), timeout=60_000)

    assert seen["created"] == 1  # one upload for the file, across the cut and the reload
    assert seen["patches"][resumed_from] == kept  # resumed from the server's offset
    assert not errors, errors
    batch_id = int(re.search(r"/batches/(\d+)", page.url).group(1))

    def stored():
        with session_scope() as session:
            return session.scalar(select(Video).join(BatchItem, BatchItem.video_id == Video.id)
                                  .where(BatchItem.batch_id == batch_id))

    video = wait_for(stored, timeout=120, what="the uploaded file ingested")
    assert video.sha256 == hashlib.sha256(clip.read_bytes()).hexdigest()
    context.close()
