#!/usr/bin/env bash
# On the GPU machine: sweep the tensor-core kernel's launch rows for the codes and M buckets given,
# merge each sweep into the tree's tuning table bucket by bucket (ci/codebook_rows.py), then run the
# kernels' GPU tests on the merged table and time the swept schemes at the swept M beside cuBLAS.
# Writes to $OUT: tune-<key>.json / .log per sweep, the merged table, rows-bench.json; commit the
# table (and the files under bench/results/) only where the bench shows the new rows faster.
#
#   ROWS="w4a16-nvfp4:small_m_codebook:128 gguf-q6_k:small_m_q6k:128:cuda.mma_gguf_blocks" bash ci/gpu_rows.sh
#
# Each item is SCHEME:KEY:BUCKETS[:KERNEL] (KERNEL: a QUANTRT_KERNEL override, for types whose
# default kernel is another). The default list is issue 26's open sweeps: M=128 for every format
# other than int4 (which has its row), and w2 g64 at M=1. SWEEP_ONLY=1 stops after the sweeps and
# merges (a list too long for one call runs in parts; the last part runs the tests and the bench).
set -uo pipefail
# shellcheck source=ci/gpu-install.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-install.sh" || exit 1
ROWS="${ROWS:-w4a16-nvfp4:small_m_codebook:128 w4a16-nf4-g64:small_m_bnb4:128 w8a16-int-ch-sym:small_m_w8:128 gguf-q4_k:small_m_q4k:128 gguf-q8_0:small_m_q80:128 gguf-q5_k:small_m_q5k:128 w2a16-int-g64-sym:small_m_w2:1}"
SHAPES="${SHAPES:-8192x57344,28672x8192,4096x28672}"
SWEEP_S="${SWEEP_S:-240}"
arch=$(python3 -c "import torch; print('sm_%d%d' % torch.cuda.get_device_capability())")
T="backends/cuda/tunings/wna16_mma_${arch}.json"
[ -f "$T" ] || { echo "no committed table $T for this GPU"; exit 1; }
schemes=() ms=()
for item in $ROWS; do
  IFS=: read -r scheme key buckets kernel <<< "$item"
  s=$(date +%s)
  QUANTRT_KERNEL="${kernel:-}" timeout "$SWEEP_S" python3 ci/tune_wna16_mma.py --scheme "$scheme" \
    --buckets "$buckets" --shapes "$SHAPES" --out "$OUT/tune-$key.json" > "$OUT/tune-$key.log" 2>&1
  echo "$scheme -> $key (M $buckets) rc=$? $(( $(date +%s) - s )) s: $(tail -n 1 "$OUT/tune-$key.log" | cut -c1-300)"
  [ -s "$OUT/tune-$key.json" ] && python3 ci/codebook_rows.py "$OUT/tune-$key.json" "$T" "$key" > /dev/null
  schemes+=("$scheme") ms+=("${buckets//,/ }")
done
cp "$T" "$OUT/"
[ "${SWEEP_ONLY:-0}" = 1 ] && exit 0
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_cuda_kernels.py tests/gpu/test_cuda_lut_gguf.py \
  -k "mma" 2>&1 | tail -n 3
M=$(printf '%s\n' ${ms[@]} | sort -n -u | paste -sd, -)
timeout 300 quantrt bench --schemes "$(IFS=,; echo "${schemes[*]}")" --shapes "$SHAPES" --ms "$M" \
  --out "$OUT/rows-bench.json" 2>&1 | tail -n 20
