from __future__ import annotations

import logging

import pytest

from web import InsecureSecretKey, create_app


def test_refuses_empty_secret_outside_development(database):
    with pytest.raises(InsecureSecretKey):
        create_app()


def test_dev_flag_generates_a_secret_and_says_so(database, caplog):
    with caplog.at_level(logging.WARNING):
        app = create_app(dev=True)
    assert len(app.config["SECRET_KEY"]) >= 32
    assert "random secret key" in caplog.text


def test_secret_from_config_is_kept(database):
    assert create_app({"SECRET_KEY": "configured"}).config["SECRET_KEY"] == "configured"


def test_upload_limit_comes_from_settings(app):
    from vidlora.config import get_settings

    assert app.config["MAX_CONTENT_LENGTH"] == get_settings().max_upload_bytes


def test_security_headers(client, database):
    response = client.get("/auth/login")
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert "script-src 'self'" in response.headers["Content-Security-Policy"]
    assert "unsafe-inline" not in response.headers["Content-Security-Policy"]


def test_friendly_404(logged_in_client):
    response = logged_in_client.get("/no/such/page")
    assert response.status_code == 404
    assert b'data-testid="error-page"' in response.data
    assert b"Not found" in response.data


def test_json_404_for_fetch(logged_in_client):
    response = logged_in_client.get("/batches/999999/status.json", headers={"Accept": "application/json"})
    assert response.status_code == 404
    assert response.json["status"] == 404


def test_static_files(client, database):
    for name in ("app.css", "common.js", "upload.js", "batch.js", "batches.js", "video.js"):
        response = client.get(f"/static/{name}")
        assert response.status_code == 200, name
        response.close()


def test_no_template_marks_text_safe():
    """Model output is escaped by autoescape; no template may switch that off."""
    from pathlib import Path

    import web

    root = Path(web.__file__).parent / "templates"
    for template in root.rglob("*.html"):
        text = template.read_text()
        assert "|safe" not in text.replace(" ", ""), template
        assert "autoescape false" not in text, template


def test_healthz_answers_without_login_and_checks_the_database_and_redis(client):
    resp = client.get("/healthz")
    assert resp.status_code == 200 and resp.get_json() == {"ok": True, "database": "ok", "redis": "ok"}


@pytest.mark.parametrize("key", ["change-me-secret-key", "short-but-random-x9", "my-SECRET-" + "x" * 40])
def test_refuses_a_placeholder_or_short_secret_outside_development(database, monkeypatch, key):
    from vidlora.config import reset_settings

    monkeypatch.setenv("VIDLORA_SECRET_KEY", key)
    reset_settings()
    try:
        with pytest.raises(InsecureSecretKey, match="placeholder or is shorter than 32"):
            create_app()
        assert create_app(dev=True).config["SECRET_KEY"] == key  # the demo may use it
    finally:
        monkeypatch.delenv("VIDLORA_SECRET_KEY")
        reset_settings()


def test_a_long_random_secret_and_secure_cookies_from_settings(database, monkeypatch):
    import secrets

    from vidlora.config import reset_settings

    key = secrets.token_hex(32)
    monkeypatch.setenv("VIDLORA_SECRET_KEY", key)
    monkeypatch.setenv("VIDLORA_SESSION_COOKIE_SECURE", "true")
    reset_settings()
    try:
        app = create_app()
        assert app.config["SECRET_KEY"] == key
        assert app.config["SESSION_COOKIE_SECURE"] is True and app.config["REMEMBER_COOKIE_SECURE"] is True
    finally:
        monkeypatch.delenv("VIDLORA_SECRET_KEY")
        monkeypatch.delenv("VIDLORA_SESSION_COOKIE_SECURE")
        reset_settings()
