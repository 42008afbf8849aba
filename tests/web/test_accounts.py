"""API tokens (web.auth.tokens, the tokens page, the API's Bearer auth) and account admin
(the accounts page): issue 19's "no password in scripts" and "accounts with roles"."""

from __future__ import annotations

import re
import uuid

import pytest
from sqlalchemy import select

from tests.support.web import csrf_token, login
from vidlora.db import session_scope
from vidlora.models import ApiToken

PASSWORD = "a long enough password"


@pytest.fixture()
def make_user(database):
    from web.auth.users import create_user

    def make(role: str = "reviewer") -> str:
        name = f"{role}-{uuid.uuid4().hex[:8]}"
        with session_scope() as session:
            create_user(session, name, PASSWORD, role)
        return name
    return make


def _signed_in(app, username: str):
    client = app.test_client()
    assert login(client, username, PASSWORD).status_code == 302
    client.csrf = csrf_token(client)
    return client


def _new_token(client, name: str, scope: str) -> str:
    response = client.post("/accounts/tokens", data={"csrf_token": client.csrf, "name": name, "scope": scope})
    assert response.status_code == 200 and response.headers["Cache-Control"] == "no-store"
    [token] = re.findall(r'data-testid="token-value">(vl_[^<]+)<', response.get_data(as_text=True))
    return token


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_token_is_shown_once_stored_hashed_and_scoped(app, make_user, factory):
    client = _signed_in(app, make_user())
    token = _new_token(client, "nightly export", "read")
    # shown once: the list names it by prefix only, and only a hash is stored
    page = client.get("/accounts/tokens").get_data(as_text=True)
    assert token not in page and f"vl_{token[3:11]}_…" in page and "nightly export" in page
    with session_scope() as session:
        row = session.scalar(select(ApiToken).where(ApiToken.prefix == token[3:11]))
        assert row.token_hash != token and len(row.token_hash) == 64 and token not in repr(vars(row))

    api = app.test_client()  # no cookie: the token alone
    assert api.get("/api/v1/results", headers=_bearer(token)).status_code == 200
    rid = factory.batch().result_ids["artifact_identification"]
    refused = api.post(f"/api/v1/results/{rid}/review", json={"action": "approve"}, headers=_bearer(token))
    assert refused.status_code == 403 and "may only read" in refused.json["detail"]

    writer = _new_token(client, "review bot", "review")
    done = api.post(f"/api/v1/results/{rid}/review", json={"action": "approve"},
                    headers={**_bearer(writer), "If-Match": '"v0"'})
    assert done.status_code == 200 and done.json["review_state"] == "approved"  # no CSRF token needed
    with session_scope() as session:
        assert session.scalar(select(ApiToken.last_used_at).where(ApiToken.prefix == writer[3:11])) is not None

    assert api.get("/api/v1/results", headers=_bearer(token[:-1] + "x")).status_code == 401
    assert api.get("/api/v1/results", headers=_bearer("not-a-token")).status_code == 401


def test_a_revoked_token_is_refused_at_once(app, make_user):
    client = _signed_in(app, make_user())
    token = _new_token(client, "temporary", "read")
    token_id = int(re.search(r'data-token-id="(\d+)" data-revoked="false"', client.get("/accounts/tokens")
                             .get_data(as_text=True))[1])
    response = client.post(f"/accounts/tokens/{token_id}/revoke", data={"csrf_token": client.csrf})
    assert response.status_code == 303
    assert app.test_client().get("/api/v1/results", headers=_bearer(token)).status_code == 401
    assert f'data-token-id="{token_id}" data-revoked="true"' in client.get("/accounts/tokens").get_data(as_text=True)


