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


def forget() -> None:
    with _lock:
        _kept.clear()
