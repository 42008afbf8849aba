"""vLLM's CPU platform rebinds Triton kernels by scanning every loaded module's globals and
reading each value's ``__dict__`` (0.26-0.33 ``_rebind_kernels``: ``hasattr(value, "__dict__")``;
0.34 ``_rebind_impls``: ``vars(value)`` guarded for TypeError only). A context-local proxy
(Flask's ``current_app``, werkzeug ``LocalProxy``) raises RuntimeError there instead of
AttributeError or TypeError, so building an engine in any process that has imported Flask fails
with "Working outside of application context". The patch hides values whose ``__dict__`` lookup
raises from the scan and puts them back afterwards.

In 0.34 no platform of the wheel registers Triton kernel overrides (the CPU platform's
``register_triton_kernel_overrides`` is gone), so the scan does not run there; the patch is
applied for a platform plugin that still registers some.
"""
from __future__ import annotations

import inspect

from .base import Patch, is_marked, wraps_marked

# The scan's name by vLLM version: 0.34 renamed it when device functions joined kernels.
_SCANS = ("_rebind_impls", "_rebind_kernels")


def _target():
    from vllm.triton_utils import dispatcher

    return dispatcher


def _scan(dispatcher) -> str | None:
    return next((name for name in _SCANS if callable(getattr(dispatcher, name, None))), None)


def scan_survives_proxies(source: str) -> bool:
    """The scan reads values' ``__dict__`` only under a handler that catches any exception."""
    reads = 'hasattr(value, "__dict__")' in source or "vars(value)" in source
    return not reads or "except Exception" in source


def probe() -> str | None:
    try:
        dispatcher = _target()
    except ImportError:
        return "this vLLM has no Triton kernel dispatcher"
    name = _scan(dispatcher)
    if name is None:
        return f"no {' / '.join(_SCANS)} in this vLLM"
    fn = getattr(dispatcher, name)
    if is_marked(fn):
        return "already applied"
    if scan_survives_proxies(inspect.getsource(fn)):
        return f"upstream {name} does not read module globals' __dict__ unguarded"
    return None


def apply() -> None:
    dispatcher = _target()
    name = _scan(dispatcher)
    orig = getattr(dispatcher, name)

    @wraps_marked(orig)
    def rebind(*args, **kwargs):
        import sys

        hidden: list[tuple[object, str, object]] = []
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not namespace:
                continue
            for attr, value in list(namespace.items()):
                try:
                    vars(value)
                except TypeError:  # no instance dict: the scan skips it too
                    pass
                except Exception:  # noqa: BLE001 - e.g. an unbound werkzeug LocalProxy
                    hidden.append((module, attr, value))
                    del namespace[attr]
        try:
            return orig(*args, **kwargs)
        finally:
            for module, attr, value in hidden:
                module.__dict__[attr] = value

    setattr(dispatcher, name, rebind)


PATCH = Patch(
    name="kernel_rebind_scan",
    covers="CPU Triton kernel rebind scan crashes on context-local proxies (Flask imported)",
    probe=probe,
    apply=apply,
)
