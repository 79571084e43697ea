#!/usr/bin/env bash
# System packages the test suite needs beyond the venv (a real Prometheus
# server for the telemetry tests).  Idempotent; quiet when already present.
set -euo pipefail
if ! command -v prometheus >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq >/dev/null 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 \
            || echo "warning: could not install prometheus; its tests will be skipped" >&2
    fi
fi
