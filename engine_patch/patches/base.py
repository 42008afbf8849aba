"""The shape every patch has: a probe of the installed code, then an apply step."""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

MARK = "__vidlora_patched__"


@dataclass(frozen=True, slots=True)
class Patch:
    name: str
    # Which upstream defect (issue numbers / failure class) this covers.
    covers: str
    # Returns None when the installed vLLM needs this patch, else why it does not.
    probe: Callable[[], str | None]
    apply: Callable[[], None]


def mark(fn: Callable) -> Callable:
    setattr(fn, MARK, True)
    return fn


def is_marked(fn: object) -> bool:
    return bool(getattr(fn, MARK, False))


def wraps_marked(orig: Callable) -> Callable[[Callable], Callable]:
    """functools.wraps that also keeps the original for tests and un-patching."""
    def deco(fn: Callable) -> Callable:
        fn = functools.wraps(orig)(fn)
        fn.__vidlora_orig__ = orig  # type: ignore[attr-defined]
        return mark(fn)
    return deco
