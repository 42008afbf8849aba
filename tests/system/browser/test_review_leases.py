"""Three reviewers in three browsers share one review queue (issue 58): all three click the
same first answer; the queue hands each a different one, and walking it by keyboard (a: approve)
no Approve press meets a conflict and no answer is approved twice. Leaving a page lets its
answer go (the page's beacon), so a colleague's queue may hand it out at once."""

from __future__ import annotations

import re
import uuid

import pytest

from tests.support.structured import seed_structured
from tests.support.web import BROWSER_PASSWORD as PASSWORD, BROWSER_REVIEWER as REVIEWER, sign_in

pytestmark = pytest.mark.browser
ANSWER = {"sealed": True, "finds": [{"material": "bronze", "period": "han", "confidence": 0.8}]}


def test_three_reviewers_walk_one_queue_without_a_conflict(live_server, reviewer, browser, screenshots, database):
    from sqlalchemy import select

    from vidlora.db import session_scope
    from vidlora.models import Result, Review, ReviewLease
    from web.auth.users import create_user

    seeded = seed_structured([ANSWER] * 9)
    names = [REVIEWER] + [f"team-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    with session_scope() as session:
        for name in names[1:]:
            create_user(session, name, PASSWORD)
    pages = []
    for name in names:
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        page.set_default_timeout(30_000)
        sign_in(page, live_server, name)
        page.goto(f"{live_server}/results/?scenario={seeded.scenario}&sort=oldest&review_state=unreviewed")
        pages.append(page)
    first = seeded.result_ids[0]
    for page in pages:  # everyone starts at the top of the list
        page.click(f"[data-testid=review-link-{first}]")
        page.wait_for_selector("[data-testid=review-form]")
    opened = [int(re.search(r"/review/results/(\d+)", p.url).group(1)) for p in pages]
    assert len(set(opened)) == 3 and opened[0] == first, opened
    assert "is reviewing result" in pages[1].inner_text(".flash")
    pages[1].screenshot(path=str(screenshots / "review-lease-handed-on.png"))

    presses = conflicts = 0
    while any("/review/results/" in p.url for p in pages):
        for page in pages:
            if "/review/results/" not in page.url:
                continue
            with page.expect_navigation():
                page.keyboard.press("a")
            presses += 1
            conflicts += page.locator("[data-testid=conflict]").count()
        assert presses < 30
    assert conflicts == 0 and presses == 9
    with session_scope() as session:
        approvals = session.scalars(select(Review.result_id).where(Review.result_id.in_(seeded.result_ids),
                                                                   Review.action == "approve")).all()
        assert sorted(approvals) == sorted(seeded.result_ids)  # each once
        assert {r.review_state for r in session.scalars(select(Result).where(Result.id.in_(seeded.result_ids)))} \
            == {"approved"}

    # Leaving a page from the queue lets its answer go at once (navigator.sendBeacon on pagehide).
    more = seed_structured([ANSWER] * 2)
    a, b = pages[0], pages[1]
    a.goto(f"{live_server}/review/results/{more.result_ids[0]}?queue=1&scenario={more.scenario}&sort=oldest")
    a.wait_for_selector("[data-testid=review-form][data-lease-url]")
    a.click("text=Back to the list")
    a.wait_for_selector("[data-testid=result-table]")
    b.wait_for_timeout(300)  # the beacon is sent as the page goes; give the server a moment
    with session_scope() as session:
        assert session.get(ReviewLease, more.result_ids[0]) is None
    b.goto(f"{live_server}/review/results/{more.result_ids[0]}?queue=1&scenario={more.scenario}&sort=oldest")
    assert f"/review/results/{more.result_ids[0]}?" in b.url and b.locator("[data-testid=lease-holder]").count() == 0
    for page in pages:
        page.context.close()
