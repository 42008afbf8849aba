#!/usr/bin/env bash
# LLaMA-Factory's own environment, for the CI check that its dataset loading turns an export
# into the engine's prompt tokens (tests/vidlora/feedback/test_llamafactory.py).
# LLaMA-Factory 0.9.5 pins transformers <= 5.6.0 while the engine runs a newer one, so it gets a
# venv of its own: requirements/llamafactory.txt (hashed, no resolution at install time) over
# .venv's packages for the rest (torch, numpy, pillow, pyarrow): a .pth file puts .venv's
# site-packages after its own on sys.path, so its own versions win.
set -euo pipefail
cd "$(dirname "$0")/.."
MAIN=${VIDLORA_VENV:-.venv}
VENV=${VIDLORA_LLAMAFACTORY_VENV:-.venv-llamafactory}
STAMP="$VENV/.vidlora-installed"
REQ_HASH=$(cat requirements/llamafactory.txt scripts/install-llamafactory.sh | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$REQ_HASH" ]; then
  exit 0
fi
rm -rf "$VENV"
"$MAIN/bin/python" -m venv "$VENV"  # .venv's Python, so .venv's compiled packages load
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
unset PIP_FIND_LINKS PIP_CONSTRAINT || true
"$VENV/bin/python" -m pip install -q --require-hashes --no-deps -r requirements/llamafactory.txt
site() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
(cd "$(site "$MAIN")" && pwd) > "$(site "$VENV")/zz-vidlora-venv.pth"
echo "$REQ_HASH" > "$STAMP"
