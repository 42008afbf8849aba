"""The Celery application: queues, delivery guarantees, time limits.

Two queues with different process models:
- ``cpu``: ingest, prepare, dispatch, reconcile. Prefork children with hard time limits, so
  a decoder hung in native code is killed and the task redelivered.
- ``gpu``: analysis batches. Solo pool, one process per GPU holding one vLLM engine; each
  GPU worker also consumes its own ``gpu.<worker>`` queue so the dispatcher can send a batch
  to a worker that already holds the adapter.

The app is built by ``get_app()`` (a factory, as in Flask's Celery pattern), never at import.

Delivery is at-least-once (acks late, requeue on worker loss); the database makes it
effectively-once (unique keys, idempotent writes, an attempt cap kept in PostgreSQL).
"""

from __future__ import annotations

from functools import cache

from celery import Celery
from kombu import Queue

from vidlora.config import Settings, get_settings

CPU_QUEUE = "cpu"
# Dispatch and reconcile are short and must not wait behind a bulk upload's thousands of
# prepare messages, or the GPU idles while frames are ready: they get a queue of their own,
# consumed by the same CPU workers.
CONTROL_QUEUE = "control"
GPU_QUEUE = "gpu"


def worker_queue(worker_name: str) -> str:
    return f"{GPU_QUEUE}.{worker_name}"


def _transport_options(settings: Settings) -> dict:
    # Redis re-delivers an unacknowledged message after the visibility timeout; the embedded
    # SQLAlchemy transport passes its options to create_engine, so it gets none.
    if settings.broker_url.startswith(("redis://", "rediss://")):
        return {"visibility_timeout": settings.visibility_timeout_s}
    return {}


def make_celery(settings: Settings) -> Celery:
    app = Celery("vidlora", broker=settings.broker_url, include=[
        "tasks.ingest", "tasks.prepare", "tasks.dispatch", "tasks.analyze", "tasks.reconcile",
    ])
    app.conf.update(
        task_ignore_result=True,  # the database is the record, not a result backend
        task_serializer="json",
        accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=CPU_QUEUE,
        task_queues=[Queue(CPU_QUEUE), Queue(CONTROL_QUEUE), Queue(GPU_QUEUE)],
        task_routes={
            "tasks.analyze.*": {"queue": GPU_QUEUE},
            "tasks.dispatch.*": {"queue": CONTROL_QUEUE},
            "tasks.reconcile.*": {"queue": CONTROL_QUEUE},
            "tasks.*": {"queue": CPU_QUEUE},
        },
        task_soft_time_limit=settings.cpu_soft_time_limit_s,
        task_time_limit=settings.cpu_time_limit_s,
        broker_transport_options=_transport_options(settings),
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        worker_hijack_root_logger=False,
        worker_send_task_events=True,
        task_send_sent_event=True,
        enable_utc=True,
        # The task name is tasks.messages.RECONCILE (not imported: messages imports this app).
        beat_schedule={
            "reconcile": {"task": "tasks.reconcile.reconcile", "schedule": settings.reconcile_every_s},
        },
    )
    return app


@cache
def get_app() -> Celery:
    """This process's Celery app, built from the settings on first use, not at import.

    Task modules declare their tasks with ``shared_task``, which binds to the default app, so
    importing a task module (or the message names) builds nothing and connects nowhere; the
    composition root (``vidlora worker``, the web app, the CLI) is what first asks for it.
    """
    app = make_celery(get_settings())
    app.set_default()
    return app


def __getattr__(name: str):
    # `celery -A tasks.celery_app:app ...` (compose's beat, operators' inspect/purge) asks for
    # an `app` attribute: build it then, not at import.
    if name == "app":
        return get_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run_worker(argv: list[str]) -> int:
    """Run ``celery worker`` in this process and return its exit code.

    ``app.worker_main`` drops the code: a worker that stopped on an "Unrecoverable error"
    (kombu can raise one while Redis restarts) would exit 0, and a supervisor that restarts
    only failed processes (systemd ``Restart=on-failure``) would leave it down.
    """
    from celery.bin.celery import celery as celery_command

    if "worker" not in argv:
        raise ValueError("argv must hold the worker sub-command")
    celery_command.params[0].default = get_app()  # what app.start() does to run a command for this app
    try:
        code = celery_command.main(args=argv, standalone_mode=False)
    finally:
        celery_command.params[0].default = None
    return code if isinstance(code, int) else 0
