#!/usr/bin/env bash
# The reference environment: a venv of its own (.venv-ref, or
# $OMNIX_REFERENCE_ENV) with qwen-tts 0.1.1, the reference omnix's
# Qwen3-TTS is held equal to (tests/engines/test_qwen3_tts.py runs it as a
# subprocess).  It cannot live in .venv: qwen-tts pins transformers==4.57.3,
# omnix's vLLM needs >= 5.16.  Idempotent; quiet when already built.
#
# torch: the very build .venv has (same numerics).  qwen-tts's requirements
# are installed from its pins by hand, less gradio (its web demo's, a large
# tree the library never imports).  torchaudio: qwen-tts imports it (its
# 25 Hz tokenizer's fbank, pure Python), and torchaudio ships compiled ops
# built for one torch release; PyPI has none for every torch (no 2.13 for
# torch 2.13), so where the matching release is missing the newest one is
# installed and its compiled libraries, which would fail to load beside
# this torch, are removed: torchaudio then imports as Python alone.
set -euo pipefail
cd "$(dirname "$0")/.."
REF=${OMNIX_REFERENCE_ENV:-.venv-ref}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
QWEN_TTS=qwen-tts==0.1.1
# qwen-tts 0.1.1's own pins and requirements (its METADATA), less gradio.
REF_DEPS=(transformers==4.57.3 accelerate==1.12.0 librosa soundfile sox onnxruntime einops)

[ -x .venv/bin/python ] || bash scripts/setup.sh
TORCH=$(.venv/bin/python -c "import torch; print(torch.__version__)")
STAMP="$REF/.omnix-reference"
HASH=$( (cat scripts/reference-env.sh; echo "$TORCH") | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$HASH" ]; then
    exit 0
fi
START=$(date +%s)
rm -rf "$REF"
"$PY" -m venv "$REF"
PIP=("$REF/bin/python" -m pip install -q --disable-pip-version-check)
"${PIP[@]}" "torch==$TORCH"
"${PIP[@]}" --no-deps "$QWEN_TTS"
if ! "${PIP[@]}" --no-deps "torchaudio==${TORCH%%+*}" 2>/dev/null; then
    "${PIP[@]}" --no-deps torchaudio
    LIB=$("$REF/bin/python" -c "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('torchaudio').origin).parent / 'lib')")
    rm -f "$LIB"/*.so
fi
# pip notes that gradio (not installed, on purpose) is missing.
"${PIP[@]}" "${REF_DEPS[@]}" "torch==$TORCH"
# qwen-tts prints a notice about the sox binary (its 25 Hz path's) on import.
if ! OUT=$("$REF/bin/python" -c "import qwen_tts, torch, transformers; assert torch.__version__ == '$TORCH', torch.__version__; assert transformers.__version__ == '4.57.3'" 2>&1); then
    echo "$OUT" >&2
    exit 1
fi
echo "$HASH" > "$STAMP"
echo "reference environment $REF (qwen-tts 0.1.1, torch $TORCH) built in $(( $(date +%s) - START )) s" >&2