def test_nobody_revokes_someone_elses_token_but_an_admin(app, make_user):
    owner, other = _signed_in(app, make_user()), _signed_in(app, make_user())
    _new_token(owner, "mine", "read")
    token_id = int(re.search(r'data-token-id="(\d+)"', owner.get("/accounts/tokens").get_data(as_text=True))[1])
    assert other.post(f"/accounts/tokens/{token_id}/revoke", data={"csrf_token": other.csrf}).status_code == 404
    admin = _signed_in(app, make_user("admin"))
    assert admin.post(f"/accounts/tokens/{token_id}/revoke", data={"csrf_token": admin.csrf, "from": "users"}) \
        .headers["Location"] == "/accounts/users"


def test_a_token_needs_a_name_and_a_known_scope(app, make_user):
    client = _signed_in(app, make_user())
    bad = client.post("/accounts/tokens", data={"csrf_token": client.csrf, "name": "x", "scope": "admin"})
    assert bad.status_code == 400 and "scope is one of: read, review" in bad.get_data(as_text=True)
    assert client.post("/accounts/tokens", data={"csrf_token": client.csrf, "name": " ", "scope": "read"}).status_code == 400
    # the form posts with the session cookie: CSRF applies
    assert client.post("/accounts/tokens", data={"name": "x", "scope": "read"}).status_code == 403


def test_only_admins_manage_accounts(app, make_user):
    reviewer = _signed_in(app, make_user())
    assert reviewer.get("/accounts/users").status_code == 403
    assert 'data-testid="nav-users"' not in reviewer.get("/accounts/tokens").get_data(as_text=True)
    admin = _signed_in(app, make_user("admin"))
    page = admin.get("/accounts/users").get_data(as_text=True)
    assert 'data-testid="nav-users"' in page and 'data-testid="user-list"' in page


def test_deactivating_signs_out_everywhere_and_revokes_tokens(app, make_user):
    name = make_user()
    victim = _signed_in(app, name)
    token = _new_token(victim, "script", "read")
    admin = _signed_in(app, make_user("admin"))
    user_id = _user_id(name)
    assert admin.post(f"/accounts/users/{user_id}", data={"csrf_token": admin.csrf, "action": "deactivate"}).status_code == 303
    assert victim.get("/batches/").status_code == 302  # the session is gone
    assert app.test_client().get("/api/v1/results", headers=_bearer(token)).status_code == 401
    assert login(app.test_client(), name, PASSWORD).status_code == 401
    # reactivated: signs in again, the old token stays dead
    admin.post(f"/accounts/users/{user_id}", data={"csrf_token": admin.csrf, "action": "activate"})
    assert login(app.test_client(), name, PASSWORD).status_code == 302
    assert app.test_client().get("/api/v1/results", headers=_bearer(token)).status_code == 401


def test_a_reset_password_is_shown_once_and_works(app, make_user):
    name = make_user()
    admin = _signed_in(app, make_user("admin"))
    response = admin.post(f"/accounts/users/{_user_id(name)}", data={"csrf_token": admin.csrf, "action": "reset"})
    assert response.headers["Cache-Control"] == "no-store"
    [password] = re.findall(r'data-testid="new-password">([^<]+)<', response.get_data(as_text=True))
    assert login(app.test_client(), name, password).status_code == 302
    assert login(app.test_client(), name, PASSWORD).status_code == 401
    assert password not in admin.get("/accounts/users").get_data(as_text=True)


def test_roles_change_and_the_last_admin_stays(app, make_user):
    from vidlora.models import User

    with session_scope() as session:  # other tests' admins: make this one the only active admin
        for user in session.scalars(select(User).where(User.role == "admin")):
            user.is_active = False
    name = make_user("admin")
    admin = _signed_in(app, name)
    me = _user_id(name)
    for action in ({"action": "deactivate"}, {"action": "role", "role": "reviewer"}):
        refused = admin.post(f"/accounts/users/{me}", data={"csrf_token": admin.csrf, **action})
        assert refused.status_code == 400 and "last active admin" in refused.get_data(as_text=True)
    other = make_user()
    admin.post(f"/accounts/users/{_user_id(other)}", data={"csrf_token": admin.csrf, "action": "role", "role": "admin"})
    assert _signed_in(app, other).get("/accounts/users").status_code == 200


