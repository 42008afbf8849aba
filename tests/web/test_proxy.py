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
