"""`vidlora user ...` and `vidlora token ...`, run as an operator runs them; a token the CLI
printed opens the API, and stops opening it once revoked."""

from __future__ import annotations

import uuid

from tests.support.cli import vidlora


def test_accounts_and_tokens_from_the_command_line(database, broker):
    from web import create_app

    api = create_app({"TESTING": True, "SECRET_KEY": "test-secret-key"}).test_client()
    name = f"ops-{uuid.uuid4().hex[:6]}"
    assert vidlora("user", "create", name, "--password-stdin", stdin="a long enough password\n").returncode == 0
    assert vidlora("user", "role", name, "admin").stdout.strip() == f"user {name} is now admin"

    made = vidlora("token", "create", name, "--name", "nightly export", "--scope", "read")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("vl_")
    assert api.get("/api/v1/results", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    listed = vidlora("token", "list", name).stdout
    assert "nightly export" in listed and "read" in listed and token not in listed
    token_id = listed.split()[0]
    assert f"{name:<24} admin" in vidlora("user", "list").stdout

    assert vidlora("token", "revoke", token_id).returncode == 0
    assert api.get("/api/v1/results", headers={"Authorization": f"Bearer {token}"}).status_code == 401

    password = vidlora("user", "reset", name).stdout.strip()
    assert len(password) >= 12
    auth = {"Authorization": "Basic " + __import__("base64").b64encode(f"{name}:{password}".encode()).decode()}
    assert api.get("/api/v1/results", headers=auth).status_code == 200
    # the last active admin is never deactivated: with a second admin, this one can be
    if vidlora("user", "deactivate", name).returncode != 0:
        second = f"ops2-{uuid.uuid4().hex[:6]}"
        assert vidlora("user", "create", second, "--role", "admin", "--password-stdin",
                       stdin="another long password\n").returncode == 0
        assert vidlora("user", "deactivate", name).returncode == 0
    assert "deactivated" in vidlora("user", "list").stdout.split(name)[1].splitlines()[0]
    assert api.get("/api/v1/results", headers=auth).status_code == 401

    # errors are one clear line, not a traceback
    for args in (("user", "deactivate", "nobody-here"), ("token", "create", "nobody-here", "--name", "x"),
                 ("token", "revoke", "99999999")):
        out = vidlora(*args)
        assert out.returncode == 1 and out.stderr.startswith("Error: ") and "Traceback" not in out.stderr, out.stderr
