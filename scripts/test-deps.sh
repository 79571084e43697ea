#!/usr/bin/env bash
# What the test suite needs beyond the venv: a real Prometheus server for
# the telemetry tests, and the Qwen3-TTS reference's own environment.
# Idempotent; quiet when already present.
set -euo pipefail
if ! command -v prometheus >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq >/dev/null 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 \
            || echo "warning: could not install prometheus; its tests will be skipped" >&2
    fi
fi
# The Qwen3-TTS reference (qwen-tts in .venv-ref, beside .venv: it pins
# transformers 4.57.3); a few minutes the first time.  Should it fail, the
# reference tests say so (and fail under OMNIX_REQUIRE_ALL=1).
bash scripts/reference-env.sh \
    || echo "warning: could not build the Qwen3-TTS reference environment (scripts/reference-env.sh)" >&2
