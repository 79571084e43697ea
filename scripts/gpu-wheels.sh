#!/usr/bin/env bash
# The wheels a GPU machine with torch but no package registry lacks for the
# speech stages' bench and CUDA tests (docs/bench.md, "The speech stages on
# a GPU") and the diffusion bench at published sizes ("Diffusion at a
# published size on a GPU"): msgspec, this .venv's transformers and
# diffusers (pure Python; their other needs, huggingface-hub, safetensors,
# tokenizers, regex, Pillow, accelerate, are on such a machine), pytest and
# its plugins, and py-spy (to see where a step's host time goes), for that
# machine's Python.
#
#   scripts/gpu-wheels.sh [DIR [PYTHON_VERSION]]      # default .device/wheels 3.12
#   WHEELS=DIR scripts/gpu-speech-bench.sh --json     # then, on the GPU machine
#   WHEELS=DIR scripts/gpu-diffusion-bench.sh --json
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.device/wheels}
PY=${2:-3.12}
mkdir -p "$DIR"
TRANSFORMERS=$(.venv/bin/python -c "import transformers; print(transformers.__version__)")
DIFFUSERS=$(.venv/bin/python -c "import diffusers; print(diffusers.__version__)")
.venv/bin/pip download -q --no-deps --only-binary=:all: --dest "$DIR" --python-version "$PY" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
    msgspec "transformers==$TRANSFORMERS" "diffusers==$DIFFUSERS" pytest pluggy iniconfig pytest-asyncio py-spy
ls "$DIR"
