from __future__ import annotations

import pytest

from tests.support.web import csrf_token, login


@pytest.mark.parametrize("path", ["/upload/", "/batches/", "/batches/1", "/videos/1", "/results/",
                                  "/results/export.csv", "/review/results/1", "/scenarios/", "/scenarios/workers",
                                  "/videos/frames/1/0.jpg", "/videos/1/file"])
def test_pages_redirect_to_login(client, database, path):
    response = client.get(path)
    assert response.status_code == 302
    assert response.headers["Location"].startswith("/auth/login?next=")


def test_index_goes_to_batches(client, database):
    assert client.get("/").headers["Location"].endswith("/batches/")


def test_login_page(client, database):
    page = client.get("/auth/login")
    assert page.status_code == 200
    assert b'data-testid="login-form"' in page.data


def test_login_and_logout(client, reviewer):
    response = login(client, reviewer)
    assert response.status_code == 302 and response.headers["Location"] == "/batches/"
    assert b'data-testid="current-user">reviewer<' in client.get("/batches/").data
    token = csrf_token(client, "/batches/")
    out = client.post("/auth/logout", data={"csrf_token": token})
    assert out.status_code == 302
    assert client.get("/batches/").status_code == 302


def test_wrong_password(client, reviewer):
    response = login(client, reviewer, "not the password")
    assert response.status_code == 401
    assert b"do not match" in response.data
    assert client.get("/batches/").status_code == 302


def test_unknown_user(client, database):
    assert login(client, "nobody-here").status_code == 401


def test_login_requires_csrf(client, reviewer):
    response = client.post("/auth/login", data={"username": reviewer, "password": "correct horse battery"})
    assert response.status_code == 400
    assert b"expired" in response.data


def test_next_is_followed_only_on_site(client, reviewer):
    token = csrf_token(client, "/auth/login")
    ok = client.post("/auth/login?next=/results/", data={"username": reviewer, "password": "correct horse battery",
                                                          "csrf_token": token})
    assert ok.headers["Location"] == "/results/"
    client.post("/auth/logout", data={"csrf_token": csrf_token(client, "/batches/")})
    for evil in ("https://evil.example/", "//evil.example/", "/\\evil.example"):
        token = csrf_token(client, "/auth/login")
        response = client.post("/auth/login", data={"username": reviewer, "password": "correct horse battery",
                                                    "csrf_token": token, "next": evil})
        assert response.headers["Location"] == "/batches/", evil
        client.post("/auth/logout", data={"csrf_token": csrf_token(client, "/batches/")})


def test_logout_requires_csrf(logged_in_client):
    assert logged_in_client.post("/auth/logout").status_code == 400
    assert logged_in_client.get("/batches/").status_code == 200


def test_deactivated_user_loses_session(client, database):
    from vidlora.db import session_scope
    from vidlora.models import User
    from web.auth.users import create_user

    with session_scope() as session:
        create_user(session, "leaving", "a long password")
    assert login(client, "leaving", "a long password").status_code == 302
    with session_scope() as session:
        session.query(User).filter(User.username == "leaving").update({"is_active": False})
    assert client.get("/batches/").status_code == 302
    assert login(client, "leaving", "a long password").status_code == 401
