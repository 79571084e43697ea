#!/usr/bin/env bash
# One of omnix's GPU benches on a machine that has torch with CUDA but no
# package registry (docs/bench.md): installs the wheels carried in WHEELS
# (scripts/gpu-wheels.sh downloads them) into a private folder, SITE, then
# runs `omnix bench BENCH --device cuda --sizes real` from that bench's own
# parser (`omnix bench` imports every bench to build its help, and some need
# packages such a machine lacks).  Later flags win:
#
#   WHEELS=.device/wheels scripts/gpu-bench.sh speech|diffusion|duplex|tts --json
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=${1:?give the bench: speech, diffusion, duplex or tts}
shift
WHEELS=${WHEELS:-.device/wheels}
SITE=${SITE:-/tmp/omnix-site}
PYTHON=${PYTHON:-python}
shopt -s nullglob
wheels=("$WHEELS"/*.whl)
if [ ${#wheels[@]} -gt 0 ]; then
    # One stamp per set of wheels: a site filled from fewer (before another
    # wheel was carried) is filled again.
    stamp="$SITE/.done-$(printf '%s\n' "${wheels[@]##*/}" | sha1sum | cut -c1-12)"
    if [ ! -f "$stamp" ]; then
        "$PYTHON" -m pip install -q --no-index --no-deps --upgrade --target "$SITE" "${wheels[@]}"
        touch "$stamp"
    fi
fi
export PYTHONPATH="$SITE:$PWD" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
exec "$PYTHON" - "$BENCH" "$@" <<'PY'
import argparse
import importlib
import logging
import sys

bench = sys.argv[1]
module = importlib.import_module(f"omnix.bench.{bench}")

# The engines' progress lines (a talker's "batch N ready in X s": compiling takes minutes).
logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
logging.getLogger("omnix").setLevel(logging.INFO)

parser = argparse.ArgumentParser(prog=f"gpu-bench.sh {bench}")
parser.add_argument("--json", action="store_true")
module.add_arguments(parser)
args = parser.parse_args(["--device", "cuda", "--sizes", "real", *sys.argv[2:]])
sys.exit(module.run(args))
PY
