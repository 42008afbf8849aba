"""The GPU worker process's engine, built once at worker start and used by every task.

CUDA and vLLM do not survive a fork, so the GPU worker is a solo-pool Celery worker: tasks
run in this same process, and the engine built before the worker starts consuming is the
one they use. A task arriving in a process without an engine (a misrouted message on a CPU
worker) fails loudly instead of building a second engine.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workers.engine_host import EngineHost

_host: "EngineHost | None" = None
_stream = None  # tasks.gpu_stream.StreamRunner in streaming mode
_name: str | None = None
_on_batch = []


class NoEngineHere(RuntimeError):
    pass


def default_worker_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def install(host: "EngineHost", name: str) -> None:
    global _host, _name
    _host, _name = host, name


def install_stream(runner) -> None:
    """Streaming mode: analysis tasks hand their work to this engine thread."""
    global _stream
    _stream = runner


def get_stream():
    """The engine thread analysis tasks hand work to, or None in batch mode."""
    return _stream


def get_host() -> "EngineHost":
    if _host is None:
        raise NoEngineHere("analysis task delivered to a process without an engine (not a GPU worker)")
    return _host


def worker_name() -> str:
    return _name or default_worker_name()


def on_batch(callback) -> None:
    """Register a callback run after every batch (the registry refreshes its heartbeat row)."""
    _on_batch.append(callback)


def after_batch() -> None:
    for callback in _on_batch:
        callback()
