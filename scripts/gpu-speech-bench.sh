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
exec "$(dirname "$0")/gpu-bench.sh" speech "$@"
