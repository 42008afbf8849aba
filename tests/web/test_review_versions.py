"""Two reviewers on one result (issue 32): every save, approve and reject names the review
version its page or script read; a stale one is refused with 409, nothing of it applied, and
the answer shows what the other reviewer did beside what this one tried, with a way to apply
it again. Pages: two signed-in clients. API: two tokens, ETag / If-Match, JSON merge patch."""

from __future__ import annotations

import html as entities
import re

import pytest

from tests.support.structured import seed_structured
from tests.support.web import PASSWORD, csrf_token, login
from vidlora.db import session_scope
from vidlora.models import Result

ANSWER = {"sealed": True, "site": "B",
          "finds": [{"material": "ceramic", "period": "unknown", "confidence": 0.5}]}


@pytest.fixture(scope="module")
def colleague(database) -> str:
    from web.auth.users import create_user

    with session_scope() as session:
        create_user(session, "colleague", PASSWORD)
    return "colleague"


@pytest.fixture()
def two(app, reviewer, colleague):
    """Reviewer A and reviewer B, each signed in in their own browser."""
    clients = []
    for name in (reviewer, colleague):
        client = app.test_client()
        assert login(client, name).status_code == 302
        client.csrf = csrf_token(client)
        clients.append(client)
    return clients


def _form(html: str) -> dict[str, str]:
    """The review form as the browser would post it unchanged (version, the version a conflict
    page's form re-applies from, text, schema fields)."""
    form = dict(re.findall(r'<input type="hidden" name="(version|reapplied_from)" value="(\d+)"', html))
    for name, value in re.findall(r'<input type="(?:text|number)" name="(f/[^"]+)" value="([^"]*)"', html):
        form[name] = entities.unescape(value)
    for name, body in re.findall(r'<select name="(f/[^"]+)"[^>]*>(.*?)</select>', html, re.S):
        chosen = re.search(r'<option value="([^"]*)" selected>', body)
        form[name] = entities.unescape(chosen.group(1)) if chosen else ""
    text = re.search(r'<textarea name="text"[^>]*>\n?(.*?)</textarea>', html, re.S)
    if text:
        form["text"] = entities.unescape(text.group(1))
    return form


def _open(client, rid: int) -> dict[str, str]:
    return _form(client.get(f"/review/results/{rid}").get_data(as_text=True))


def _post(client, rid: int, form: dict, **changes):
    return client.post(f"/review/results/{rid}", data={"csrf_token": client.csrf, **form, **changes})


def _state(rid: int):
    with session_scope() as session:
        result = session.get(Result, rid)
        return result.review_state, result.edited_parsed, result.edited_text, [
            (r.action, r.user.username if r.user else None) for r in result.reviews]


def test_a_save_from_an_older_page_does_not_undo_the_other_reviewers_field(two):
    a, b = two
    rid = seed_structured([ANSWER]).result_ids[0]
    page_a, page_b = _open(a, rid), _open(b, rid)
    assert _post(a, rid, page_a, action="edit", **{"f/finds/0/material": "bronze"}).status_code == 303
    stale = _post(b, rid, page_b, action="edit", **{"f/finds/0/period": "han"})
    html = stale.get_data(as_text=True)
    assert stale.status_code == 409 and "reviewer changed this result since you opened it" in html
    assert _state(rid)[1]["finds"][0] == {"material": "bronze", "period": "unknown", "confidence": 0.5}
    # Theirs beside mine, in the form's words; the form holds both changes and the new version.
    theirs = html.split('data-testid="conflict-theirs"')[1].split('data-testid="conflict-yours"')[0]
    assert "Find 1 · material" in theirs and "<del>ceramic</del>" in theirs and "<ins>bronze</ins>" in theirs
    yours = html.split('data-testid="conflict-yours"')[1].split("</section>")[0]
    assert "Find 1 · period" in yours and "<ins>han</ins>" in yours and "material" not in yours
    again = _form(html)
    assert again["version"] == "1" and again["f/finds/0/material"] == "bronze" and again["f/finds/0/period"] == "han"
    assert _post(b, rid, again, action="edit").status_code == 303
    state, answer, _, reviews = _state(rid)
    assert answer["finds"][0] == {"material": "bronze", "period": "han", "confidence": 0.5}
    assert reviews == [("edit", "reviewer"), ("edit", "colleague")]
    # The history says B's edit went over A's change on purpose; A's own did not.
    history = b.get(f"/review/results/{rid}").get_data(as_text=True).split('data-testid="history"')[1]
    assert history.count('data-testid="history-reapplied"') == 1 and "re-applied after a conflict" in history
    assert history.index("re-applied after a conflict") > history.index("colleague")


