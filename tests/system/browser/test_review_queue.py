"""The review queue in a real browser, by keyboard only: ten results of one list are walked
with j / k, approved with a, rejected with r, one corrected with e ... s (its change shown
field by field), until the queue says nothing is left; the export carries the verdicts; the
review page's frame strip seeks its player; a copied session cookie dies at sign-out.

The results are seeded in the database (the pipeline that makes them is proven by
test_review_flow); the video and frames are real files in the media store. Screenshots go to
test-artifacts/browser/ (docs/screenshots/ holds copies for the docs).
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import uuid
from pathlib import Path

import pytest
from PIL import Image

from tests.support.structured import seed_structured
from tests.support.web import BROWSER_PASSWORD as PASSWORD, BROWSER_REVIEWER as REVIEWER, SPLIT_TOKENS, sign_in
from vidlora.samples import generate_samples

pytestmark = pytest.mark.browser
ANSWER = {"sealed": True, "finds": [{"material": "bronze", "period": "han", "confidence": 0.8}]}
# The model's confidence in each result's finds, as the worker stores it (issue 51).
FINDS_CONFIDENCE = (0.97, 0.8, 0.99, 0.3, 0.92, 0.75, 0.999, 0.1, 0.85, 0.45)


@pytest.fixture()
def ten_results(database, tmp_path):
    """Ten unreviewed structured results with real frame files; the first one's video is a real file."""
    from vidlora.config import get_settings
    from vidlora.db import session_scope
    from vidlora.models import Analysis

    seeded = seed_structured([ANSWER] * 10, confidences=[{"sealed": 0.9995, "finds": c} for c in FINDS_CONFIDENCE])
    media = Path(get_settings().media_root)
    [clip] = generate_samples(tmp_path, ["bronze_vessel"], tag=uuid.uuid4().hex[:8])
    with session_scope() as session:
        analysis = session.get(Analysis, seeded.analysis_ids[0])
        target = media / analysis.video.path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(clip, target)
        for n, analysis_id in enumerate(seeded.analysis_ids):
            files = []
            for i in range(2):
                rel = f"frames/{uuid.uuid4().hex}/{i:04d}.jpg"
                (media / rel).parent.mkdir(parents=True, exist_ok=True)
                Image.new("RGB", (96, 54), (40 + 20 * n, 120 - 40 * i, 60 + 40 * i)).save(media / rel, "JPEG")
                files.append(rel)
            session.get(Analysis, analysis_id).frame_set.files = files
    return seeded


