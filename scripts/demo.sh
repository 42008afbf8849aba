#!/usr/bin/env bash
# The main job: install, build the tiny model, run the sample videos through every scenario
# on an embedded database and queue, print a summary and serve the review UI on localhost.
# Set VIDLORA_DATABASE_URL / VIDLORA_BROKER_URL / VIDLORA_MODEL / VIDLORA_ADAPTER_ROOT to run
# the same job against PostgreSQL, Redis and real weights.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
exec .venv/bin/python -m cli demo "$@"
