"""Trusting X-Forwarded-For only as far as the operator said (``VIDLORA_PROXY_HOPS``), and
saying so when that trust is misplaced.

With N hops the app takes the client address from the N-th entry from the right of
X-Forwarded-For (werkzeug's ProxyFix): right while every request passes the proxies. If the
app can also be reached directly, a client sends its own X-Forwarded-For and picks the
address the sign-in throttle counts, a fresh one per guess. That cannot be told from a request
that did come through the proxy, but a direct request without the header can: the proxy
always adds one. Such a request is remembered in Redis every time, where ``vidlora doctor``
reads it (so a bypass after the record expired or was cleared is seen again), and logged once
per address an hour (so a client that keeps bypassing does not flood the log).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

# Where the latest direct request is remembered for `vidlora doctor` (a week).
DIRECT_KEY = "vidlora:web:direct-request"
DIRECT_TTL_S = 7 * 24 * 3600
# Probes that operators point at the app itself on purpose (compose's health check, Prometheus).
PROBES = ("/healthz", "/metrics")
LOG_EVERY_S = 3600


class DirectRequests:
    """WSGI middleware in front of ProxyFix: notices requests that bypassed the proxies."""

    def __init__(self, app: Callable, hops: int, remember: Callable[[str], None]):
        self.app, self.hops, self.remember = app, hops, remember
        self._logged: dict[str, float] = {}  # address -> when it was last logged (monotonic)
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable):
        forwarded = [part for part in environ.get("HTTP_X_FORWARDED_FOR", "").split(",") if part.strip()]
        if len(forwarded) < self.hops and environ.get("PATH_INFO") not in PROBES:
            self._noticed(environ.get("REMOTE_ADDR") or "unknown")
        return self.app(environ, start_response)

    def _noticed(self, address: str) -> None:
        now = time.monotonic()
        with self._lock:
            due = now - self._logged.get(address, -LOG_EVERY_S) >= LOG_EVERY_S
            if due:
                if len(self._logged) > 10_000:  # many forged addresses: keep memory bounded
                    self._logged.clear()
                self._logged[address] = now
        if due:
            log.warning(
                "VIDLORA_PROXY_HOPS=%d, but a request from %s reached the app without passing the proxy "
                "(no X-Forwarded-For entry of its own). Anyone who can reach the app directly can forge "
                "X-Forwarded-For and skip the sign-in throttle: let only the proxy reach it.", self.hops, address)
        try:
            self.remember(address)
        except Exception as exc:  # noqa: BLE001 - a warning must never fail the request
            if due:
                log.warning("could not record the direct request for `vidlora doctor`: %s", exc)


def redis_recorder(url: str) -> Callable[[str], None]:
    clients: list[Any] = []  # one connection pool for the process, made on first use

    def remember(address: str) -> None:
        import redis

        if not clients:
            clients.append(redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2))
        clients[0].set(DIRECT_KEY, json.dumps({"address": address, "at": time.time()}), ex=DIRECT_TTL_S)

    return remember


def last_direct(client) -> dict[str, Any] | None:
    """What the app last noticed (``redis_recorder``), or None."""
    raw = client.get(DIRECT_KEY)
    return json.loads(raw) if raw else None
