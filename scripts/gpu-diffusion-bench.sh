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
exec "$(dirname "$0")/gpu-bench.sh" diffusion "$@"
