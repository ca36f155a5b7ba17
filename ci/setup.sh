#!/usr/bin/env bash
# Create (or reuse) a virtual environment with quantrt installed for development.
# Usage: source ci/setup.sh   (sets VENV and activates it)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${QUANTRT_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
# torch first, pinned to a CPU-capable release the requirement admits: a bare `torch` could pull a
# several-GB CUDA build. On the project's CI machines 2.13.0 is a CPU build on local disk.
python -m pip install -q "torch==${QUANTRT_TORCH:-2.13.0}"
python -m pip install -q -e "$ROOT[dev,triton]"
