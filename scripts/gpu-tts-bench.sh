#!/usr/bin/env bash
# Qwen3-TTS's stages at the published 12Hz-1.7B sizes on a GPU machine that
# has torch with CUDA but no package registry (docs/bench.md, "Qwen3-TTS on
# a GPU"): installs the wheels carried in WHEELS (msgspec, transformers 5.19;
# scripts/gpu-wheels.sh downloads them) into a private folder, then runs
# `omnix bench tts --device cuda --sizes real` from the TTS bench's own
# parser.  The CustomVoice folder is built on the card once (random bf16
# weights, ~4 GB on disk) into --build-dir.  Later flags win:
#
#   WHEELS=.device/wheels scripts/gpu-tts-bench.sh --json                  # c = 1, 16, 64
#   scripts/gpu-tts-bench.sh --device cpu --sizes tiny --levels 1,2       # seconds, no GPU
exec "$(dirname "$0")/gpu-bench.sh" tts "$@"
