"""vLLM's CPU platform rebinds Triton kernels by scanning every loaded module's globals and
calling ``hasattr(value, "__dict__")`` on each. A context-local proxy (Flask's
``current_app``, werkzeug ``LocalProxy``) raises RuntimeError there instead of
AttributeError, so building an engine in any process that has imported Flask fails with
"Working outside of application context". The patch makes the scan skip values whose
attribute lookup raises, exactly as ``hasattr`` would for a missing attribute.
"""
from __future__ import annotations

import inspect

from .base import Patch, is_marked, wraps_marked


def _target():
    from vllm.triton_utils import dispatcher

    return dispatcher


def probe() -> str | None:
    try:
        dispatcher = _target()
    except ImportError:
        return "this vLLM has no Triton kernel dispatcher"
    fn = getattr(dispatcher, "_rebind_kernels", None)
    if fn is None:
        return "no _rebind_kernels in this vLLM"
    if is_marked(fn):
        return "already applied"
    if 'hasattr(value, "__dict__")' not in inspect.getsource(fn):
        return "upstream scan does not call hasattr on module globals"
    return None


def apply() -> None:
    dispatcher = _target()
    orig = dispatcher._rebind_kernels

    @wraps_marked(orig)
    def _rebind_kernels(overrides):
        import sys

        hidden: list[tuple[object, str, object]] = []
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not namespace:
                continue
            for attr, value in list(namespace.items()):
                try:
                    hasattr(value, "__dict__")
                except Exception:  # noqa: BLE001 - e.g. an unbound werkzeug LocalProxy
                    hidden.append((module, attr, value))
                    del namespace[attr]
        try:
            return orig(overrides)
        finally:
            for module, attr, value in hidden:
                module.__dict__[attr] = value

    dispatcher._rebind_kernels = _rebind_kernels


PATCH = Patch(
    name="kernel_rebind_scan",
    covers="CPU Triton kernel rebind scan crashes on context-local proxies (Flask imported)",
    probe=probe,
    apply=apply,
)
