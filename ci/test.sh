#!/usr/bin/env bash
# Set up and pass the tests: lint, the unit suite on an editable install, then the install
# checks again on a regular (non-editable) install. This is the README's test command.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source ci/setup.sh
echo "== ruff"
ruff check .
ruff format --check .
echo "== tests (editable install)"
python -m pytest -q -n "${QUANTRT_TEST_WORKERS:-2}" tests
if grep -qw avx2 /proc/cpuinfo 2>/dev/null; then
  echo "== the AVX2 builds of the native CPU kernels (QUANTRT_CPU_ISA=avx2)"
  QUANTRT_CPU_ISA=avx2 python -m pytest -q -n "${QUANTRT_TEST_WORKERS:-2}" \
    tests/cpu/test_gguf_native.py tests/cpu/test_wint_native.py tests/cpu/test_lut_native.py tests/cpu/test_cpu_isa.py
fi
echo "== regular install"
python -m pip install -q --no-deps --no-build-isolation --force-reinstall "$ROOT"
(cd /tmp && python -m pytest -q -p no:cacheprovider "$ROOT/tests/core/test_install.py" "$ROOT/tests/core/test_cli.py")
python -m pip install -q --no-deps --no-build-isolation -e "$ROOT"
echo "== all green"
