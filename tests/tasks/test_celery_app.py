"""tasks.celery_app.run_worker: a worker's exit code reaches the process that supervises it."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.env import ROOT

# A real worker on the test broker whose first act once ready is to stop itself with code 3,
# as Celery does (with 1) after an "Unrecoverable error" such as kombu's during a Redis restart.
STOPS_ITSELF = """
import sys
from celery import signals
from tasks.celery_app import CONTROL_QUEUE, run_worker

@signals.worker_ready.connect
def _stop(sender, **_):
    sender.controller.stop(exitcode=3)

sys.exit(run_worker(["worker", "--pool=solo", "-Q", CONTROL_QUEUE, "-n", "exitcode-probe@%h",
                     "--without-gossip", "--without-mingle", "--loglevel=WARNING"]))
"""


def test_a_worker_that_stops_on_an_error_exits_non_zero(broker):
    done = subprocess.run([sys.executable, "-c", STOPS_ITSELF], cwd=ROOT, env=dict(os.environ),
                          capture_output=True, text=True, timeout=120)
    # app.worker_main would have returned normally: exit 0, and systemd's Restart=on-failure
    # would leave the worker down.
    assert done.returncode == 3, done.stdout + done.stderr
