#!/usr/bin/env bash
# Set up and run the main job on the embedded default: quantize a llama-sized model in every
# scheme that has a native kernel on this machine, dispatch, run and check it against the reference.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/ci/setup.sh"
quantrt probe
quantrt run "$@"
