"""web.review.leases through the pages, as reviewers meet them: opening an answer from the
queue holds it; a colleague opening it from the queue is handed the next free answer; a
verdict moves on past answers colleagues hold; a held answer opened on purpose shows who has
it and can still be reviewed; leaving, signing out or the lease running out frees it."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import update

from tests.support.structured import seed_structured
from tests.support.web import PASSWORD, csrf_token, login, review_version
from vidlora.db import session_scope
from vidlora.models import ReviewLease, utcnow

ANSWER = {"sealed": True, "site": "B", "finds": [{"material": "ceramic", "period": "unknown", "confidence": 0.5}]}


@pytest.fixture(scope="module")
def colleague(database) -> str:
    from web.auth.users import create_user

    with session_scope() as session:
        create_user(session, "lease-colleague", PASSWORD)
    return "lease-colleague"


def _signed_in(app, name: str):
    client = app.test_client()
    assert login(client, name).status_code == 302
    client.csrf = csrf_token(client)
    return client


@pytest.fixture()
def team(app, reviewer, colleague):
    return _signed_in(app, reviewer), _signed_in(app, colleague)


def _queue(scenario: str) -> str:
    return f"queue=1&scenario={scenario}&sort=oldest&review_state=unreviewed"


def _opened(client, rid: int, scenario: str):
    return client.get(f"/review/results/{rid}?{_queue(scenario)}")


def _lands_on(response) -> int:
    assert response.status_code == 303, response.status_code
    return int(re.search(r"/review/results/(\d+)", response.headers["Location"]).group(1))


def test_the_queue_hands_each_reviewer_a_different_answer(team):
    a, b = team
    seeded = seed_structured([ANSWER] * 4)
    r1, r2, r3, r4 = seeded.result_ids
    assert _opened(a, r1, seeded.scenario).status_code == 200  # A holds r1
    handed = _opened(b, r1, seeded.scenario)  # B clicked the same first row
    assert _lands_on(handed) == r2
    assert "reviewer is reviewing result" in b.get(handed.headers["Location"]).get_data(as_text=True)
    # A approves r1: the queue passes over r2 (B has it open) to r3.
    done = a.post(f"/review/results/{r1}?{_queue(seeded.scenario)}",
                  data={"csrf_token": a.csrf, "action": "approve", "version": "0"})
    assert _lands_on(done) == r3
    # B approves r2: r3 is A's now, so r4; nobody met a conflict.
    done = b.post(f"/review/results/{r2}?{_queue(seeded.scenario)}",
                  data={"csrf_token": b.csrf, "action": "approve", "version": "0"})
    assert _lands_on(done) == r4


def test_a_held_answer_opened_on_purpose_says_who_has_it_and_can_be_reviewed(team):
    a, b = team
    seeded = seed_structured([ANSWER] * 2)
    rid = seeded.result_ids[0]
    assert _opened(a, rid, seeded.scenario).status_code == 200
    page = b.get(f"/review/results/{rid}").get_data(as_text=True)
    assert 'data-testid="lease-holder"' in page and "reviewer has this answer open" in page
    assert "data-lease-url" not in page  # B's page does not hold it
    done = b.post(f"/review/results/{rid}", data={"csrf_token": b.csrf, "action": "reject",
                                                  "version": review_version(b, rid)})
    assert done.status_code == 303  # a courtesy, never a lock
    renew = a.post(f"/review/results/{rid}/lease", headers={"X-CSRFToken": a.csrf})
    assert renew.status_code == 200 and renew.json["held"] is True  # A's page still holds it


def test_leaving_the_page_running_out_or_signing_out_frees_the_answer(team):
    a, b = team
    seeded = seed_structured([ANSWER] * 3)
    r1, r2, r3 = seeded.result_ids
    assert _opened(a, r1, seeded.scenario).status_code == 200
    page = a.get(f"/review/results/{r1}?{_queue(seeded.scenario)}").get_data(as_text=True)
    assert f'data-release-url="/review/results/{r1}/lease/release"' in page
    assert a.post(f"/review/results/{r1}/lease/release", data={"csrf_token": a.csrf}).status_code == 204
    assert _opened(b, r1, seeded.scenario).status_code == 200  # left: free for B at once
    renew = a.post(f"/review/results/{r1}/lease", headers={"X-CSRFToken": a.csrf})
    assert renew.status_code == 409 and renew.json["holder"] == "lease-colleague"
    with session_scope() as session:  # B walked away: the lease runs out
        session.execute(update(ReviewLease).where(ReviewLease.result_id == r1).values(expires_at=utcnow()))
    assert _opened(a, r1, seeded.scenario).status_code == 200
    assert _lands_on(_opened(b, r1, seeded.scenario)) == r2
    assert b.post("/auth/logout", data={"csrf_token": b.csrf}).status_code == 302
    assert _opened(a, r2, seeded.scenario).status_code == 200  # signing out let go of r2


def test_an_answer_reviewed_while_the_queue_hands_it_over_is_passed_by(team):
    """On a busy server a colleague may approve an answer, and let go of it, between the
    moment a reviewer's request reads it and the moment it would be held for them: that
    reviewer is handed the next answer, not the old version (whose Approve would conflict)."""
    from sqlalchemy import event

    from vidlora.db import get_engine
    from vidlora.models import Result
    from web.review.actions import apply_review

    a, b = team
    seeded = seed_structured([ANSWER] * 3)
    r1, r2, _ = seeded.result_ids
    fired = []

    def colleague_approves_first(conn, cursor, statement, *args):
        if statement.lstrip().upper().startswith("INSERT INTO REVIEW_LEASE") and not fired:
            fired.append(statement)
            with session_scope() as session:  # the colleague's own transaction, committed now
                apply_review(session, session.get(Result, r1), "approve", None, version=0)

    event.listen(get_engine(), "before_cursor_execute", colleague_approves_first)
    try:
        handed = _opened(b, r1, seeded.scenario)
    finally:
        event.remove(get_engine(), "before_cursor_execute", colleague_approves_first)
    assert fired
    assert _lands_on(handed) == r2
    page = b.get(handed.headers["Location"]).get_data(as_text=True)
    assert f"Result {r1} was reviewed a moment ago" in page
    done = b.post(f"/review/results/{r2}?{_queue(seeded.scenario)}",
                  data={"csrf_token": b.csrf, "action": "approve", "version": review_version(b, r2)})
    assert done.status_code == 303  # no conflict
