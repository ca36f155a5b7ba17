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
# GPTQModel reads quantrt's GPTQ/AWQ files in tests/writers/test_gptqmodel_reader.py. Its requirements
# pin a newer torch and numpy than the CPU CI runs, and its readers need none of that: it and the
# modules it imports go in without their pins.
python -m pip install -q --no-deps "gptqmodel==7.7.0" "pypcre==0.6.4" "logbar==0.4.15" "device-smi==0.5.7" \
  "tokenicer==0.0.14" "defuser==0.0.28" "threadpoolctl>=3.5" "pillow>=11"
# The NEON build of the native CPU kernels is cross-compiled and run under qemu-aarch64 user emulation
# (tests/cpu/test_neon_qemu.py): Debian's cross compiler and qemu-user, where apt and root are here.
# QUANTRT_NEON_TESTS=1 then makes those tests fail, not skip, if the tools are missing.
if command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null; then
  export QUANTRT_NEON_TESTS=1
elif command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  if apt-get install -y -q --no-install-recommends g++-aarch64-linux-gnu qemu-user >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null 2>&1 &&
      apt-get install -y -q --no-install-recommends g++-aarch64-linux-gnu qemu-user >/dev/null 2>&1; }; then
    export QUANTRT_NEON_TESTS=1
  else
    echo "ci/setup.sh: could not install g++-aarch64-linux-gnu and qemu-user; the NEON tests will skip" >&2
  fi
fi
