#!/usr/bin/env bash
# On a GPU machine without network access (the lent H200): install quantrt from this tree,
# record the probe, run the GPU tests (tests/gpu and the Triton kernels at full speed), the
# quick benchmark and the embedded default, and leave everything in $OUT.
# The wheels the image lacks come from bash ci/gpu-wheels.sh (run here, then carry .whl).
# Usage (device tool): bash ci/gpu.sh            (bench off: QUANTRT_GPU_BENCH=0; sweep the CUDA
# W4A16 launch shapes first and use them: QUANTRT_GPU_TUNE=1; the Triton W8A8 tiles:
# QUANTRT_GPU_TUNE_W8A8=1; the FP4/NF4 and GGUF kernels: QUANTRT_GPU_TUNE_LUT=1; the CUDA GGUF GEMV:
# QUANTRT_GPU_TUNE_GGUF_GEMV=1; the MoE bench (bench/gpu_moe.py): QUANTRT_GPU_MOE_BENCH=1; the KV-cache
# benches (bench/gpu_kv.py, bench/gpu_model.py --kv-caches): QUANTRT_GPU_KV_BENCH=1; the 8B quantize-at-load
# bench: QUANTRT_GPU_LOAD_BENCH=1 (with cProfile: QUANTRT_LOAD_PROFILE=1); bench schemes:
# QUANTRT_BENCH_SCHEMES, shapes: QUANTRT_BENCH_SHAPES, batch sizes: QUANTRT_BENCH_MS; test paths: QUANTRT_GPU_TESTS)
set -uo pipefail
# shellcheck source=ci/gpu-install.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-install.sh" || exit 1
status=0
( cd /tmp && quantrt probe --json ) > "$OUT/probe.json" 2> "$OUT/probe.err" || status=1
# shellcheck disable=SC2086  # a list of paths
python3 -m pytest -q -p no:cacheprovider ${QUANTRT_GPU_TESTS:-tests/gpu tests/triton} 2>&1 | tee "$OUT/gpu-tests.log" | tail -n 5
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
if [ "${QUANTRT_GPU_TUNE:-0}" = 1 ] && [ "$status" = 0 ]; then
  # sweep the CUDA W4A16 kernel's launch shapes, use them for the rest of this run (commit the file
  # from $OUT afterwards), and test the kernel again with the shapes just chosen
  arch=$(python3 -c "import torch; print('sm_%d%d' % torch.cuda.get_device_capability())")
  python3 ci/tune_wna16_mma.py --out "$OUT/wna16_mma_${arch}.json" \
    --shapes 8192x57344,28672x8192,4096x28672 > "$OUT/tune.log" 2>&1 || { tail -n 5 "$OUT/tune.log"; status=1; }
  if [ "$status" = 0 ]; then
    cp "$OUT/wna16_mma_${arch}.json" "backends/cuda/tunings/wna16_mma_${arch}.json"
    python3 -m pytest -q -p no:cacheprovider tests/gpu -k mma 2>&1 | tee "$OUT/gpu-tests-tuned.log" | tail -n 2
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  fi
fi
if [ "${QUANTRT_GPU_TUNE_W8A8:-0}" = 1 ] && [ "$status" = 0 ]; then
  # sweep the Triton W8A8 / fp8 weight-only tiles (QUANTRT_W8A8_SECTIONS, default all), use them for
  # the rest of this run (commit the file from $OUT afterwards) and test those kernels again
  arch=$(python3 -c "import torch; print('sm_%d%d' % torch.cuda.get_device_capability())")
  python3 ci/tune_w8a8.py --out "$OUT/w8a8_${arch}.json" --budget "${QUANTRT_W8A8_BUDGET:-15}" \
    --seconds "${QUANTRT_W8A8_SECONDS:-inf}" \
    --sections "${QUANTRT_W8A8_SECTIONS:-fp8_rowwise,fp8_block,fp8_weight_only,int8}" \
    > "$OUT/tune-w8a8.log" 2>&1 || { tail -n 5 "$OUT/tune-w8a8.log"; status=1; }
  if [ "$status" = 0 ]; then
    cp "$OUT/w8a8_${arch}.json" "backends/cuda/tunings/w8a8_${arch}.json"
    python3 -m pytest -q -p no:cacheprovider tests/gpu tests/triton -k "fp8 or int8 or w8a8" 2>&1 \
      | tee "$OUT/gpu-tests-w8a8.log" | tail -n 2
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  fi
fi
if [ "${QUANTRT_GPU_TUNE_LUT:-0}" = 1 ] && [ "$status" = 0 ]; then
  # sweep the FP4/NF4 (lut4) and GGUF launch shapes, use them for the rest of this run (commit the
  # files from $OUT afterwards) and test those kernels again with the shapes chosen
  arch=$(python3 -c "import torch; print('sm_%d%d' % torch.cuda.get_device_capability())")
  python3 ci/tune_lut_gguf.py --out-dir "$OUT" --seconds "${QUANTRT_LUT_SECONDS:-240}" \
    > "$OUT/tune-lut.log" 2>&1 || { tail -n 5 "$OUT/tune-lut.log"; status=1; }
  for part in lut4 gguf; do
    [ -f "$OUT/${part}_${arch}.json" ] && cp "$OUT/${part}_${arch}.json" "backends/cuda/tunings/${part}_${arch}.json"
  done
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_cuda_lut_gguf.py 2>&1 | tee "$OUT/gpu-tests-lut.log" | tail -n 2
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [ "${QUANTRT_GPU_TUNE_GGUF_GEMV:-0}" = 1 ] && [ "$status" = 0 ]; then
  # sweep the CUDA GGUF GEMV's launch shapes and its bound against the Triton GEMV, use them for the
  # rest of this run (commit the file from $OUT afterwards) and test the GGUF kernels again
  arch=$(python3 -c "import torch; print('sm_%d%d' % torch.cuda.get_device_capability())")
  python3 ci/tune_gguf_gemv.py --out "$OUT/gguf_gemv_${arch}.json" > "$OUT/tune-gguf-gemv.log" 2>&1 \
    || { tail -n 5 "$OUT/tune-gguf-gemv.log"; status=1; }
  [ -f "$OUT/gguf_gemv_${arch}.json" ] && cp "$OUT/gguf_gemv_${arch}.json" "backends/cuda/tunings/gguf_gemv_${arch}.json"
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_cuda_lut_gguf.py -k gguf 2>&1 | tee "$OUT/gpu-tests-gguf.log" | tail -n 2
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [ "${QUANTRT_GPU_MOE_BENCH:-0}" = 1 ]; then
  # the fused MoE kernels beside the bf16 grouped baseline and dequant + baseline (Mixtral-8x7B and
  # Qwen3-30B-A3B layer shapes, M = 1..1024), bounded to a few minutes
  # shellcheck disable=SC2086  # extra arguments (QUANTRT_MOE_ARGS="--ms 1,16 --budget-s 90")
  ( cd /tmp && python3 "$ROOT/bench/gpu_moe.py" --out "$OUT/moe.json" ${QUANTRT_MOE_ARGS:-} ) > "$OUT/moe-bench.log" 2>&1 \
    || { tail -n 20 "$OUT/moe-bench.log"; status=1; }
  tail -n 40 "$OUT/moe-bench.log"
