"""The feedback loop's pages in a real browser: a reviewer marks a reviewed result as gold, the
gold set lists it, and the Scenarios page shows agreement per adapter version and a candidate
version beside the stored answers on the gold set. Screenshots go to test-artifacts/browser/
(docs/screenshots/ holds copies for docs/feedback-loop.md).

The results are seeded in the database with the product's review action; the pipeline, the
training and the gold run that make them are proven by
tests/system/pipelines/test_feedback_loop.py.
"""

from __future__ import annotations

import pytest

from tests.support.structured import seed_structured
from tests.support.web import SPLIT_TOKENS, sign_in

pytestmark = pytest.mark.browser

BRONZE = {"sealed": True, "finds": [{"material": "bronze", "period": "han", "confidence": 0.8}]}
JADE = {"sealed": True, "finds": [{"material": "jade", "period": "han", "confidence": 0.8}]}
TANG = {"sealed": False, "finds": [{"material": "bronze", "period": "tang", "confidence": 0.6}]}


@pytest.fixture()
def versions(database, tmp_path):
    """Twelve results of v1 (eight approved, three corrected, one rejected) and four of v2
    (all approved); a v3 candidate that answered the two gold videos."""
    from vidlora.db import session_scope
    from vidlora.feedback.gold import set_gold
    from vidlora.models import AdapterRelease, Result, Scenario, utcnow
    from web.review.actions import apply_review

    seeded = seed_structured([BRONZE] * 16)
    ids = seeded.result_ids
    with session_scope() as session:
        for i, rid in enumerate(ids):
            result = session.get(Result, rid)
            result.adapter_version = "3f9a61c2d0b47e15" if i < 12 else "8c2e07b5a91d43f6"
            if i in (8, 9):
                apply_review(session, result, "edit", None, fields=JADE, version=result.review_version)
            elif i == 10:
                apply_review(session, result, "edit", None, fields=TANG, version=result.review_version)
            elif i == 11:
                apply_review(session, result, "reject", None, version=result.review_version)
            elif i < 15:
                apply_review(session, result, "approve", None, version=result.review_version)
        set_gold(session.get(Result, ids[8]), True, None)
        scenario = session.query(Scenario).filter_by(name=seeded.scenario).one()
        scenario.title, scenario.adapter_version = "Finds catalogue", "8c2e07b5a91d43f6"
        session.add(AdapterRelease(scenario_id=scenario.id, version="d41e9b7702c5a8e3", path=str(tmp_path),
                                   status="candidate", note="trained on 11 reviewed answers", gold_run_at=utcnow(),
                                   gold_answers={str(ids[8]): {"text": "", "parsed": JADE},
                                                 str(ids[0]): {"text": "", "parsed": BRONZE}}))
    return seeded


def test_gold_and_agreement_pages(live_server, reviewer, browser, screenshots, versions):
    ids = versions.result_ids
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(30_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    sign_in(page, live_server)

    # An approved result: the reviewer makes it gold from its review page.
    page.goto(f"{live_server}/review/results/{ids[0]}")
    page.click(f"[data-testid=gold-add-{ids[0]}]")
    page.wait_for_selector(f"[data-testid=gold-remove-{ids[0]}]")
    assert "Held out of training" in page.inner_text("[data-testid=gold-state]")
    page.locator("[data-testid=gold-form]").screenshot(path=str(screenshots / "gold-mark.png"))

    page.goto(f"{live_server}/scenarios/{versions.scenario}/gold")
    rows = page.locator("[data-testid=gold-table] tbody tr")
    assert rows.count() == 2
    page.screenshot(path=str(screenshots / "gold-set.png"))

    page.goto(f"{live_server}/scenarios/")
    card = page.locator(f"[data-testid=scenario-card-{versions.scenario}]")
    card.scroll_into_view_if_needed()
    agreement = card.locator(f"[data-testid=agreement-{versions.scenario}]")
    assert agreement.locator("tbody tr").count() == 2
    v1 = agreement.locator("tr[data-version='3f9a61c2d0b47e15']")
    assert v1.get_attribute("data-reviewed") == "12" and "8 · 67 %" in v1.inner_text()
    candidate = card.locator(f"[data-testid=candidate-{versions.scenario}-d41e9b7702c5]")
    assert "2 / 2" in candidate.locator("tr[data-field='finds.material']").inner_text()
    card.screenshot(path=str(screenshots / "scenario-agreement.png"))
    # A card a reviewer can take in: prompts folded, the notation explained where it is used,
    # and no table splits a word or a number across lines ("Resu lts", "1002 0").
    assert card.locator(f"[data-testid=prompts-{versions.scenario}]").get_attribute("open") is None
    # The machine detail is folded (issue 58): no digest in view until "Technical details" opens.
    technical = card.locator(f"[data-testid=technical-{versions.scenario}]")
    version = card.locator(f"[data-testid=adapter-version-{versions.scenario}]")
    assert technical.get_attribute("open") is None and not version.is_visible()
    technical.locator("summary").click()
    assert version.is_visible() and version.inner_text() == "8c2e07b5a91d43f6"
    technical.locator("summary").click()  # closed again for the card's height and screenshot
    assert "5 · 71 % 36–92" in card.locator(f"[data-testid=agreement-legend-{versions.scenario}]").inner_text()
    assert card.bounding_box()["height"] < 1400
    assert page.evaluate(SPLIT_TOKENS, f"[data-testid=scenario-card-{versions.scenario}], [data-testid=latency]") == []
    assert not errors, errors

