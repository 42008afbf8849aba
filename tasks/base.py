"""Task base class: transient infrastructure errors are retried with backoff.

A PostgreSQL restart or a broker hiccup is not the input's fault: the task waits and tries
again (exponential backoff with jitter) instead of failing the video.
"""

from __future__ import annotations

import logging

import redis.exceptions
import sqlalchemy.exc
from celery import Task

log = logging.getLogger(__name__)

TRANSIENT_ERRORS = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    redis.exceptions.ConnectionError,
    ConnectionError,
)


class VidloraTask(Task):
    autoretry_for = TRANSIENT_ERRORS
    retry_backoff = 2
    retry_backoff_max = 60
    retry_jitter = True
    max_retries = 12
    acks_late = True
    reject_on_worker_lost = True

    @property
    def is_first_delivery(self) -> bool:
        """False for Celery's own retries, which must not count against the attempt cap."""
        return not self.request.retries

    def before_start(self, task_id, args, kwargs):
        if self.request.retries:
            log.warning("%s retry %d for %s", self.name, self.request.retries, args)
            from vidlora.db import reset_engine

            reset_engine()  # drop pooled connections to a database that went away
