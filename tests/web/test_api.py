from __future__ import annotations

import base64
import csv
import io
import json
import re

import pytest
from sqlalchemy import select

from tests.support.web import PASSWORD
from vidlora.db import session_scope
from vidlora.models import Batch, Result, Upload

XSS = "<script>alert(1)</script><b>x</b>"


def basic(username: str = "reviewer", password: str = PASSWORD) -> dict[str, str]:
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@pytest.fixture()
def auth(reviewer) -> dict[str, str]:
    return basic(reviewer)


def test_openapi_documents_every_api_route(app, client):
    doc = client.get("/api/v1/openapi.json").json  # public, no login
    assert doc["openapi"].startswith("3.")
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith("/api/v1/"):
            continue
        path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule[len("/api/v1"):])
        assert path in doc["paths"], rule.rule
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            assert method.lower() in doc["paths"][path], f"{method} {rule.rule}"
    documented = {(p, m) for p, ops in doc["paths"].items() for m in ops}
    routed = {(re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", r.rule[len("/api/v1"):]), m.lower())
              for r in app.url_map.iter_rules() if r.rule.startswith("/api/v1/")
              for m in r.methods - {"HEAD", "OPTIONS"}}
    assert documented == routed  # nothing documented that does not exist


@pytest.mark.parametrize("path", ["/api/v1/batches", "/api/v1/batches/1", "/api/v1/results", "/api/v1/results/1",
                                  "/api/v1/scenarios", "/api/v1/workers"])
def test_api_needs_credentials(client, database, path):
    response = client.get(path)
    assert response.status_code == 401 and response.json["status"] == 401
    assert "WWW-Authenticate" not in response.headers  # browsers must not cache Basic credentials


def test_wrong_credentials(client, reviewer):
    assert client.get("/api/v1/batches", headers=basic(reviewer, "wrong")).status_code == 401
    assert client.get("/api/v1/batches", headers=basic("ghost", "whatever")).status_code == 401
    assert client.get("/api/v1/batches", headers={"Authorization": "Bearer abc"}).status_code == 401


def test_basic_auth_ignores_session(logged_in_client):
    """With an Authorization header the cookie does not count, even if it is valid."""
    assert logged_in_client.get("/api/v1/batches").status_code == 200
    assert logged_in_client.get("/api/v1/batches", headers=basic("reviewer", "wrong")).status_code == 401


def test_batches(client, auth, factory):
    made = factory.batch({"artifact_identification": "x", "tomb_structure": None})
    listing = client.get("/api/v1/batches?per_page=500", headers=auth).json
    entry = next(b for b in listing["batches"] if b["id"] == made.batch_id)
    assert entry["progress"]["total"] == 2 and entry["url"] == f"/api/v1/batches/{made.batch_id}"
    detail = client.get(f"/api/v1/batches/{made.batch_id}", headers=auth).json
    assert detail["counts"] == {"done": 1, "running": 1} and detail["finished"] is False
    assert client.get("/api/v1/batches/99999999", headers=auth).status_code == 404


def test_enqueue(client, auth):
    data = {"scenarios": ["tomb_structure"], "name": "api batch",
            "files": [(io.BytesIO(b"v" * 64), "clip.webm"), (io.BytesIO(b"z" * 64), "more.zip")]}
    response = client.post("/api/v1/batches", data=data, headers=auth, content_type="multipart/form-data")
    assert response.status_code == 201, response.json
    batch_id = response.json["batch_id"]
    with session_scope() as session:
        batch = session.get(Batch, batch_id)
        assert batch.source == "api" and batch.created_by == "reviewer" and batch.name == "api batch"
        names = session.scalars(select(Upload.name).where(Upload.batch_id == batch_id).order_by(Upload.id)).all()
    assert names == ["clip.webm", "more.zip"]


@pytest.mark.parametrize("scenarios,filename,message", [
    (["dragons"], "a.mp4", "Unknown scenario"),
    (["tomb_structure"], "a.pdf", "Not a video or archive"),
    ([], "a.mp4", "Choose at least one scenario"),
])
def test_enqueue_refused(client, auth, scenarios, filename, message):
    data = {"scenarios": scenarios, "files": [(io.BytesIO(b"x"), filename)]}
    response = client.post("/api/v1/batches", data=data, headers=auth, content_type="multipart/form-data")
    assert response.status_code == 400 and message in response.json["detail"]


def test_enqueue_with_session_needs_csrf(logged_in_client):
    data = {"scenarios": ["tomb_structure"], "files": [(io.BytesIO(b"x"), "a.mp4")]}
    response = logged_in_client.post("/api/v1/batches", data=data, content_type="multipart/form-data")
    assert response.status_code == 403 and response.json["status"] == 403
    data = {"scenarios": ["tomb_structure"], "files": [(io.BytesIO(b"x"), "a.mp4")]}
    response = logged_in_client.post("/api/v1/batches", data=data, content_type="multipart/form-data",
                                     headers={"X-CSRFToken": logged_in_client.csrf})
    assert response.status_code == 201


def test_enqueue_too_large(client, auth, app, monkeypatch):
    monkeypatch.setitem(app.config, "MAX_CONTENT_LENGTH", 1024)
    data = {"scenarios": ["tomb_structure"], "files": [(io.BytesIO(b"x" * 4096), "a.mp4")]}
    response = client.post("/api/v1/batches", data=data, headers=auth, content_type="multipart/form-data")
    assert response.status_code == 413 and "limit" in response.json["detail"]


def test_results_with_filters(client, auth, factory):
    made = factory.batch({"artifact_identification": XSS, "tomb_structure": None})
    data = client.get(f"/api/v1/results?batch={made.batch_id}", headers=auth).json
    assert data["total"] == 2 and data["filters"] == {"batch": str(made.batch_id)}
    done = client.get(f"/api/v1/results?batch={made.batch_id}&status=done", headers=auth).json["results"]
    assert len(done) == 1 and done[0]["text"] == XSS  # JSON carries the raw text
    assert client.get("/api/v1/results?review_state=nope", headers=auth).status_code == 400
    paged = client.get(f"/api/v1/results?batch={made.batch_id}&per_page=1&page=2", headers=auth).json
    assert paged["page"] == 2 and len(paged["results"]) == 1


def test_results_search(client, auth, factory):
    factory.batch({"artifact_identification": "a carnelian intaglio ring"})
    rows = client.get("/api/v1/results?q=intaglio", headers=auth).json["results"]
    assert rows and all("intaglio" in r["final_text"] for r in rows)


def test_result_and_review(client, auth, factory):
    rid = factory.batch().result_ids["artifact_identification"]
    read = client.get(f"/api/v1/results/{rid}", headers=auth)
    assert read.json["reviews"] == [] and read.headers["ETag"] == '"v0"'
    response = client.post(f"/api/v1/results/{rid}/review", headers={**auth, "If-Match": read.headers["ETag"]},
                           json={"action": "edit", "text": "A bronze fibula.", "note": "shorter"})
    assert response.status_code == 200, response.json
    body = response.json
    assert body["review_state"] == "edited" and body["final_text"] == "A bronze fibula."
    assert body["text"] == "A bronze fibula with incised decoration."
    assert [(r["action"], r["user"], r["note"]) for r in body["reviews"]] == [("edit", "reviewer", "shorter")]
    assert response.headers["ETag"] == '"v1"' and body["review_version"] == 1
    assert client.post(f"/api/v1/results/{rid}/review", headers={**auth, "If-Match": '"v1"'},
                       json={"action": "approve"}).json["review_state"] == "approved"
    with session_scope() as session:
        assert session.get(Result, rid).edited_text == "A bronze fibula."


def test_review_errors(client, auth, factory):
    rid = factory.batch().result_ids["artifact_identification"]
    post = lambda **kw: client.post(f"/api/v1/results/{rid}/review", **{"headers": auth, **kw})  # noqa: E731
    assert post(json={"action": "destroy"}).status_code == 400
    assert post(json=["approve"]).status_code == 400
    assert post(json={"action": "edit", "text": 42}).status_code == 400
    assert post(json={"action": "edit"}).status_code == 428  # no If-Match: which version was read?
    assert post(json={"action": "edit"}, headers={**auth, "If-Match": '"v0"'}).status_code == 400
    from web.review.actions import MAX_NOTE_CHARS

    padded = " " * MAX_NOTE_CHARS + "ok"  # over the document's maxLength, short once trimmed
    for action in ("approve", "reject", "note"):
        refused = post(json={"action": action, "note": padded}, headers={**auth, "If-Match": '"v0"'})
        assert refused.status_code == 400 and "at most" in refused.json["detail"], action
    assert client.post("/api/v1/results/99999999/review", headers=auth, json={"action": "approve"}).status_code == 404
    assert client.get("/api/v1/results/99999999", headers=auth).status_code == 404


def test_review_with_session_needs_csrf_header(logged_in_client, factory):
    rid = factory.batch().result_ids["artifact_identification"]
    url = f"/api/v1/results/{rid}/review"
    assert logged_in_client.post(url, json={"action": "approve"}, headers={"If-Match": '"v0"'}).status_code == 403
    ok = logged_in_client.post(url, json={"action": "approve"},
                               headers={"X-CSRFToken": logged_in_client.csrf, "If-Match": '"v0"'})
    assert ok.status_code == 200 and ok.json["review_state"] == "approved"


def test_scenarios_and_workers(client, auth, make_worker):
    make_worker("gpu-api-test", ["tomb_structure"])
    scenarios = {s["name"]: s for s in client.get("/api/v1/scenarios", headers=auth).json["scenarios"]}
    assert "gpu-api-test" in scenarios["tomb_structure"]["workers"]
    assert scenarios["tomb_structure"]["prompt"]
    workers = {w["name"]: w for w in client.get("/api/v1/workers", headers=auth).json["workers"]}
    assert workers["gpu-api-test"]["health"] == "ok" and workers["gpu-api-test"]["device"] == "NVIDIA H200"


def test_unknown_api_url_is_json(client, auth):
    response = client.get("/api/v1/nothing", headers=auth)
    assert response.status_code == 404 and response.json["status"] == 404


# -- structured results (issue 15) ----------------------------------------------------------

def test_results_by_field_and_facets(client, auth, database):
    from tests.support.structured import seed_structured

    seeded = seed_structured([{"sealed": True, "finds": [{"material": "bronze", "period": "han", "confidence": 0.8}]},
                              {"sealed": False, "finds": [{"material": "jade", "period": "han", "confidence": 0.2}]}])
    base = f"/api/v1/results?scenario={seeded.scenario}"
    rows = client.get(base + "&where=material%3Dbronze", headers=auth).json["results"]
    assert [r["fields"]["finds"][0]["material"] for r in rows] == ["bronze"]
    assert rows[0]["frame_timestamps"] == [0.5, 1.5] and rows[0]["engine_versions"]["vllm"] == "0.32.0"
    assert client.get(base + "&where=material%3Dgold", headers=auth).status_code == 400
    facets = client.get(f"/api/v1/results/facets?scenario={seeded.scenario}&where=period%3Dhan", headers=auth).json
    by_field = {f["field"]: {v["value"]: v["count"] for v in f["values"]} for f in facets["facets"]}
    assert facets["total"] == 2 and by_field["finds.material"] == {"bronze": 1, "jade": 1, "ceramic": 0}
    assert client.get("/api/v1/results/facets", headers=auth).status_code == 400


def test_a_structured_edit_through_the_api_is_validated(client, auth, database):
    from tests.support.structured import seed_structured

    answer = {"sealed": True, "finds": [{"material": "bronze", "period": "han", "confidence": 0.8}]}
    rid = seed_structured([answer]).result_ids[0]
    def post(body):
        etag = client.get(f"/api/v1/results/{rid}", headers=auth).headers["ETag"]
        return client.post(f"/api/v1/results/{rid}/review", headers={**auth, "If-Match": etag}, json=body)

    bad = post({"action": "edit", "fields": {**answer, "sealed": "yes"}})
    assert bad.status_code == 400 and "sealed: 'yes' is not of type 'boolean'" in bad.json["detail"]
    good = post({"action": "edit", "fields": {**answer, "sealed": False}, "note": "the lid is off"})
    assert good.status_code == 200 and good.json["fields"]["sealed"] is False and good.json["model_fields"] == answer
    final = good.json["final_text"]  # the edit as compact JSON text (what search and CSV read)
    assert " " not in final and json.loads(final) == {**answer, "sealed": False}
    as_text = post({"action": "edit", "text": '{"sealed": true, "finds": []}'})
    assert as_text.status_code == 200 and as_text.json["fields"] == {"sealed": True, "finds": []}


def test_no_server_path_reaches_an_api_user(client, auth, factory, database):
    """Issue 19: the API names models and adapters, never where the server keeps them."""
    import os

    made = factory.batch()
    with session_scope() as session:  # what the GPU worker records: the path it loaded
        result = session.get(Result, made.result_ids["artifact_identification"])
        result.model = os.environ["VIDLORA_MODEL"]
        # issue 32: vLLM's served model name is the path too, and rode along in engine_versions
        result.analysis.engine = {"versions": {"vllm": "0.32"}, "served_model_name": os.environ["VIDLORA_MODEL"]}
    scenarios = client.get("/api/v1/scenarios", headers=auth).json["scenarios"]
    adapter_root = os.environ["VIDLORA_ADAPTER_ROOT"]
    assert all("adapter_path" not in s for s in scenarios)
    assert {s["name"]: s["adapter"] for s in scenarios}["artifact_identification"] == "artifact_identification"
    body = client.get(f"/api/v1/results?batch={made.batch_id}", headers=auth)
    assert adapter_root not in body.get_data(as_text=True) and os.environ["VIDLORA_MODEL"] not in body.get_data(as_text=True)
    assert body.json["results"][0]["model"] == "base"  # the model's name
    assert body.json["results"][0]["engine_versions"]["served_model_name"] == "base"
    export = client.get(f"/api/v1/results/export.jsonl?batch={made.batch_id}", headers=auth).get_data(as_text=True)
    assert os.environ["VIDLORA_MODEL"] not in export


# -- the API contract holds at its edges (issue 19) ------------------------------------------

@pytest.mark.parametrize("path", ["/api/v1/batches?page=576460752303423489", "/api/v1/results?page=0",
                                  "/api/v1/results?per_page=null", "/api/v1/results?per_page=501",
                                  "/api/v1/results?batch=-1", "/api/v1/results?batch=99999999999"])
def test_paging_and_filters_outside_the_document_are_400(client, auth, path):
    response = client.get(path, headers=auth)
    assert response.status_code == 400 and response.is_json, (path, response.status_code)


@pytest.mark.parametrize("path", ["/api/v1/results/84592958635041425647841837056", "/api/v1/batches/0",
                                  "/api/v1/results/2147483648"])
def test_ids_past_any_row_are_404_not_server_errors(client, auth, path):
    response = client.get(path, headers=auth)
    assert response.status_code == 404 and response.is_json


def test_timestamps_carry_their_zone(client, auth, factory):
    from datetime import datetime

    made = factory.batch()
    rid = made.result_ids["artifact_identification"]
    client.post(f"/api/v1/results/{rid}/review", headers={**auth, "If-Match": '"v0"'}, json={"action": "approve"})
    batch = client.get("/api/v1/batches", headers=auth).json["batches"][0]
    detail = client.get(f"/api/v1/results/{rid}", headers=auth).json
    for stamp in (batch["created_at"], detail["created_at"], detail["reviews"][0]["created_at"], detail["reviewed_at"]):
        assert datetime.fromisoformat(stamp).utcoffset() is not None, stamp


def test_a_wrong_method_says_which_are_allowed(client, auth):
    response = client.delete("/api/v1/batches", headers=auth)
    assert response.status_code == 405 and set(response.headers["Allow"].split(", ")) >= {"GET", "POST"}


def test_a_session_write_without_csrf_is_403(logged_in_client, factory):
    rid = factory.batch().result_ids["artifact_identification"]
    response = logged_in_client.post(f"/api/v1/results/{rid}/review", json={"action": "approve"})
    assert response.status_code == 403 and response.is_json


def test_a_script_exports_with_a_token_the_columns_the_page_gives(app, logged_in_client, reviewer, factory):
    """Issue 32: /results/export.csv redirected scripts to the sign-in page; the API's export
    is the page's, streamed, for a read-only token."""
    from web.auth.tokens import create_token
    from web.auth.users import get_user

    made = factory.batch({"artifact_identification": "x;=1+1;y"})
    with session_scope() as session:
        token = create_token(session, get_user(session, reviewer), "export script", "read").token
    bearer = {"Authorization": f"Bearer {token}"}
    client = app.test_client()  # a script: no session cookie
    for kind in ("csv", "jsonl", "parquet"):
        by_script = client.get(f"/api/v1/results/export.{kind}?batch={made.batch_id}", headers=bearer)
        streamed, script_body = by_script.is_streamed, by_script.get_data()  # read before the next request
        by_page = logged_in_client.get(f"/results/export.{kind}?batch={made.batch_id}")
        assert by_script.status_code == by_page.status_code == 200, (kind, by_script.status_code)
        assert by_script.mimetype == by_page.mimetype and "attachment" in by_script.headers["Content-Disposition"]
        if kind != "parquet":
            assert streamed and script_body == by_page.get_data()
    rows = list(csv.DictReader(io.StringIO(client.get(
        f"/api/v1/results/export.csv?batch={made.batch_id}", headers=bearer).get_data(as_text=True).lstrip("\ufeff"))))
    assert [r["final_text"] for r in rows] == ["x;'=1+1;y"]
    refused = client.get("/api/v1/results/export.csv")
    assert refused.status_code == 401 and refused.is_json
    bad = client.get("/api/v1/results/export.csv?where=nonsense", headers=bearer)
    assert bad.status_code == 400 and bad.is_json
    # One row per item is per scenario (its lists): without one, a 400 that says so, at once.
    items = client.get(f"/api/v1/results/export.items.csv?batch={made.batch_id}", headers=bearer)
    assert items.status_code == 400 and "Give scenario=NAME" in items.json["detail"]
    assert logged_in_client.get(f"/results/export.items.csv?batch={made.batch_id}").status_code == 400
