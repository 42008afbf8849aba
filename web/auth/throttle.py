"""Slowing password guessing down without letting anyone lock a user out (docs/security.md).

Wrong passwords are counted twice, each count with an allowance and then a doubling wait
(1, 2, 4 ... s, at most ``MAX_WAIT_S``) before the next try from there is even checked:

- per source address, whatever the name (``FREE_PER_ADDRESS``): one address trying many
  names, or many guesses at once;
- per account name *and* address (``FREE_PER_ACCOUNT``): one address guessing one account.

There is no count per account alone, so a guesser elsewhere can never make the owner wait: the
owner signs in from their own address. A name nobody has is counted exactly like a real one,
so a 429 says nothing about which names exist. A right password clears its name-and-address
count (not the address's: one's own account must not buy more guesses at others'); a password
change or an admin's reset clears every count of the account. Counts are forgotten
``WINDOW_S`` after their last failure.

The counts live in Redis (the broker) so every web process shares them; the embedded demo,
one process without Redis, keeps them in memory.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable
from typing import Any

FREE_PER_ACCOUNT = 5
FREE_PER_ADDRESS = 50
MAX_WAIT_S = 900
WINDOW_S = 3600
PREFIX = "vidlora:signin:"


class SignInThrottled(Exception):
    def __init__(self, retry_after_s: int):
        super().__init__(f"Too many wrong passwords from here: try again in {retry_after_s} s.")
        self.retry_after_s = retry_after_s


def _digest(value: str) -> str:
    # Names and addresses are user input: keys of fixed length and alphabet.
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def account_key(username: str) -> str:
    return PREFIX + "account:" + _digest(username.strip().casefold())


def address_key(address: str) -> str:
    return PREFIX + "address:" + _digest(address)


class LocalCounters:
    """The few Redis hash commands the throttle uses, in this process's memory (embedded demo)."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self._data: dict[str, tuple[float, dict[str, float]]] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def _live(self, key: str) -> dict[str, float]:
        expires, fields = self._data.get(key, (math.inf, {}))
        if expires <= self._clock():
            self._data.pop(key, None)
            return {}
        return fields

    def hmget(self, key: str, fields: list[str]) -> list[Any]:
        with self._lock:
            live = self._live(key)
            return [live.get(f) for f in fields]

    def hincrby(self, key: str, field: str, amount: int) -> int:
        with self._lock:
            live = self._live(key)
            live[field] = live.get(field, 0) + amount
            self._data[key] = (self._data.get(key, (math.inf, {}))[0], live)
            return int(live[field])

    def hset(self, key: str, field: str, value: float) -> None:
        with self._lock:
            live = self._live(key)
            live[field] = value
            self._data[key] = (self._data.get(key, (math.inf, {}))[0], live)

    def expire(self, key: str, seconds: int) -> None:
        with self._lock:
            if key in self._data:
                self._data[key] = (self._clock() + seconds, self._data[key][1])

    def delete(self, key: str) -> None:
        with self._lock:
            self._data.pop(key, None)

    def hdel(self, key: str, *fields: str) -> None:
        with self._lock:
            for f in fields:
                self._live(key).pop(f, None)


class Throttle:
    def __init__(self, store, clock: Callable[[], float] = time.time):
        self.store = store
        self.clock = clock

    def _counts(self, username: str, address: str) -> list[tuple[str, str, int]]:
        """(key, field prefix, allowance) of each count a sign-in from ``address`` touches."""
        return [(address_key(address), "", FREE_PER_ADDRESS),
                (account_key(username), _digest(address) + ":", FREE_PER_ACCOUNT)]

    def check(self, username: str, address: str) -> None:
        """Raise SignInThrottled while either count says wait."""
        now = self.clock()
        wait = 0.0
        for key, field, _ in self._counts(username, address):
            [until] = self.store.hmget(key, [field + "until"])
            if until is not None:
                wait = max(wait, float(until) - now)
        if wait > 0:
            raise SignInThrottled(max(1, math.ceil(wait)))

    def failed(self, username: str, address: str) -> None:
        now = self.clock()
        for key, field, free in self._counts(username, address):
            failures = self.store.hincrby(key, field + "n", 1)
            if failures >= free:
                self.store.hset(key, field + "until", now + min(MAX_WAIT_S, 2 ** (failures - free)))
            self.store.expire(key, WINDOW_S)

    def succeeded(self, username: str, address: str) -> None:
        key = account_key(username)
        field = _digest(address) + ":"
        self.store.hdel(key, field + "n", field + "until")

    def forget_account(self, username: str) -> None:
        """A new password: the account's counts from every address start again."""
        self.store.delete(account_key(username))


_local: LocalCounters | None = None


def get_throttle() -> Throttle:
    """The throttle on the broker's Redis (one connection pool per process), or in memory for
    the embedded demo."""
    global _local
    from vidlora.config import get_settings

    url = get_settings().broker_url
    if url.startswith("redis"):
        return Throttle(_redis(url))
    if _local is None:
        _local = LocalCounters()
    return Throttle(_local)


_clients: dict[str, Any] = {}


def _redis(url: str):
    if url not in _clients:
        import redis

        _clients[url] = redis.Redis.from_url(url, socket_timeout=5)
    return _clients[url]
