"""Browser fixtures: the real pipeline (cpu + gpu workers on the tiny model), the web app
served from a thread on a free port, a reviewer account, and headless Debian Chromium.

Chromium is the system one (/usr/bin/chromium, or VIDLORA_CHROMIUM): Playwright's own
browser download is never used, so the test runs where only the distribution package is.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.env import ROOT
from tests.support.web import BROWSER_PASSWORD as PASSWORD, BROWSER_REVIEWER as REVIEWER
from tests.support.workers import free_port, module_gpu_worker

CHROMIUM = os.environ.get("VIDLORA_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


@pytest.fixture(scope="session")
def screenshots(artifacts_dir) -> Path:
    path = artifacts_dir / "browser"
    path.mkdir(parents=True, exist_ok=True)
    return path


gpu_worker = module_gpu_worker("browser-gpu-0")


@pytest.fixture(scope="module")
def live_server(database, broker) -> Iterator[str]:
    """The real app (not the test client) behind a threaded werkzeug server."""
    from werkzeug.serving import make_server

    from web import create_app

    app = create_app({"TESTING": True, "SECRET_KEY": "browser-test-secret", "POLL_INTERVAL_MS": 1000})
    port = free_port()
    server = make_server("127.0.0.1", port, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="live-server", daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    server.shutdown()
    thread.join(timeout=10)


@pytest.fixture(scope="session")
def reviewer(database) -> tuple[str, str]:
    """Created the way an administrator does it: `vidlora user create NAME --password-stdin`."""
    done = subprocess.run(
        [sys.executable, "-m", "cli", "user", "create", REVIEWER, "--password-stdin"],
        input=PASSWORD + "\n", text=True, capture_output=True, cwd=ROOT, env=dict(os.environ), timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return REVIEWER, PASSWORD


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()
