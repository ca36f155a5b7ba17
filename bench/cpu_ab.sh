#!/usr/bin/env bash
# A/B benchmark of two trees on this CPU, rounds alternating so load from other work hits both:
# each tree installed in its own venv (BEFORE and AFTER are their pythons; native kernels build
# per install), `quantrt bench --device cpu --quick` and whole-model decode (`quantrt run --json` on
# a GGUF, three prompts) per round, then bench/compare_ab.py on the layer rows.
# Usage: bash bench/cpu_ab.sh BEFORE_PYTHON AFTER_PYTHON MODEL.gguf OUTDIR [ROUNDS=2] [THREADS=2]
# MODEL_DISABLE=name,... : QUANTRT_DISABLE_KERNELS for the model runs only (both sides)
set -euo pipefail
BEFORE="$1" AFTER="$2" MODEL="$3" OUT="$4" ROUNDS="${5:-2}" THREADS="${6:-2}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$OUT"
prompts=("The capital of France is" "def fibonacci(n):" "Quantization of neural networks")
for round in $(seq 1 "$ROUNDS"); do
  for side in before after; do
    py="$BEFORE"; [ "$side" = after ] && py="$AFTER"
    ( cd /tmp && OMP_NUM_THREADS="$THREADS" "$py" -m quantrt bench --device cpu --quick --threads "$THREADS" \
        --out "$OUT/$side-layers-$round.json" ) > /dev/null 2> "$OUT/$side-layers-$round.err"
    for p in "${prompts[@]}"; do
      ( cd /tmp && QUANTRT_DISABLE_KERNELS="${MODEL_DISABLE:-}" OMP_NUM_THREADS="$THREADS" "$py" -m quantrt run "$MODEL" --prompt "$p" --max-new-tokens 32 \
          --ignore-eos --dtype fp32 --quiet --json ) | "$py" -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))' \
        >> "$OUT/$side-model.jsonl"
    done
  done
done
"$AFTER" "$ROOT/bench/compare_ab.py" --before "$OUT"/before-layers-*.json --after "$OUT"/after-layers-*.json \
  --out "$OUT/ab-layers.json" --markdown "$OUT/ab-layers.md" | tail -n 1
