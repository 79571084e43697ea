#!/usr/bin/env bash
# Serve a real Qwen3-Omni on three GPUs, as a user would: the thinker on
# GPUs 0 and 1 with tensor parallelism 2, the talker and Code2Wav sharing
# GPU 2 (docs/models.md, "Serving a model folder" and "Serving a real
# Qwen3-Omni": what each stage loads and the memory it needs).
#
#   API_KEY=... scripts/serve-qwen3-omni-gpus.sh /models/Qwen3-Omni-30B-A3B-Instruct [more omnix serve flags]
#
# HOST (0.0.0.0), PORT (8091), API_KEY (none), SERVED_NAME (qwen3-omni) and
# MAX_MODEL_LEN (32768) may be set in the environment.
#
# The folder decides the pipeline (thinker -> talker -> code2wav); vLLM's
# flags apply to the thinker (the one vLLM stage); --stage-devices places
# each stage (a worker sees its GPUs as CUDA_VISIBLE_DEVICES, numbered
# from 0).  Omnix never downloads: the folder must hold the checkpoint.
# Before any worker starts, omnix checks the GPUs exist and asks vLLM
# whether it takes the thinker's settings.  First, to see the pipeline:
#
#   omnix pipelines show --model /models/Qwen3-Omni-30B-A3B-Instruct
set -euo pipefail
MODEL=${1:?usage: $0 MODEL_FOLDER [omnix serve flags]}
shift
cd "$(dirname "$0")/.."
OMNIX=${OMNIX:-.venv/bin/omnix}
exec "$OMNIX" serve "$MODEL" \
    --host "${HOST:-0.0.0.0}" --port "${PORT:-8091}" \
    ${API_KEY:+--api-key "$API_KEY"} \
    --served-model-name "${SERVED_NAME:-qwen3-omni}" \
    --dtype bfloat16 --max-model-len "${MAX_MODEL_LEN:-32768}" \
    --tensor-parallel-size 2 --gpu-memory-utilization 0.9 \
    --stage-devices thinker=0,1 \
    --stage-devices talker=2 \
    --stage-devices code2wav=2 \
    "$@"
