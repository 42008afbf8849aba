"""web.proxy: with VIDLORA_PROXY_HOPS set, a request that reached the app without the proxy is
logged and makes `vidlora doctor` fail, since whoever can do that can forge X-Forwarded-For."""

from __future__ import annotations

import logging

import pytest
import redis

from vidlora.config import get_settings, reset_settings
from cli.doctor import _proxy
from web.proxy import DIRECT_KEY


@pytest.fixture()
def behind_a_proxy(database, broker, monkeypatch):
    from web import create_app

    monkeypatch.setenv("VIDLORA_PROXY_HOPS", "1")
    reset_settings()
    store = redis.Redis.from_url(get_settings().broker_url)
    store.delete(DIRECT_KEY)
    yield create_app({"TESTING": True, "SECRET_KEY": "test-secret-key"})
    store.delete(DIRECT_KEY)
    monkeypatch.delenv("VIDLORA_PROXY_HOPS")
    reset_settings()


def test_a_request_that_bypassed_the_proxy_is_logged_and_fails_the_doctor(behind_a_proxy, caplog):
    client = behind_a_proxy.test_client()
    with caplog.at_level(logging.WARNING, logger="web.proxy"):
        client.get("/healthz")  # compose's own probe
        client.get("/auth/login", headers={"X-Forwarded-For": "203.0.113.9"}, environ_base={"REMOTE_ADDR": "10.0.0.2"})
    assert not caplog.records
    [check] = _proxy(get_settings())
    assert check.ok and "no request has bypassed the proxy" in check.detail
    with caplog.at_level(logging.WARNING, logger="web.proxy"):
        client.get("/auth/login", environ_base={"REMOTE_ADDR": "198.51.100.7"})
        client.get("/auth/login", environ_base={"REMOTE_ADDR": "198.51.100.7"})
    [warning] = caplog.records  # once per address
    assert "198.51.100.7 reached the app without passing the proxy" in warning.getMessage()
    [check] = _proxy(get_settings())  # what `vidlora doctor` prints (tests/cli/test_doctor_and_audit.py)
    assert not check.ok and "from 198.51.100.7 reached the app without the proxy" in check.detail
    assert "let only the proxy reach the web app" in check.fix


def _through_the_proxy(client, host: str, origin: str, forwarded: dict[str, str] | None = None):
    """Sign in as a browser would behind a TLS proxy: the page, then the form post with the
    Origin and Referer the browser sends and the headers the proxy sets."""
    import re

    from tests.support.web import PASSWORD

    headers = {"Host": host, "X-Forwarded-For": "203.0.113.20", "X-Forwarded-Proto": "https", **(forwarded or {})}
    client.environ_base.update({"REMOTE_ADDR": "10.0.0.2"})
    page = client.get("/auth/login", headers=headers)
    assert page.status_code == 200
    token = re.search(r'<meta name="csrf-token" content="([^"]+)">', page.get_data(as_text=True)).group(1)
    return client.post("/auth/login", headers={**headers, "Origin": origin, "Referer": f"{origin}/auth/login"},
                       data={"username": "reviewer", "password": PASSWORD, "csrf_token": token})


@pytest.mark.parametrize("host, forwarded", [
    ("museum.example", None),                                             # nginx: Host $host (the port dropped)
    ("museum.example:8443", None),                                        # nginx: Host $http_host
    ("127.0.0.1:8000", {"X-Forwarded-Host": "museum.example", "X-Forwarded-Port": "8443"}),  # forwarded host/port
])
def test_sign_in_works_behind_a_tls_proxy_on_another_port(behind_a_proxy, reviewer, host, forwarded):
    client = behind_a_proxy.test_client()
    signed_in = _through_the_proxy(client, host, "https://museum.example:8443", forwarded)
    assert signed_in.status_code == 302, signed_in.get_data(as_text=True)[:300]
    assert signed_in.headers["Location"] == "/batches/"  # a relative redirect: right on any port


def test_a_form_from_another_site_is_refused_and_logged_with_why(behind_a_proxy, reviewer, caplog):
    client = behind_a_proxy.test_client()
    with caplog.at_level(logging.WARNING):
        refused = _through_the_proxy(client, "museum.example:8443", "https://elsewhere.example")
        wrong_port = _through_the_proxy(behind_a_proxy.test_client(), "museum.example:8443", "https://museum.example:9443")
    assert refused.status_code == wrong_port.status_code == 403
    logged = [r.getMessage() for r in caplog.records if "refused POST /auth/login" in r.getMessage()]
    assert len(logged) == 2 and "elsewhere.example" in logged[0] and "is not this site" in logged[0], logged
    assert "9443" in logged[1]


def test_a_refused_form_is_logged_with_why(client, caplog):
    with caplog.at_level(logging.WARNING):
        refused = client.post("/auth/login", data={"username": "reviewer", "password": "x"})
    assert refused.status_code == 403
    assert any("refused POST /auth/login" in r.getMessage() and "CSRF token is missing" in r.getMessage()
               for r in caplog.records)


def test_a_bypass_after_the_record_was_cleared_is_recorded_again(behind_a_proxy, caplog):
    """The notice was kept once per address per process: after `redis-cli DEL` (the doctor's
    fix) or a week's expiry, the same bypass never showed again and the doctor said ok."""
    client = behind_a_proxy.test_client()
    store = redis.Redis.from_url(get_settings().broker_url)
    client.get("/auth/login", environ_base={"REMOTE_ADDR": "198.51.100.8"})
    assert not _proxy(get_settings())[0].ok
    store.delete(DIRECT_KEY)  # what the doctor's fix says to run once the firewall is right
    assert _proxy(get_settings())[0].ok
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="web.proxy"):
        client.get("/auth/login", environ_base={"REMOTE_ADDR": "198.51.100.8"})
    [check] = _proxy(get_settings())
    assert not check.ok and "198.51.100.8" in check.detail
    assert not caplog.records  # logged once an hour per address, recorded every time
