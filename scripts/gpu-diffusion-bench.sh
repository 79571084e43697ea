#!/usr/bin/env bash
# The diffusion cache table at a published size on a GPU machine that has
# torch with CUDA but no package registry (docs/bench.md, "Diffusion at a
# published size on a GPU"): installs the wheels carried in WHEELS (diffusers,
# transformers, msgspec; scripts/gpu-wheels.sh downloads them) into a private
# folder, then runs `omnix bench diffusion --device cuda --sizes real` from
# the diffusion bench's own parser (`omnix bench` imports every bench, and
# some need packages such a machine lacks).  Later flags win:
#
#   WHEELS=.device/wheels scripts/gpu-diffusion-bench.sh --json            # Wan 2.1 1.3B
#   WHEELS=.device/wheels scripts/gpu-diffusion-bench.sh --model flux.1-dev --json
#   scripts/gpu-diffusion-bench.sh --device cpu --sizes tiny --compile off  # seconds, no GPU
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-.device/wheels}
SITE=${SITE:-/tmp/omnix-site}
PYTHON=${PYTHON:-python}
shopt -s nullglob
wheels=("$WHEELS"/*.whl)
if [ ${#wheels[@]} -gt 0 ]; then
    # One stamp per set of wheels: a site another script filled from fewer
    # (the speech bench's, before diffusers was carried) is filled again.
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

from omnix.bench import diffusion

parser = argparse.ArgumentParser(prog="gpu-diffusion-bench")
parser.add_argument("--json", action="store_true")
diffusion.add_arguments(parser)
args = parser.parse_args(["--device", "cuda", "--sizes", "real", *sys.argv[1:]])
sys.exit(diffusion.run(args))
PY
