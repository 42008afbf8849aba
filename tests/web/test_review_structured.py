"""web.review for a structured result: the answer shown as fields, edited through the form
generated from its scenario's schema, validated, compared field by field, and re-indexed so
queries see the edit."""

import html as entities
import re

import pytest

from vidlora.db import session_scope
from vidlora.models import Result
from vidlora.results.query import parse_filters, result_query

from tests.support.structured import seed_structured

ANSWER = {"site": "B", "sealed": False,
          "finds": [{"material": "bronze", "period": "han", "confidence": 0.9, "decoration": "<b>taotie</b>"},
                    {"material": "jade", "period": "tang", "confidence": 0.4}]}


@pytest.fixture()
def seeded(database):
    return seed_structured([ANSWER])


def _form(html: str) -> dict[str, str]:
    """The edit form as a browser would post it unchanged (selected options, filled inputs)."""
    data = dict(re.findall(r'<input type="hidden" name="(version)" value="(\d+)"', html))
    for name, value in re.findall(r'<input type="(?:text|number)" name="(f/[^"]+)" value="([^"]*)"', html):
        data[name] = entities.unescape(value).replace("\n", "")  # a one-line box drops line breaks
    for name, body in re.findall(r'<select name="(f/[^"]+)"[^>]*>(.*?)</select>', html, re.S):
        chosen = re.search(r'<option value="([^"]*)" selected>', body)
        data[name] = entities.unescape(chosen.group(1)) if chosen else ""
    return data


def _edit(client, rid: int, data: dict):
    return client.post(f"/review/results/{rid}", data={"csrf_token": client.csrf, "action": "edit", **data})


def test_the_review_page_shows_the_answer_as_fields_and_its_form(logged_in_client, seeded):
    html = logged_in_client.get(f"/review/results/{seeded.result_ids[0]}").get_data(as_text=True)
    assert 'data-testid="result-answer"' in html and 'data-testid="schema-form"' in html
    assert "&lt;b&gt;taotie&lt;/b&gt;" in html and "<b>taotie</b>" not in html  # model output is text
    form = _form(html)
    assert form["f/finds/0/material"] == "bronze" and form["f/finds/1/confidence"] == "0.4"
    assert form["f/finds/new/material"] == "" and form["f/site"] == "B" and form["f/sealed"] == "false"
    assert 'data-testid="edit-text"' not in html  # no free-text box for a structured answer


def test_an_edit_is_validated_stored_as_data_and_queryable(logged_in_client, seeded):
    rid = seeded.result_ids[0]
    form = _form(logged_in_client.get(f"/review/results/{rid}").get_data(as_text=True))
    form.update({"f/finds/0/material": "jade", "f/finds/1/__remove": "1",
                 "f/finds/new/material": "ceramic", "f/finds/new/period": "unknown", "f/finds/new/confidence": "0.3"})
    response = _edit(logged_in_client, rid, form)
    assert response.status_code == 303, response.get_data(as_text=True)
    with session_scope() as session:
        result = session.get(Result, rid)
        assert result.review_state == "edited" and result.parsed == ANSWER  # the model's answer is kept
        assert result.edited_parsed["finds"] == [
            {"material": "jade", "period": "han", "confidence": 0.9, "decoration": "<b>taotie</b>"},
            {"material": "ceramic", "period": "unknown", "confidence": 0.3}]
        for where, expected in (("material=jade", 1), ("material=bronze", 0), ("material=ceramic", 1)):
            stmt = result_query(session, parse_filters({"scenario": seeded.scenario, "where": [where]}))
            assert len(session.execute(stmt).all()) == expected, where
    html = logged_in_client.get(f"/review/results/{rid}").get_data(as_text=True)
    diff = html.split('data-testid="field-diff"')[1].split("</table>")[0]
    assert 'data-path="finds[0].material"' in diff and "<del>bronze</del>" in diff and "<ins>jade</ins>" in diff
    assert 'data-testid="history-field-diff"' in html


def test_an_edit_outside_the_schema_is_refused_with_the_field(logged_in_client, seeded):
    rid = seeded.result_ids[0]
    form = _form(logged_in_client.get(f"/review/results/{rid}").get_data(as_text=True))
    response = _edit(logged_in_client, rid, {**form, "f/finds/0/confidence": "5"})
    assert response.status_code == 400
    assert "finds.0.confidence: 5.0 is greater than the maximum of 1" in response.get_data(as_text=True)
    response = _edit(logged_in_client, rid, {**form, "f/finds/0/confidence": "high"})
    assert response.status_code == 400 and "must be a number; &#39;high&#39; is not" in response.get_data(as_text=True)
    assert _edit(logged_in_client, rid, form).status_code == 400  # nothing changed
    with session_scope() as session:
        assert session.get(Result, rid).edited_parsed is None


def test_the_results_list_shows_an_answer_in_one_line(logged_in_client, seeded):
    html = logged_in_client.get(f"/results/?scenario={seeded.scenario}").get_data(as_text=True)
    # issue 32: every value with its field's name, as the form names them
    assert ("site: B; sealed: no; finds: 1. material bronze, period han, confidence 0.9, decoration "
            "&lt;b&gt;taotie&lt;/b&gt; / 2. material jade, period tang, confidence 0.4" in html), html


def test_approve_keeps_a_correction_made_in_the_form(logged_in_client, seeded):
    rid = seeded.result_ids[0]
    form = _form(logged_in_client.get(f"/review/results/{rid}").get_data(as_text=True))
    response = logged_in_client.post(f"/review/results/{rid}", data={
        "csrf_token": logged_in_client.csrf, "action": "approve", **{**form, "f/sealed": "true"}})
    assert response.status_code == 303
    with session_scope() as session:
        result = session.get(Result, rid)
        assert result.review_state == "approved" and result.edited_parsed["sealed"] is True
        assert [r.action for r in result.reviews] == ["edit", "approve"]


def test_approving_an_untouched_form_changes_nothing_the_browser_cleaned(logged_in_client, database):
    # A one-line text box cannot hold the model's line break; approving must not "correct" it.
    rid = seed_structured([{**ANSWER, "site": "B\nnorth", "damage": ["water", "looting", "water"]}]).result_ids[0]
    form = _form(logged_in_client.get(f"/review/results/{rid}").get_data(as_text=True))
    assert form["f/site"] == "Bnorth"
    from werkzeug.datastructures import MultiDict

    response = logged_in_client.post(f"/review/results/{rid}", data=MultiDict([
        ("csrf_token", logged_in_client.csrf), ("action", "approve"), *form.items(),
        ("f/damage", "water"), ("f/damage", "looting")]))  # the checked boxes, once each
    assert response.status_code == 303
    with session_scope() as session:
        result = session.get(Result, rid)
        assert result.review_state == "approved" and result.edited_parsed is None
