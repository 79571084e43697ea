#!/usr/bin/env bash
# What the test suite needs beyond the venv: a real Prometheus server for
# the telemetry tests, Chromium for the playground's browser tests
# (Debian's package; Playwright drives it, downloading no browser), and the
# Qwen3-TTS reference's own environment.  Idempotent; quiet when already
# present.
set -euo pipefail
missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing+=(chromium)
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq >/dev/null 2>&1 || true
        for pkg in "${missing[@]}"; do
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null 2>&1 \
                || echo "warning: could not install $pkg; its tests will be skipped" >&2
        done
    else
        echo "warning: ${missing[*]} missing (install as root: apt-get install ${missing[*]}); their tests will be skipped" >&2
    fi
fi
# The Qwen3-TTS reference (qwen-tts in .venv-ref, beside .venv: it pins
# transformers 4.57.3); a few minutes the first time.  Should it fail, the
# reference tests say so (and fail under OMNIX_REQUIRE_ALL=1).
bash scripts/reference-env.sh \
    || echo "warning: could not build the Qwen3-TTS reference environment (scripts/reference-env.sh)" >&2
