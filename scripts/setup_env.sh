#!/usr/bin/env bash
# Builds the project's virtual environment on a fresh machine: CPU torch 2.13.0
# held by constraints.txt, then this package (editable) with its dev extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

echo "[setup] creating $VENV with $($PYTHON --version)"
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)
export PIP_CONSTRAINT="$PWD/constraints.txt"
"${PIP[@]}" install -q --upgrade pip setuptools wheel
echo "[setup] installing torch (CPU build, pinned by constraints.txt)"
"${PIP[@]}" install -q "torch==2.13.0"
echo "[setup] installing scout-sglang (editable) with dev extras"
"${PIP[@]}" install -q -e ".[dev]"
"$VENV/bin/python" -P -c "import torch, scout_sglang; print('[setup] torch', torch.__version__, '| scout_sglang', scout_sglang.__version__)"
