"""Figures the Scenarios page computes over a whole scenario, kept between page views until
what they are computed from changes.

Agreement and calibration score every reviewed answer of a scenario in Python, and the latency
panel takes percentiles over every result of its window: the most costly parts of the page at
100k results (issue 58), for numbers that only move when a result is stored or reviewed. Each
is kept in this process under a key that changes with any of that (``feedback.scores`` builds
its key from the grouped counts it reads anyway: per adapter version how many results there
are, the newest id, the sum of their review versions, which every review action but a note
moves on, ``web.review.actions``; ``latency`` from the count and newest id of the results,
and the minute); the next view after a change computes afresh.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

KEPT = 64  # measures kept, the least recently used dropped first
T = TypeVar("T")
_kept: OrderedDict[Hashable, Any] = OrderedDict()
_lock = threading.Lock()


def remembered(key: Hashable, compute: Callable[[], T]) -> T:
    """``compute()``, or what it gave for this key before."""
    with _lock:
        if key in _kept:
            _kept.move_to_end(key)
            return _kept[key]
    value = compute()
    with _lock:
        _kept[key] = value
        while len(_kept) > KEPT:
            _kept.popitem(last=False)
    return value


# Items kept one by one (a scored answer per result and review version): a change to a few of a
# scenario's results then costs a few items, not all of them again.
ITEMS_KEPT = 100_000
_items: OrderedDict[Hashable, Any] = OrderedDict()


def kept_items(keys: list[Hashable]) -> dict[Hashable, Any]:
    """Those of ``keys`` kept, with what was kept for them."""
    with _lock:
        found = {k: _items[k] for k in keys if k in _items}
        for k in found:
            _items.move_to_end(k)
    return found


def keep_items(items: dict[Hashable, Any]) -> None:
    with _lock:
        _items.update(items)
        while len(_items) > ITEMS_KEPT:
            _items.popitem(last=False)


def forget() -> None:
    with _lock:
        _kept.clear()
        _items.clear()


def _fresh_lock_in_child() -> None:
    # A web process warms these in a thread (web.scenarios.warm); a process that forks after
    # (gunicorn --preload, a test) while that thread held the lock would leave the child's copy
    # held for ever, and its Scenarios page waiting on it. What was kept stays valid.
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock_in_child)
