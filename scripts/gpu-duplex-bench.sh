#!/usr/bin/env bash
# Full duplex at Moshi's published size on a GPU machine that has torch with
# CUDA but no package registry (docs/bench.md, "Full duplex on a GPU"):
# installs the wheels carried in WHEELS (msgspec, transformers 5.19;
# scripts/gpu-wheels.sh downloads them) into a private folder, then runs
# `omnix bench duplex --device cuda --sizes real` from the duplex bench's own
# parser (`omnix bench` imports every bench, and some need packages such a
# machine lacks; this path imports torch, transformers, numpy and msgspec
# only).  The engine's tick alone: random bf16 weights built on the card
# (~16 GB), 1, 2, 4... sessions batched until the p99 tick passes 80 ms.
# Later flags win:
#
#   WHEELS=.device/wheels scripts/gpu-duplex-bench.sh --json
#   scripts/gpu-duplex-bench.sh --device cpu --sizes tiny --levels 1,2 --context-frames 8  # no GPU
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-.device/wheels}
SITE=${SITE:-/tmp/omnix-site}
PYTHON=${PYTHON:-python}
shopt -s nullglob
wheels=("$WHEELS"/*.whl)
if [ ${#wheels[@]} -gt 0 ]; then
    # One stamp per set of wheels (as gpu-diffusion-bench.sh).
    stamp="$SITE/.done-$(printf '%s\n' "${wheels[@]##*/}" | sha1sum | cut -c1-12)"
    if [ ! -f "$stamp" ]; then
        "$PYTHON" -m pip install -q --no-index --no-deps --upgrade --target "$SITE" "${wheels[@]}"
        touch "$stamp"
    fi
fi
export PYTHONPATH="$SITE:$PWD" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
exec "$PYTHON" - "$@" <<'PY'
import argparse
import sys

from omnix.bench import duplex

parser = argparse.ArgumentParser(prog="gpu-duplex-bench")
parser.add_argument("--json", action="store_true")
duplex.add_arguments(parser)
args = parser.parse_args(["--device", "cuda", "--sizes", "real", *sys.argv[1:]])
sys.exit(duplex.run(args))
PY
