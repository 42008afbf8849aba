"""The review queue in a real browser, by keyboard only: ten results of one list are walked
with j / k, approved with a and rejected with r, one opened for editing with e, until the
queue says nothing is left; the review page's frame strip seeks its player.

The results are seeded in the database (the pipeline that makes them is proven by
test_review_flow); the video and frames are real files in the media store. Screenshots go to
test-artifacts/browser/ (docs/screenshots/ holds copies for the docs).
"""

from __future__ import annotations

import re
import shutil
import uuid

import pytest
from PIL import Image

from tests.support.structured import seed_structured
from tests.support.web import BROWSER_PASSWORD as PASSWORD, BROWSER_REVIEWER as REVIEWER
from vidlora.samples import generate_samples

pytestmark = pytest.mark.browser
ANSWER = {"sealed": True, "finds": [{"material": "bronze", "period": "han", "confidence": 0.8}]}


@pytest.fixture()
def ten_results(database, tmp_path):
    """Ten unreviewed structured results; the first one's video and frames are real files."""
    from pathlib import Path

    from vidlora.config import get_settings
    from vidlora.db import session_scope
    from vidlora.models import Analysis

    seeded = seed_structured([ANSWER] * 10)
    media = Path(get_settings().media_root)
    [clip] = generate_samples(tmp_path, ["bronze_vessel"], tag=uuid.uuid4().hex[:8])
    with session_scope() as session:
        analysis = session.get(Analysis, seeded.analysis_ids[0])
        target = media / analysis.video.path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(clip, target)
        files = []
        for i, colour in enumerate(((170, 120, 60), (60, 120, 170))):
            rel = f"frames/{uuid.uuid4().hex}/{i:04d}.jpg"
            (media / rel).parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (96, 54), colour).save(media / rel, "JPEG")
            files.append(rel)
        analysis.frame_set.files = files
    return seeded


def test_ten_results_reviewed_by_keyboard(live_server, reviewer, browser, screenshots, ten_results):
    from vidlora.db import session_scope
    from vidlora.models import Result

    ids = ten_results.result_ids
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(30_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{live_server}/auth/login")
    page.fill("#username", REVIEWER)
    page.fill("#password", PASSWORD)
    page.click("[data-testid=login-submit]")
    page.wait_for_selector("[data-testid=nav-results]")

    # The list, oldest first, and the first result from its review link: place 1 of 10.
    page.goto(f"{live_server}/results/?scenario={ten_results.scenario}&sort=oldest")
    page.click(f"[data-testid=review-link-{ids[0]}]")
    page.wait_for_selector("[data-testid=review-queue]")
    assert page.inner_text("[data-testid=queue-position]").startswith("1 of 10")

    # The frames this result saw are beside its player; clicking one seeks to its moment.
    frames = page.locator("[data-testid=frame-strip] a.frame-link")
    assert frames.count() == 2 and page.locator("#player").count() == 1
    frames.nth(1).click()
    page.wait_for_function("Math.abs(document.getElementById('player').currentTime - 1.5) < 0.05")
    assert "/frames/" not in page.url  # seeking, not following the link
    page.screenshot(path=str(screenshots / "review-queue.png"))

    # j and k move without reviewing; the queue position follows.
    page.keyboard.press("j")
    page.wait_for_url(re.compile(rf".*/review/results/{ids[1]}\?.*"))
    page.keyboard.press("k")
    page.wait_for_url(re.compile(rf".*/review/results/{ids[0]}\?.*"))

    # Ten verdicts by keyboard, each moving on to the next unreviewed result.
    for index, rid in enumerate(ids):
        page.wait_for_selector(f"[data-testid=approve-{rid}]")
        assert page.inner_text("[data-testid=queue-position]").startswith(f"{index + 1} of 10")
        if index == 4:  # e puts the cursor in the correction form; keys then type, Escape leaves
            page.keyboard.press("e")
            assert page.evaluate("!!document.activeElement.closest('.schema-form')")
            page.keyboard.press("a")  # typed into the field, not an approval
            page.keyboard.press("Escape")
            assert f"/review/results/{rid}?" in page.url
        page.keyboard.press("a" if index % 2 == 0 else "r")
        if index + 1 < len(ids):
            page.wait_for_url(re.compile(rf".*/review/results/{ids[index + 1]}\?.*"))
    page.wait_for_url(re.compile(r".*/results/\?.*"))
    assert "Nothing left to review in this list." in page.inner_text("main")
    page.screenshot(path=str(screenshots / "review-queue-done.png"))

    with session_scope() as session:
        states = [session.get(Result, rid).review_state for rid in ids]
    assert states == ["approved", "rejected"] * 5, states
    assert errors == [], errors
    page.close()