def test_a_stale_approve_neither_reverts_an_edit_nor_beats_a_reject(two):
    a, b = two
    rid = seed_structured([ANSWER]).result_ids[0]
    page_a, page_b = _open(a, rid), _open(b, rid)
    _post(a, rid, page_a, action="edit", **{"f/site": "C"})
    refused = _post(b, rid, page_b, action="approve")  # B typed nothing
    assert refused.status_code == 409
    state, answer, _, reviews = _state(rid)
    assert (state, answer["site"], reviews) == ("edited", "C", [("edit", "reviewer")])
    again = _form(refused.get_data(as_text=True))
    assert again["f/site"] == "C"  # the untouched old draft is not offered again
    assert "You had not changed the answer." in refused.get_data(as_text=True)
    assert _post(b, rid, again, action="approve").status_code == 303
    assert _state(rid)[0:2] == ("approved", {**ANSWER, "site": "C"}) and _state(rid)[3][-1] == ("approve", "colleague")
    # A reject and an approve from pages of the same moment: the second is refused, not last-wins.
    page_a, page_b = _open(a, rid), _open(b, rid)
    assert _post(a, rid, page_a, action="reject").status_code == 303
    assert _post(b, rid, page_b, action="approve").status_code == 409
    assert _state(rid)[0] == "rejected"


def test_a_stale_text_edit_keeps_both_texts_on_the_page(two, factory):
    a, b = two
    rid = factory.batch({"artifact_identification": "A fibula."}).result_ids["artifact_identification"]
    page_a, page_b = _open(a, rid), _open(b, rid)
    _post(a, rid, page_a, action="edit", text="A bronze fibula.")
    refused = _post(b, rid, page_b, action="edit", text="A fibula, Roman.", note="period from the catch plate")
    html = refused.get_data(as_text=True)
    assert refused.status_code == 409 and _state(rid)[2] == "A bronze fibula."
    theirs = html.split('data-testid="conflict-theirs"')[1].split('data-testid="conflict-yours"')[0]
    assert "<ins>bronze </ins>" in theirs or "<ins>bronze" in theirs
    again = _form(html)
    assert again["text"] == "A fibula, Roman." and "period from the catch plate" in html  # nothing typed is lost
    assert again["version"] == "1"


def test_a_page_without_its_version_is_refused(logged_in_client, factory):
    rid = factory.batch().result_ids["artifact_identification"]
    response = logged_in_client.post(f"/review/results/{rid}", data={"csrf_token": logged_in_client.csrf,
                                                                     "action": "approve"})
    assert response.status_code == 400 and _state(rid)[0] == "unreviewed"


@pytest.fixture()
def tokens(reviewer, colleague) -> list[dict[str, str]]:
    from web.auth.tokens import create_token
    from web.auth.users import get_user

    with session_scope() as session:
        return [{"Authorization": "Bearer " + create_token(session, get_user(session, name), "race", "review").token}
                for name in (reviewer, colleague)]


