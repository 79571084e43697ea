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
exec "$(dirname "$0")/gpu-bench.sh" duplex "$@"