def test_ten_results_reviewed_by_keyboard(live_server, reviewer, browser, screenshots, ten_results):
    from vidlora.db import session_scope
    from vidlora.models import Result

    ids = ten_results.result_ids
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(30_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    sign_in(page, live_server)

    # The model's doubts first (issue 51): the list sorted least certain first from the form,
    # then narrowed by the confidence facet; the review page names the doubtful field.
    page.goto(f"{live_server}/results/?scenario={ten_results.scenario}")
    page.select_option("[data-testid=filter-sort]", "uncertain")
    page.click("[data-testid=filter-submit]")
    page.wait_for_url(re.compile(r".*sort=uncertain.*"))
    shown = page.eval_on_selector_all("[data-testid=result-table] tbody tr[data-result-id]",
                                      "rows => rows.map(r => Number(r.dataset.resultId))")
    assert shown == [ids[i] for i in sorted(range(10), key=lambda i: FINDS_CONFIDENCE[i])]
    assert page.inner_text(f"[data-testid=confidence-{ids[7]}]") == "10 %"
    page.screenshot(path=str(screenshots / "results-uncertain.png"), full_page=True)
    page.click("[data-testid=facet-confidence-low]")
    page.wait_for_url(re.compile(r".*confidence=low.*"))
    assert page.locator("[data-testid=result-table] tbody tr[data-result-id]").count() == 3
    page.click(f"[data-testid=review-link-{ids[7]}]")
    assert page.inner_text("[data-testid=field-confidence-finds] .confidence") == "10 %"
    assert page.locator("[data-testid=confidences] li").first.get_attribute("data-testid") == "field-confidence-finds"

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
        if index == 4:
            # e puts the cursor in the correction form (its first field, the site); keys then
            # type, Escape leaves the field, s saves the edit and the queue moves on.
            page.keyboard.press("e")
            assert page.evaluate("document.activeElement.name") == "f/site"
            page.keyboard.type("Trench 4 north")  # "a" and "r" in here are letters, not verdicts
            page.keyboard.press("Escape")
            assert f"/review/results/{rid}?" in page.url
            page.keyboard.press("s")
        else:
            page.keyboard.press("a" if index % 2 == 0 else "r")
        if index + 1 < len(ids):
            page.wait_for_url(re.compile(rf".*/review/results/{ids[index + 1]}\?.*"))
    page.wait_for_url(re.compile(r".*/results/\?.*"))
    assert "Nothing left to review in this list." in page.inner_text("main")
    page.screenshot(path=str(screenshots / "review-queue-done.png"))

    with session_scope() as session:
        states = [session.get(Result, rid).review_state for rid in ids]
        edited = session.get(Result, ids[4]).edited_parsed
    expected = ["approved", "rejected"] * 5
    expected[4] = "edited"
    assert states == expected, states
    assert edited == {**ANSWER, "site": "Trench 4 north"}

    # The edit's page shows the change field by field.
    page.goto(f"{live_server}/review/results/{ids[4]}")
    diff = page.locator("[data-testid=field-diff] tbody tr[data-path=site]")
    assert diff.count() == 1 and "Trench 4 north" in diff.inner_text()
    # The whole page, the diff and the history with it: in a window as tall as the page (a
    # full-page capture would draw the sticky action bar where the 900 px window ended).
    page.set_viewport_size({"width": 1280, "height": page.evaluate("document.documentElement.scrollHeight")})
    page.screenshot(path=str(screenshots / "review-edited.png"))
    page.set_viewport_size({"width": 1280, "height": 900})

    # The export carries each verdict, who gave it, and the final answer.
    with page.expect_download() as info:
        page.goto(f"{live_server}/results/?scenario={ten_results.scenario}&sort=oldest")
        page.click("[data-testid=export-csv]")
    rows = list(csv.DictReader(io.StringIO(Path(info.value.path()).read_text(encoding="utf-8-sig"))))
    by_id = {int(r["result_id"]): r for r in rows}
    assert [by_id[rid]["review_state"] for rid in ids] == expected
    assert {by_id[rid]["reviewed_by"] for rid in ids} == {REVIEWER}
    assert by_id[ids[4]]["field.site"] == "Trench 4 north" and json.loads(by_id[ids[4]]["field.finds"]) == ANSWER["finds"]
    assert by_id[ids[4]]["health_verdict"] == "healthy" and by_id[ids[4]]["batch_id"] == str(ten_results.batch_id)

    page.goto(f"{live_server}/accounts/tokens")
    page.fill("[data-testid=token-name]", "nightly export")
    page.click("[data-testid=token-create]")
    assert page.inner_text("[data-testid=token-value]").startswith("vl_")
    page.screenshot(path=str(screenshots / "api-tokens.png"))

    # A session cookie copied to another browser works until its owner signs out, then never.
    stolen = browser.new_context()
    stolen.add_cookies(page.context.cookies())
    thief = stolen.new_page()
    thief.goto(f"{live_server}/results/")
    assert "/auth/login" not in thief.url
    page.goto(f"{live_server}/results/")
    page.click("form.signout button")
    page.wait_for_url(re.compile(r".*/auth/login.*"))
    thief.goto(f"{live_server}/results/")
    assert "/auth/login" in thief.url
    stolen.close()

    assert errors == [], errors
    page.close()


def test_two_reviewers_racing_lose_nothing(live_server, reviewer, browser, screenshots, database):
    """Issue 32: two reviewers in two browsers on one result. B saves from a page opened before
    A's save: refused (409) with A's change beside B's, B's work kept in the form and applied on
    a second press, both changes in the answer. Then both press a verdict at the same moment:
    exactly one wins, the other is told, nothing is silently overwritten."""
    from vidlora.db import session_scope
    from vidlora.models import Result
    from web.auth.users import create_user

    rid = seed_structured([ANSWER]).result_ids[0]
    second = f"second-{uuid.uuid4().hex[:6]}"
    with session_scope() as session:
        create_user(session, second, PASSWORD)
    pages = []
    for name in (REVIEWER, second):
        context = browser.new_context(viewport={"width": 1280, "height": 1000})
        page = context.new_page()
        page.set_default_timeout(30_000)
        sign_in(page, live_server, name)
        page.goto(f"{live_server}/review/results/{rid}")
        pages.append(page)
    a, b = pages

    # Save edit sits in one bar with Approve and Reject, in view under the form; numbers are
    # wide enough to read.
    approve, save = (a.locator(f"[data-testid={k}-{rid}]").bounding_box() for k in ("approve", "edit"))
    assert abs(approve["y"] - save["y"]) < 4 and save["y"] + save["height"] <= 1000
    assert a.locator("[data-testid='field-f/finds/0/confidence']").bounding_box()["width"] >= 120
    a.select_option("[data-testid='field-f/finds/0/material']", "jade")
    a.click(f"[data-testid=edit-{rid}]")
    a.wait_for_selector(".flash")
    b.select_option("[data-testid='field-f/finds/0/period']", "tang")  # on the page from before A's save
    b.click(f"[data-testid=edit-{rid}]")
    conflict = b.wait_for_selector("[data-testid=conflict]")
    assert REVIEWER in b.inner_text("[data-testid=review-error]")
    theirs, yours = b.inner_text("[data-testid=conflict-theirs]"), b.inner_text("[data-testid=conflict-yours]")
    assert "Find 1 · material" in theirs and "jade" in theirs and "Find 1 · period" in yours and "tang" in yours
    assert b.input_value("[data-testid='field-f/finds/0/material']") == "jade"  # A's change, in B's form
    assert b.input_value("[data-testid='field-f/finds/0/period']") == "tang"  # B's, kept
    conflict.scroll_into_view_if_needed()
    b.screenshot(path=str(screenshots / "review-conflict.png"))
    assert b.evaluate(SPLIT_TOKENS, "[data-testid=conflict]") == []  # "bronze", "Before" whole in the narrow conflict tables
    with session_scope() as session:
        assert session.get(Result, rid).edited_parsed["finds"][0]["period"] == "han"  # nothing of B's yet
    b.click(f"[data-testid=edit-{rid}]")
    b.wait_for_selector(".flash")
    assert b.locator("[data-testid=history] [data-testid=history-reapplied]").count() == 1
    with session_scope() as session:
        result = session.get(Result, rid)
        assert result.edited_parsed["finds"][0] == {**ANSWER["finds"][0], "material": "jade", "period": "tang"}

    # Both open the result as it is now, then press their verdicts at once.
    for page in pages:
        page.goto(f"{live_server}/review/results/{rid}")
    a.click(f"[data-testid=reject-{rid}]", no_wait_after=True)
    b.click(f"[data-testid=approve-{rid}]", no_wait_after=True)
    for page in pages:
        page.wait_for_selector("[data-testid=conflict], .flash")
    refused = [page for page in pages if page.locator("[data-testid=conflict]").count()]
    assert len(refused) == 1
    with session_scope() as session:
        result = session.get(Result, rid)
        verdicts = [r.action for r in result.reviews if r.action in ("approve", "reject")]
        assert len(verdicts) == 1 and result.review_state == {"approve": "approved", "reject": "rejected"}[verdicts[0]]
    for page in pages:
        page.context.close()


def test_a_long_hostile_name_wraps_and_shows_what_it_is(live_server, reviewer, browser, screenshots, database):
    """Issue 32: a 300-character file name made pages 3,800+ px wide; report\\u202Efdp.mp4 read
    "reportpdf.mp4". On the pages the server draws and on the batch page its script redraws."""
    from vidlora.db import session_scope
    from vidlora.models import Analysis, BatchItem

    seeded = seed_structured([ANSWER])
    name = "report\u202efdp-" + "x" * 300 + ".mp4"
    with session_scope() as session:
        video = session.get(Analysis, seeded.analysis_ids[0]).video
        video.original_name, video_id = name, video.id
        session.query(BatchItem).filter(BatchItem.video_id == video_id).update({"name": name})
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(30_000)
    sign_in(page, live_server)
    for path in (f"/videos/{video_id}", f"/results/?batch={seeded.batch_id}", f"/batches/{seeded.batch_id}"):
        page.goto(live_server + path)
        page.wait_for_load_state("networkidle")
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280, path
        text = page.inner_text("main")
        assert "report[U+202E]fdp-" in text and "\u202e" not in text, path
    page.goto(f"{live_server}/videos/{video_id}")
    page.screenshot(path=str(screenshots / "long-hostile-name.png"))
    page.close()


def test_the_review_page_shows_which_find_the_model_doubted(live_server, reviewer, browser, screenshots, database):
    """Issue 58: a list's one figure said the list was doubtful, not which item. The worker's
    measured figures for each find, in the answer's order under the list, the doubtful one
    marked in words beside its red figure."""
    from tests.support.worker_confidence import store_measured

    answer = {"sealed": True, "finds": [{"material": "bronze", "period": "han", "confidence": 0.9},
                                        {"material": "jade", "period": "tang", "confidence": 0.9},
                                        {"material": "ceramic", "period": "han", "confidence": 0.9}]}
    seeded = seed_structured([None])
    rid = store_measured(seeded.analysis_ids[0], answer, "jade")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(30_000)
    sign_in(page, live_server)
    page.goto(f"{live_server}/review/results/{rid}")
    doubted = page.locator("[data-testid='field-confidence-finds/1']")
    assert doubted.is_visible() and doubted.get_attribute("class") == "doubtful"
    assert page.locator("[data-testid='check-finds/1']").is_visible()
    assert page.inner_text("[data-testid='field-confidence-finds/1/material'] .confidence") == "30 %"
    assert page.inner_text("[data-testid='field-confidence-finds/0'] .confidence") == "99 %"
    assert page.locator("[data-testid=confidences] .check").count() == 2  # the find, and its material
    page.locator("[data-testid=confidences]").screenshot(path=str(screenshots / "review-item-certainty.png"))
    page.close()
