from __future__ import annotations

import io

from sqlalchemy import select

from vidlora.db import session_scope
from vidlora.models import Batch, Upload


def _post(client, files, scenarios=("artifact_identification",), name="Trench 9", headers=None, token=True):
    data = {"scenarios": list(scenarios), "name": name,
            "files": [(io.BytesIO(content), filename) for filename, content in files]}
    if token:
        data["csrf_token"] = client.csrf
    return client.post("/upload/", data=data, content_type="multipart/form-data", headers=headers or {})


def _uploads(batch_id: int) -> list[Upload]:
    with session_scope() as session:
        return list(session.scalars(select(Upload).where(Upload.batch_id == batch_id).order_by(Upload.id)))


def test_upload_page(logged_in_client):
    page = logged_in_client.get("/upload/")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    for testid in ("upload-form", "file-input", "scenario-artifact_identification", "scenario-tomb_structure",
                   "upload-submit", "dropzone"):
        assert f'data-testid="{testid}"' in html
    assert ".tar.gz" in html and ".mp4" in html


def test_upload_several_videos_starts_batch(logged_in_client):
    response = _post(logged_in_client, [("a.mp4", b"video-a" * 100), ("b.mov", b"video-b" * 100)],
                     scenarios=("artifact_identification", "tomb_structure"))
    assert response.status_code == 303
    batch_id = int(response.headers["Location"].rstrip("/").rsplit("/", 1)[-1])
    with session_scope() as session:
        batch = session.get(Batch, batch_id)
        assert batch.name == "Trench 9" and batch.source == "web" and batch.created_by == "reviewer"
        assert batch.scenario_names == ["artifact_identification", "tomb_structure"]
    uploads = _uploads(batch_id)
    assert [u.name for u in uploads] == ["a.mp4", "b.mov"]
    assert uploads[0].size_bytes == 700


def test_upload_archive_via_xhr_returns_json(logged_in_client):
    response = _post(logged_in_client, [("season.tar.gz", b"\x1f\x8b" + b"0" * 50)], name="",
                     headers={"Accept": "application/json", "X-CSRFToken": logged_in_client.csrf}, token=False)
    assert response.status_code == 201
    assert response.json["url"] == f"/batches/{response.json['batch_id']}"
    uploads = _uploads(response.json["batch_id"])
    assert [u.name for u in uploads] == ["season.tar.gz"]
    with session_scope() as session:
        assert session.get(Batch, response.json["batch_id"]).name == "season.tar.gz"


def test_path_in_filename_is_dropped(logged_in_client):
    response = _post(logged_in_client, [("../../etc/evil.mp4", b"x" * 10)])
    assert response.status_code == 303
    batch_id = int(response.headers["Location"].rsplit("/", 1)[-1])
    upload = _uploads(batch_id)[0]
    assert upload.name == "evil.mp4" and ".." not in upload.path


def test_bad_type_is_refused(logged_in_client):
    with session_scope() as session:
        before = session.query(Batch).count()
    response = _post(logged_in_client, [("a.mp4", b"x"), ("notes.exe", b"MZ")])
    assert response.status_code == 400
    assert b"Not a video or archive: notes.exe" in response.data
    with session_scope() as session:
        assert session.query(Batch).count() == before


def test_bad_type_json(logged_in_client):
    response = _post(logged_in_client, [("x.php", b"<?php")], headers={"Accept": "application/json"})
    assert response.status_code == 400 and "x.php" in response.json["detail"]


def test_no_files(logged_in_client):
    response = _post(logged_in_client, [])
    assert response.status_code == 400 and b"Choose at least one video" in response.data


def test_no_scenario(logged_in_client):
    response = _post(logged_in_client, [("a.mp4", b"x")], scenarios=())
    assert response.status_code == 400 and b"Choose at least one scenario" in response.data


def test_unknown_scenario(logged_in_client):
    response = _post(logged_in_client, [("a.mp4", b"x")], scenarios=("dragons",))
    assert response.status_code == 400
    assert b"Unknown scenario(s): dragons" in response.data


def test_too_large(logged_in_client, app, monkeypatch):
    monkeypatch.setitem(app.config, "MAX_CONTENT_LENGTH", 2048)
    response = _post(logged_in_client, [("big.mp4", b"x" * 4096)])
    assert response.status_code == 413
    assert b"larger than the limit of 2.0 KB" in response.data
    json_response = _post(logged_in_client, [("big.mp4", b"x" * 4096)], headers={"Accept": "application/json"})
    assert json_response.status_code == 413 and "limit" in json_response.json["detail"]


def test_upload_requires_csrf(logged_in_client):
    response = _post(logged_in_client, [("a.mp4", b"x")], token=False)
    assert response.status_code == 403 and b"expired" in response.data


def test_upload_requires_login(client, database):
    from tests.support.web import csrf_token

    token = csrf_token(client, "/auth/login")  # an anonymous session's valid token
    response = client.post("/upload/", data={"csrf_token": token})
    assert response.status_code == 302 and "/auth/login" in response.headers["Location"]


def test_the_page_and_the_server_share_one_file_name_rule(logged_in_client):
    from vidlora.ingest.kinds import UNNAMED

    html = logged_in_client.get("/upload/").get_data(as_text=True)
    assert f'data-unnamed="{UNNAMED.pattern}"' in html  # what upload.js tests each chosen file with
    response = _post(logged_in_client, [("a.mp4", b"x"), ("   .mp4", b"y"), ("..mp4", b"z")],
                     headers={"Accept": "application/json"})
    assert response.status_code == 400 and ".mp4, ..mp4" in response.json["detail"]
