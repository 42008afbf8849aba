"""Digits are the ASCII digits (vidlora.digits): a superscript, circled or Arabic-Indic digit
where a version, an index or an id goes is refused in words (or ignored where a page number
goes), never a 500. ``"²".isdigit()`` is true and ``int("²")`` fails, which was the 500."""

from __future__ import annotations

import pytest

from tests.support.structured import seed_structured
from vidlora.db import session_scope
from vidlora.models import Result

ANSWER = {"sealed": True, "site": "B", "finds": [{"material": "ceramic", "period": "unknown", "confidence": 0.5}]}
ODD = ("²", "①", "٣", "v²")


@pytest.fixture()
def token(reviewer) -> dict[str, str]:
    from web.auth.tokens import create_token
    from web.auth.users import get_user

    with session_scope() as session:
        return {"Authorization": "Bearer " + create_token(session, get_user(session, reviewer), "digits", "review").token}


def _saved(rid: int):
    with session_scope() as session:
        result = session.get(Result, rid)
        return result.review_state, result.edited_parsed, result.review_version


def test_if_match_with_a_superscript_digit_is_a_400_on_review_fields_and_gold(client, token):
    rid = seed_structured([ANSWER]).result_ids[0]
    url = f"/api/v1/results/{rid}"
    for digit in ODD:
        tag = f'"v{digit}"' if digit != "v²" else '"v²"'
        sends = [
            client.post(f"{url}/review", headers={**token, "If-Match": tag}, json={"action": "approve"}),
            client.patch(f"{url}/fields", headers={**token, "If-Match": tag, "Content-Type": "application/merge-patch+json"},
                         data='{"site": "C"}'),
            client.post(f"{url}/gold", headers={**token, "If-Match": tag}, json={"gold": True}),
        ]
        for response in sends:
            assert response.status_code == 400, (digit, response.status_code, response.get_data(as_text=True)[:200])
            assert "If-Match" in response.json["detail"]
    assert _saved(rid) == ("unreviewed", None, 0)


def test_paging_arguments_with_odd_digits_are_refused_in_words(client, token):
    for digit in ODD:
        response = client.get(f"/api/v1/results?page={digit}", headers=token)
        assert response.status_code == 400 and "whole number" in response.json["detail"]


def test_the_review_form_with_a_superscript_version_or_index_is_not_a_500(logged_in_client):
    rid = seed_structured([ANSWER]).result_ids[0]
    client = logged_in_client
    for digit in ODD:
        stale = client.post(f"/review/results/{rid}", data={"csrf_token": client.csrf, "action": "approve",
                                                            "version": digit})
        assert stale.status_code < 500, (digit, stale.status_code)
        assert _saved(rid)[0] == "unreviewed"  # a version that is no number approves nothing
    for version, digit in enumerate(ODD):
        edit = client.post(f"/review/results/{rid}", data={
            "csrf_token": client.csrf, "action": "edit", "version": str(version), "f/sealed": "true",
            "f/finds/0/material": "jade", "f/finds/0/period": "han", "f/finds/0/confidence": "0.5",
            f"f/finds/{digit}/material": "bronze", f"f/finds/{digit}/period": "han", f"f/finds/{digit}/confidence": "1",
            "f/site": f"B{version}"})
        assert edit.status_code == 303, (digit, edit.status_code)
    state, edited, _ = _saved(rid)
    # The ASCII row was read; the odd-digit rows were no rows of the form.
    assert state == "edited" and edited["finds"] == [{"material": "jade", "period": "han", "confidence": 0.5}]


def test_an_integer_field_typed_in_other_digits_is_refused_in_words(logged_in_client):
    rid = seed_structured([{**ANSWER, "chamber_count": 2}]).result_ids[0]
    client = logged_in_client
    response = client.post(f"/review/results/{rid}", data={
        "csrf_token": client.csrf, "action": "edit", "version": "0", "f/sealed": "true", "f/site": "B",
        "f/chamber_count": "٣", "f/finds/0/material": "ceramic", "f/finds/0/period": "unknown",
        "f/finds/0/confidence": "0.5"})
    assert response.status_code == 400 and "0-9" in response.get_data(as_text=True)
    assert _saved(rid) == ("unreviewed", None, 0)


def test_pages_and_batch_lists_take_odd_digits_without_failing(logged_in_client):
    for url in ("/results/?page=²", "/results/?per_page=²", "/results/?batch=²", "/batches/?page=①",
                "/batches/progress.json?ids=²,①,1"):
        response = logged_in_client.get(url)
        assert response.status_code < 500, (url, response.status_code)
