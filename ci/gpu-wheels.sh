#!/usr/bin/env bash
# Fetch, on a machine with pip access, the wheels the offline GPU machine lacks (Python 3.12,
# x86-64) into .whl/ (ignored through .git/info/exclude); ci/gpu.sh installs whatever .whl/ holds.
# The H200 image has no gguf (read by the GGUF tests and transformers' GGUF path) and no pydantic
# (quantrt's config schemas). Usage: bash ci/gpu-wheels.sh, then name .whl in the device's carry.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
py=${PYTHON:-python3}
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
# versions this tree is tested with here; pydantic pins its pydantic-core exactly
for req in gguf==0.19.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
  typing-inspection==0.4.5 typing-extensions==4.16.0; do
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" -d .whl "$req"
done
ls .whl
