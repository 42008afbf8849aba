from __future__ import annotations

import base64
import re

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
    assert response.status_code == 403
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
    assert logged_in_client.post("/auth/logout").status_code == 403
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


# -- sessions that end, and guesses that wait (issue 19) -------------------------------------

def _new_user(password: str = "a long password") -> str:
    import uuid

    from vidlora.db import session_scope
    from web.auth.users import create_user

    name = "u" + uuid.uuid4().hex[:10]
    with session_scope() as session:
        create_user(session, name, password)
    return name


def test_a_copied_session_cookie_dies_at_sign_out(app, database):
    name = _new_user()
    reviewer, thief = app.test_client(), app.test_client()
    assert login(reviewer, name, "a long password").status_code == 302
    thief.set_cookie("session", reviewer.get_cookie("session").value)  # the cookie, stolen
    assert thief.get("/batches/").status_code == 200
    reviewer.post("/auth/logout", data={"csrf_token": csrf_token(reviewer, "/batches/")})
    assert thief.get("/batches/").status_code == 302  # sent to sign in
    assert login(reviewer, name, "a long password").status_code == 302  # a new sign-in works


def test_a_password_change_ends_every_session(app, database):
    from vidlora.db import session_scope
    from web.auth.users import set_password

    name = _new_user()
    client = app.test_client()
    assert login(client, name, "a long password").status_code == 302
    with session_scope() as session:
        set_password(session, name, "another long password")
    assert client.get("/batches/").status_code == 302


def _from(app, address: str):
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = address
    return client


def _address() -> str:
    import random

    return f"10.{random.randrange(256)}.{random.randrange(256)}.{random.randrange(1, 255)}"


def test_wrong_passwords_make_the_next_try_from_that_address_wait(app, database):
    import base64

    from web.auth.throttle import FREE_PER_ACCOUNT

    name, here = _new_user(), _address()
    client = _from(app, here)
    for _ in range(FREE_PER_ACCOUNT):
        assert login(client, name, "guess").status_code == 401
    refused = login(client, name, "a long password")  # even the right password waits, from here
    assert refused.status_code == 429 and b"try again in 1 s" in refused.data
    basic = "Basic " + base64.b64encode(f"{name}:a long password".encode()).decode()
    api = _from(app, here).get("/api/v1/batches", headers={"Authorization": basic})
    assert api.status_code == 429 and api.headers["Retry-After"] == "1"


def test_a_guesser_cannot_lock_the_owner_out(app, database):
    """Issue 32: one wrong guess every 50 ms for 70 s kept the owner out for 15 minutes."""
    name, attacker = _new_user(), _from(app, _address())
    answers = {login(attacker, name, f"guess {i}").status_code for i in range(40)}
    assert answers == {401, 429}
    assert login(_from(app, _address()), name, "a long password").status_code == 302  # the owner, elsewhere
    assert login(attacker, name, "a long password").status_code == 429  # the guesser's address waits


def test_a_reset_lifts_the_wait_for_the_account(app, database):
    from vidlora.db import session_scope
    from web.auth.users import set_password

    name, here = _new_user(), _address()
    client = _from(app, here)
    while login(client, name, "guess").status_code != 429:
        pass
    with session_scope() as session:
        set_password(session, name, "a new long password")
    assert login(client, name, "a new long password").status_code == 302


def test_a_429_tells_nothing_about_which_names_exist(app, database):
    """Issue 32: a real account answered 429 after 5 failures, an unknown name 401 forever."""
    def answers(name: str) -> list[tuple[int, bytes]]:
        client = _from(app, _address())
        out = []
        for _ in range(8):
            response = login(client, name, "guess")
            body = response.get_data().replace(name.encode(), b"NAME")
            out.append((response.status_code, re.sub(rb'(csrf-token" content|csrf_token" value)="[^"]+"', b"", body)))
        return out

    known, unknown = answers(_new_user()), answers("nobody-" + _new_user())
    assert [code for code, _ in known] == [code for code, _ in unknown] == [401] * 5 + [429] * 3
    assert known == unknown  # the same pages, word for word


def test_one_address_trying_many_names_is_slowed(app, database):
    from web.auth.throttle import FREE_PER_ADDRESS

    client = _from(app, _address())
    for i in range(FREE_PER_ADDRESS):
        assert login(client, f"someone-{i}", "guess").status_code == 401
    assert login(client, "someone-else", "guess").status_code == 429
    assert login(_from(app, _address()), "someone-else", "guess").status_code == 401  # not elsewhere


def test_a_cross_site_post_does_not_sign_the_victim_out(app, reviewer):
    """Issue 32: the CSRF 403 page set a fresh session cookie, replacing the victim's."""
    victim = app.test_client()
    assert login(victim, reviewer).status_code == 302
    # What a hostile page's form sends: no CSRF token, and (SameSite=Lax) no session cookie.
    forged = app.test_client().post("/auth/logout", data={})
    assert forged.status_code == 403 and "Set-Cookie" not in forged.headers
    assert victim.get("/batches/").status_code == 200


@pytest.fixture()
def redis_down(monkeypatch):
    """The broker's Redis unreachable (nothing listens on the port), for this test only."""
    from vidlora.config import reset_settings

    monkeypatch.setenv("VIDLORA_BROKER_URL", "redis://127.0.0.1:1/0")
    reset_settings()
    yield
    monkeypatch.delenv("VIDLORA_BROKER_URL")
    reset_settings()


def test_with_redis_down_sign_in_is_a_503_in_words_and_healthz_says_what_is_down(client, reviewer, redis_down):
    from tests.support.web import login

    response = login(client, reviewer)  # the right password
    assert response.status_code == 503 and response.headers["Retry-After"] == "30"
    page = response.get_data(as_text=True)
    assert "Redis (the store behind sign-in and the task queue) cannot be reached" in page
    api = client.get("/api/v1/batches", headers={"Authorization": "Basic " + base64.b64encode(
        f"{reviewer}:wrong".encode()).decode()})
    assert api.status_code == 503 and "Redis" in api.json["detail"]
    health = client.get("/healthz")
    assert health.status_code == 503
    assert health.json["down"] == ["redis"] and health.json["database"] == "ok" and health.json["ok"] is False
