"""No input makes the API fail (web.json_input): JSON nested deeper than any answer, and NaN or
Infinity where a number goes, are a 400 that names the problem, on every endpoint that reads a
JSON body; nothing is saved."""

from __future__ import annotations

import pytest

from tests.support.structured import seed_structured
from vidlora.db import session_scope
from vidlora.models import Result

ANSWER = {"sealed": True, "site": "B", "finds": [{"material": "ceramic", "period": "unknown", "confidence": 0.5}]}
DEEP = "[" * 990 + "]" * 990


@pytest.fixture()
def token(reviewer) -> dict[str, str]:
    from web.auth.tokens import create_token
    from web.auth.users import get_user

    with session_scope() as session:
        return {"Authorization": "Bearer " + create_token(session, get_user(session, reviewer), "in", "review").token}


def _saved(rid: int):
    with session_scope() as session:
        result = session.get(Result, rid)
        return result.review_state, result.edited_parsed


def test_deeply_nested_json_is_a_400_on_every_json_endpoint(client, token):
    rid = seed_structured([ANSWER]).result_ids[0]
    deep_fields = '{"action": "edit", "fields": {"sealed": true, "finds": ' + DEEP + "}}"
    sends = [
        ("patch", "fields", DEEP, "application/merge-patch+json"),
        ("patch", "fields", '{"finds": ' + DEEP + "}", "application/merge-patch+json"),
        ("post", "review", deep_fields, "application/json"),
        ("post", "review", DEEP, "application/json"),
        ("post", "gold", '{"gold": ' + DEEP + "}", "application/json"),
    ]
    for method, endpoint, body, mimetype in sends:
        response = getattr(client, method)(f"/api/v1/results/{rid}/{endpoint}", data=body,
                                           headers={**token, "If-Match": '"v0"', "Content-Type": mimetype})
        assert response.status_code == 400, (endpoint, body[:40], response.status_code)
    assert _saved(rid) == ("unreviewed", None)


def test_nan_and_infinity_are_not_numbers(client, token):
    rid = seed_structured([ANSWER]).result_ids[0]
    for constant in ("NaN", "Infinity", "-Infinity"):
        patch = client.patch(f"/api/v1/results/{rid}/fields",
                             data='{"finds": [{"material": "jade", "period": "han", "confidence": %s}]}' % constant,
                             headers={**token, "If-Match": '"v0"', "Content-Type": "application/merge-patch+json"})
        assert patch.status_code == 400 and constant in patch.json["detail"]
        review = client.post(f"/api/v1/results/{rid}/review", headers={**token, "If-Match": '"v0"'},
                             data='{"action": "edit", "fields": {"sealed": true, "finds": [{"material": "jade", '
                                  '"period": "han", "confidence": %s}]}}' % constant,
                             content_type="application/json")
        assert review.status_code == 400
        as_text = client.post(f"/api/v1/results/{rid}/review", headers={**token, "If-Match": '"v0"'},
                              json={"action": "edit", "text": '{"sealed": true, "finds": [{"material": "jade", '
                                                              '"period": "han", "confidence": %s}]}' % constant})
        assert as_text.status_code == 400 and "finite" in as_text.json["detail"]
    assert _saved(rid) == ("unreviewed", None)


def test_a_body_that_is_not_a_json_object_is_refused_saying_what_came(client, token):
    rid = seed_structured([ANSWER]).result_ids[0]
    sends = [("[1, 2]", "application/json", "a JSON array"), ('"approve"', "application/json", "a JSON string"),
             ("42", "application/json", "a number"), ("null", "application/json", "null"),
             ("{action: approve}", "application/json", "not JSON"), ("", "application/json", "empty"),
             ('{"gold": true}', "text/plain", "text/plain")]
    for endpoint in ("review", "gold"):
        for body, mimetype, says in sends:
            response = client.post(f"/api/v1/results/{rid}/{endpoint}", data=body,
                                   headers={**token, "If-Match": '"v0"', "Content-Type": mimetype})
            assert response.status_code == 400, (endpoint, body, response.status_code)
            detail = response.json["detail"]
            assert says in detail and "JSON object" in detail, (endpoint, body, detail)
    assert _saved(rid) == ("unreviewed", None)
