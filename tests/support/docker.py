"""Is there a Docker engine to build and run images with? The tests that need one skip
without it, except in CI: .ci/run provides one (docker/ci/docker-tools.sh) and sets
VIDLORA_REQUIRE_STACK=1, which turns "no Docker here" from a skip into a failure."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def docker_ready(*, compose: bool = True) -> str | None:
    """None when Docker (and, with `compose`, the Compose v2 plugin) works; else why not."""
    if shutil.which("docker") is None:
        return "no docker command"
    if subprocess.run(["docker", "info"], capture_output=True).returncode:
        return "no Docker engine answering"
    if compose and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode:
        return "no Compose v2 plugin (docker/ci/docker-tools.sh installs it)"
    return None


def require_docker(*, compose: bool = True) -> None:
    why = docker_ready(compose=compose)
    if why:
        if os.environ.get("VIDLORA_REQUIRE_STACK") == "1":
            pytest.fail(f"VIDLORA_REQUIRE_STACK=1 but {why}")
        pytest.skip(why)
