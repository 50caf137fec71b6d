#!/usr/bin/env bash
# Makes the project's Python environment, .venv, with the pinned packages of
# scripts/python-requirements.txt (PyTorch 2 and Hugging Face transformers,
# for the tests that load Tessera's exports into transformers). Idempotent:
# a .venv whose pins match is left alone. The build does not need it; the
# lit tests that do are marked REQUIRES: transformers and report
# UNSUPPORTED without it.
set -euo pipefail
cd "$(dirname "$0")/.."
req=scripts/python-requirements.txt
stamp=.venv/.requirements
if [[ -x .venv/bin/python ]] && cmp -s "$req" "$stamp"; then
  exit 0
fi
python=$(command -v python3.11 || command -v python3)
"$python" -m venv .venv
.venv/bin/pip install --quiet --upgrade-strategy only-if-needed -r "$req"
cp "$req" "$stamp"
.venv/bin/python -c "import torch, transformers, safetensors, onnxruntime; print('python env:', 'torch', torch.__version__, 'transformers', transformers.__version__, 'onnxruntime', onnxruntime.__version__)"
