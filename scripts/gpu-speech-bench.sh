#!/usr/bin/env bash
# The speech stages at Qwen3-Omni's published sizes on a GPU machine that has
# torch with CUDA but no package registry (docs/bench.md, "The speech stages
# on a GPU"): installs the wheels carried in WHEELS (msgspec, transformers
# 5.19; pytest too for tests/engines/test_talker_cuda.py) into a private
# folder, then runs `omnix bench speech --device cuda --sizes real` from the
# speech bench's own parser (`omnix bench` imports every bench, and some need
# packages such a machine lacks).
#
#   WHEELS=.device/wheels scripts/gpu-speech-bench.sh --runs 3 --json
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-.device/wheels}
SITE=${SITE:-/tmp/omnix-site}
if [ ! -f "$SITE/.done" ]; then
    python -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl
    touch "$SITE/.done"
fi
export PYTHONPATH="$SITE:$PWD" HF_HUB_OFFLINE=1
exec python - "$@" <<'PY'
import argparse
import logging
import sys

from omnix.bench import speech

# The talker's "batch N ready in X s" lines: compiling takes minutes.
logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
logging.getLogger("omnix").setLevel(logging.INFO)

parser = argparse.ArgumentParser(prog="gpu-speech-bench")
parser.add_argument("--json", action="store_true")
speech.add_arguments(parser)
args = parser.parse_args(["--device", "cuda", "--sizes", "real", *sys.argv[1:]])
sys.exit(speech.run(args))
PY