def test_the_openapi_document_names_the_token_scheme(client):
    doc = client.get("/api/v1/openapi.json").json
    assert doc["components"]["securitySchemes"]["token"] == {
        "type": "http", "scheme": "bearer", "bearerFormat": "vidlora API token (vl_...)",
        "description": "Scope read: GET only. Scope review: also POST batches and reviews."}
    assert doc["security"][0] == {"token": []}


def _user_id(name: str) -> int:
    from vidlora.models import User

    with session_scope() as session:
        return session.scalar(select(User.id).where(User.username == name))


def test_tokens_work_on_the_embedded_sqlite_database(tmp_path):
    """The demo runs on SQLite: creating, using twice (naive timestamps read back) and revoking."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from vidlora.models import Base
    from web.auth.tokens import create_token, revoke_token, token_user
    from web.auth.users import create_user

    engine = create_engine(f"sqlite:///{tmp_path / 'demo.db'}")
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        user = create_user(session, "demo", PASSWORD)
        new = create_token(session, user, "script", "read")
        session.commit()
        assert token_user(session, new.token)[0].username == "demo"
        session.commit()
        session.expire_all()  # read last_used_at back from SQLite
        assert token_user(session, new.token) is not None
        revoke_token(session, new.id)
        assert token_user(session, new.token) is None


def test_a_token_dies_with_its_owners_password(app, make_user):
    """Issue 32: a token minted from a stolen session outlived a password change and an admin's
    reset (page and `vidlora user reset`); now each of them revokes the account's tokens."""
    from click.testing import CliRunner

    from web.cli import user_group

    name = make_user()
    admin = _signed_in(app, make_user("admin"))
    api = app.test_client()
    resets = {
        "page": lambda: admin.post(f"/accounts/users/{_user_id(name)}", data={"csrf_token": admin.csrf, "action": "reset"}),
        "cli reset": lambda: CliRunner().invoke(user_group, ["reset", name]),
        "cli set-password": lambda: CliRunner().invoke(user_group, ["set-password", name, "--password-stdin"],
                                                       input=PASSWORD + "\n"),
    }
    from web.auth.users import set_password

    for how, reset in resets.items():
        with session_scope() as session:  # a reset before left a random password: sign in with a known one
            set_password(session, name, PASSWORD)
        token = _new_token(_signed_in(app, name), "stolen", "review")
        assert api.get("/api/v1/results", headers=_bearer(token)).status_code == 200
        done = reset()
        assert getattr(done, "exit_code", 0) == 0 and getattr(done, "status_code", 200) == 200, how
        assert api.get("/api/v1/results", headers=_bearer(token)).status_code == 401, how
        if how == "page":
            assert "API tokens were revoked" in done.get_data(as_text=True)  # the admin is told
        elif how == "cli set-password":
            assert "1 API token(s) revoked" in done.output


def test_a_username_cannot_hide_what_it_is(app, make_user):
    """Issue 32: a user named with U+202E impersonated "admin"; a zero-width space made a twin."""
    from vidlora.models import User
    from web.auth.users import UserError, create_user

    for name in ("\u202enimda", "ad\u200bmin", "ad\u00a0min", "x\ty"):
        with pytest.raises(UserError, match="invisible, control or direction-changing"):
            with session_scope() as session:
                create_user(session, name, PASSWORD)
    with session_scope() as session:  # one made before this rule: shown for what it is
        session.add(User(username=f"\u202enimda-{uuid.uuid4().hex[:4]}", password_hash="x", role="reviewer"))
    page = _signed_in(app, make_user("admin")).get("/accounts/users").get_data(as_text=True)
    assert "[U+202E]nimda-" in page and "<td class=\"wrap\">\u202e" not in page