def test_the_api_refuses_a_stale_if_match_with_what_changed(client, tokens):
    a, b = tokens
    rid = seed_structured([ANSWER]).result_ids[0]
    url = f"/api/v1/results/{rid}"
    read_a, read_b = client.get(url, headers=a), client.get(url, headers=b)
    assert read_a.headers["ETag"] == read_b.headers["ETag"] == '"v0"'
    done = client.post(f"{url}/review", headers={**a, "If-Match": read_a.headers["ETag"]},
                       json={"action": "edit", "fields": {**ANSWER, "site": "C"}})
    assert done.status_code == 200 and done.headers["ETag"] == '"v1"'
    stale = client.post(f"{url}/review", headers={**b, "If-Match": read_b.headers["ETag"]}, json={"action": "reject"})
    assert stale.status_code == 409 and stale.headers["ETag"] == '"v1"' and stale.json["etag"] == '"v1"'
    [change] = stale.json["changes"]
    assert change["user"] == "reviewer" and change["fields_changed"] == [{"path": "site", "before": "B", "after": "C"}]
    assert stale.json["result"]["review_state"] == "edited" and 'If-Match: "v1"' in stale.json["detail"]
    assert client.get(url, headers=b).json["review_state"] == "edited"  # nothing of B's was applied
    assert client.post(f"{url}/review", headers=b, json={"action": "reject"}).status_code == 428
    again = client.post(f"{url}/review", headers={**b, "If-Match": stale.headers["ETag"]}, json={"action": "reject"})
    assert again.status_code == 200 and again.json["review_state"] == "rejected"
    # A note overwrites nothing: it needs no version.
    assert client.post(f"{url}/review", headers=a, json={"action": "note", "note": "seen"}).status_code == 200


def test_a_merge_patch_edits_one_field_and_keeps_the_rest(client, tokens):
    a, b = tokens
    rid = seed_structured([ANSWER]).result_ids[0]
    url = f"/api/v1/results/{rid}/fields"
    fields = client.get(url, headers=a)
    assert fields.json == ANSWER and fields.headers["ETag"] == '"v0"'
    patch = lambda headers, body, etag: client.patch(  # noqa: E731
        url, headers={**headers, "If-Match": etag, "Content-Type": "application/merge-patch+json"}, data=body)
    done = patch(a, '{"sealed": false, "site": null}', '"v0"')
    assert done.status_code == 200, done.json
    assert done.json["fields"] == {"sealed": False, "finds": ANSWER["finds"]}
    # B patches from the old read: refused, then applied on the new ETag without touching A's change.
    assert patch(b, '{"finds": [{"material": "jade", "period": "tang", "confidence": 0.9}]}', '"v0"').status_code == 409
    again = patch(b, '{"finds": [{"material": "jade", "period": "tang", "confidence": 0.9}]}', done.headers["ETag"])
    assert again.status_code == 200 and again.json["fields"]["sealed"] is False
    assert again.json["fields"]["finds"][0]["material"] == "jade"
    bad = patch(a, '{"sealed": "maybe"}', again.headers["ETag"])
    assert bad.status_code == 400 and "sealed" in bad.json["detail"]
    assert client.patch(url, headers={**a, "If-Match": again.headers["ETag"]}, json={"sealed": True}).status_code == 415
    assert patch(a, '{"sealed": true}', "").status_code == 428


TWO_FINDS = {**ANSWER, "finds": [{"material": "ceramic", "period": "unknown", "confidence": 0.5},
                                 {"material": "jade", "period": "tang", "confidence": 0.9}]}


def test_a_merge_never_brings_back_an_item_the_other_reviewer_removed(two):
    a, b = two
    rid = seed_structured([TWO_FINDS]).result_ids[0]
    page_a, page_b = _open(a, rid), _open(b, rid)
    assert _post(a, rid, page_a, action="edit", **{"f/finds/1/__remove": "1"}).status_code == 303
    stale = _post(b, rid, page_b, action="edit", **{"f/finds/0/material": "bronze"})
    html = stale.get_data(as_text=True)
    assert stale.status_code == 409
    yours = html.split('data-testid="conflict-yours"')[1].split("</section>")[0]
    assert "Find 1 · material" in yours and "Find 2" not in yours and "jade" not in yours  # not offered as B's
    again = _form(html)
    assert "f/finds/1/material" not in again and again["f/finds/0/material"] == "bronze"
    assert _post(b, rid, again, action="edit").status_code == 303  # pressing again, as the page says
    assert _state(rid)[1]["finds"] == [{"material": "bronze", "period": "unknown", "confidence": 0.5}]
    # B changed the item A removed: it stays removed, and the page says so.
    rid = seed_structured([TWO_FINDS]).result_ids[0]
    page_a, page_b = _open(a, rid), _open(b, rid)
    _post(a, rid, page_a, action="edit", **{"f/finds/1/__remove": "1"})
    stale = _post(b, rid, page_b, action="edit", **{"f/finds/1/period": "han"})
    html = stale.get_data(as_text=True)
    assert "Find 2: removed by the other reviewer while you changed it" in html
    assert "f/finds/1/material" not in _form(html)