fi
if [ "${QUANTRT_GPU_KV_BENCH:-0}" = 1 ]; then
  # decode attention over the quantized KV cache beside SDPA/FlashAttention on a bf16 cache
  # (1k/8k/32k context, batch 1/16/64), then whole-model decode with each cache (gemma-3-270m's
  # layout, a long prompt); each bounded to a few minutes
  # shellcheck disable=SC2086
  ( cd /tmp && python3 "$ROOT/bench/gpu_kv.py" --out "$OUT/kv.json" ${QUANTRT_KV_ARGS:-} ) > "$OUT/kv-bench.log" 2>&1 \
    || { tail -n 20 "$OUT/kv-bench.log"; status=1; }
  tail -n 30 "$OUT/kv-bench.log"
  ( cd /tmp && python3 "$ROOT/bench/gpu_model.py" --layout "$ROOT/bench/layouts/gemma-3-270m-q4_k_m.json" \
    --prompt-tokens "${QUANTRT_KV_PROMPT:-4096}" --new-tokens 64 --repeat 3 \
    --kv-caches "${QUANTRT_KV_CACHES:-paged,fp8,int8,turboquant_k8v4,turboquant_4bit_nc,turboquant_3bit_nc}" \
    --out "$OUT/kv-model.json" ) > "$OUT/kv-model.log" 2>&1 || { tail -n 20 "$OUT/kv-model.log"; status=1; }
  tail -n 8 "$OUT/kv-model.log"
fi
if [ "${QUANTRT_GPU_LOAD_BENCH:-0}" = 1 ]; then
  # an 8B-shaped dense checkpoint loaded dense and quantized at load (bench/quantize_load.py; 16 GB
  # written to /tmp first), each configuration's cProfile by own time in $OUT/load-prof
  ( cd /tmp && python3 "$ROOT/bench/quantize_load.py" --shape 8b --device cuda \
    --schemes "${QUANTRT_LOAD_SCHEMES:-w4a16-int-g128-asym,w8a8-fp8-ch}" --dir /tmp --out "$OUT/quantize-load.json" \
    ${QUANTRT_LOAD_PROFILE:+--profile-dir "$OUT/load-prof"} ) > "$OUT/load-bench.log" 2>&1 \
    || { tail -n 20 "$OUT/load-bench.log"; status=1; }
  tail -n 6 "$OUT/load-bench.log"
fi
if [ "${QUANTRT_GPU_BENCH:-1}" = 1 ]; then
  schemes="${QUANTRT_BENCH_SCHEMES:-w4a16-int-g128-asym,w8a16-int-ch-sym,w8a8-fp8-ch,w8a8-fp8-block128,w8a8-int-ch-sym}"
  shapes=()
  [ -n "${QUANTRT_BENCH_SHAPES:-}" ] && shapes=(--shapes "$QUANTRT_BENCH_SHAPES")
  [ -n "${QUANTRT_BENCH_MS:-}" ] && shapes+=(--ms "$QUANTRT_BENCH_MS")
  ( cd /tmp && quantrt bench --quick --schemes "$schemes" "${shapes[@]}" --out "$OUT/bench.json" --markdown "$OUT/bench.md" ) \
    > /dev/null 2> "$OUT/bench.err" || { tail -n 20 "$OUT/bench.err"; status=1; }
  cat "$OUT/bench.md" 2>/dev/null
fi
echo "gpu.sh status=$status"
exit $status
