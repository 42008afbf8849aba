#!/usr/bin/env bash
# Run the test suite: installs the environment if needed, builds the tiny model, runs pytest.
# Needs PostgreSQL and Redis on 127.0.0.1 (VIDLORA_TEST_PG / VIDLORA_TEST_REDIS to change).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
./scripts/install-llamafactory.sh  # LLaMA-Factory's own venv, for its recipe's check
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}
.venv/bin/python -m testmodels.tiny --out var/tiny-model
exec .venv/bin/python -m pytest "$@"