def _api(client, headers, rid, if_match, body=None):
    return client.post(f"/api/v1/results/{rid}/review", headers={**headers, "If-Match": if_match},
                       json=body or {"action": "approve"})


def test_if_match_takes_weak_tags_and_lists_as_http_says(client, tokens):
    a, _ = tokens
    rid = seed_structured([ANSWER]).result_ids[0]
    assert _api(client, a, rid, 'W/"v0"').status_code == 200  # as a gzip proxy passes the ETag on
    assert _api(client, a, rid, '"v7", W/"v1"', {"action": "reject"}).status_code == 200  # any match suffices
    assert _api(client, a, rid, '"v0", "v1"', {"action": "approve"}).status_code == 409  # stale: none is v2
    future = _api(client, a, rid, '"v9"')
    assert future.status_code == 412 and "never had that version" in future.json["detail"]
    for malformed in ('""', '"x"', 'W/""', "garbage", "W/"):
        response = _api(client, a, rid, malformed)
        assert response.status_code in (400, 412), (malformed, response.status_code)
    patch = client.patch(f"/api/v1/results/{rid}/fields", data='{"sealed": false}',
                         headers={**a, "If-Match": '""', "Content-Type": "application/merge-patch+json"})
    assert patch.status_code == 400 and _state(rid)[0] == "rejected"


def test_a_note_keeps_the_version_so_pending_reviews_still_apply(client, tokens, two):
    a, b = tokens
    rid = seed_structured([ANSWER]).result_ids[0]
    etag = client.get(f"/api/v1/results/{rid}", headers=b).headers["ETag"]
    noted = client.post(f"/api/v1/results/{rid}/review", headers=a, json={"action": "note", "note": "check the rim"})
    assert noted.status_code == 200 and noted.headers["ETag"] == etag
    assert _api(client, b, rid, etag, {"action": "edit", "fields": {**ANSWER, "site": "C"}}).status_code == 200
    # The same on the pages: a colleague's note does not bounce this reviewer's approve.
    page_a, page_b = _open(two[0], rid), _open(two[1], rid)
    assert _post(two[0], rid, page_a, action="note", note="looked").status_code == 303
    assert _post(two[1], rid, page_b, action="approve").status_code == 303
    assert _state(rid)[0] == "approved"


def test_gold_honours_if_match(client, tokens, two):
    a, b = tokens
    rid = seed_structured([ANSWER]).result_ids[0]
    _api(client, a, rid, '"v0"')
    read = client.get(f"/api/v1/results/{rid}", headers=b).headers["ETag"]
    _api(client, a, rid, read, {"action": "edit", "fields": {**ANSWER, "site": "D"}})
    gold = lambda tag: client.post(f"/api/v1/results/{rid}/gold", headers={**b, "If-Match": tag},  # noqa: E731
                                   json={"gold": True})
    stale = gold(read)
    assert stale.status_code == 409 and stale.json["result"]["gold"] is False
    assert gold(stale.headers["ETag"]).status_code == 200
    # The page's gold form carries the version its page showed.
    page = _open(two[1], rid)
    _api(client, a, rid, '"v2"', {"action": "approve"})
    refused = two[1].post(f"/review/results/{rid}/gold", data={"csrf_token": two[1].csrf, "gold": "0", **page})
    assert refused.status_code == 409 and "so it was not marked" in refused.get_data(as_text=True)
