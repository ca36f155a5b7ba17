#!/usr/bin/env bash
# Builds vLLM's Marlin int4 GEMM as a benchmark baseline: .peers/libmarlin_peer.so (git-ignored).
#
# Built from: vLLM 0.34.0, the PyPI sdist (its _version.py records no commit id); the sources it
# takes hash to 3401fd78f2137391 (printed below). With a git mirror, the commit it used is printed
# and written to .peers/vllm-src/SOURCE.
#
# Usage: ci/build-peers.sh VLLM_SRC
#   VLLM_SRC: a vLLM source tree (git checkout or unpacked sdist), a bare git dir (the search
#   tool's mirror; HEAD is read, or $VLLM_REV), or an sdist .tar.gz. Nothing is downloaded here.
#
# Only bf16 activations x uint4b8 weights x group 128 are instantiated, with every thread config
# vLLM's generator emits for them (thread_m_blocks 0.5..4): one kernel file, ~20 s on 2 cores.
# No torch headers: a small shim stands in for STD_TORCH_CHECK, the torch wrappers of marlin.cu and
# gptq_marlin_repack.cu are cut off (markers checked), and an extern "C" API takes raw pointers.
# Env: NVCC (default /usr/local/bin/nvcc), NVCC_THREADS (default 2), CXX_STD (default c++17).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEERS="$ROOT/.peers"
SRC_OUT="$PEERS/vllm-src"
BUILD="$PEERS/build"
SHIM="$PEERS/shim"
LIB="$PEERS/libmarlin_peer.so"
NVCC=${NVCC:-/usr/local/bin/nvcc}
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3
CXX_STD=${CXX_STD:-c++17}

if [ $# -ne 1 ]; then
  sed -n '2,11p' "$0" >&2
  exit 2
fi
VLLM_SRC=$1
NEEDED=(LICENSE csrc/core/scalar_type.hpp csrc/quantization/marlin)

# -- 1. the vLLM sources, copied once per source (idempotent: a matching SOURCE skips the copy) --
. "$ROOT/ci/peers-lib.sh"
copy_vllm_sources build-peers "$VLLM_SRC" "$SRC_OUT" "${NEEDED[@]}"
MARLIN="$SRC_OUT/csrc/quantization/marlin"

# -- 2. generated instantiations and torch-free copies of the two host files ----------------------
rm -rf "$BUILD"
mkdir -p "$BUILD" "$SHIM/torch/headeronly/util"
"$PY" - "$MARLIN" "$BUILD" <<'EOF'
"""Runs vLLM's own generator restricted to bf16 x uint4b8 x g128, then cuts the torch wrappers."""
import importlib.util
import re
import sys
from pathlib import Path

marlin, build = Path(sys.argv[1]), Path(sys.argv[2])
sys.argv = ["generate_kernels.py", "9.0", str(build)]
spec = importlib.util.spec_from_file_location("gen", marlin / "generate_kernels.py")
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)
gptq_int4 = [c for c in gen.QUANT_CONFIGS if c["b_type"] == "kU4B8" and "s_type" not in c]
assert len(gptq_int4) == 1, "generate_kernels.py: no single GPTQ-INT4 config"
gen.QUANT_CONFIGS = [dict(gptq_int4[0], a_type=["kBFloat16"], group_blocks=[8])]
gen.OUTPUT_DIR = str(build)
gen.generate_new_kernels()
n = len(re.findall(r"template __global__", (build / "sm80_kernel_bfloat16_u4b8_bfloat16.cu").read_text()))
print(f"build-peers: {n} Marlin instantiations (bf16 x uint4b8 x group_blocks 8)")

torch_inc = re.compile(r'^#include (<torch/[^>]*>|"torch_utils.h")\n', re.M)


def cut(text: str, marker: str, which: int = -1) -> str:
    at = [m.start() for m in re.finditer(re.escape(marker), text)]
    assert at, f"marker {marker!r} not found: vLLM's layout changed"
    return text[: at[which]]


src = torch_inc.sub("", (marlin / "marlin.cu").read_text())
old = "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 750"
assert src.count(old) == 1 and "void marlin_mm(" in src, "marlin.cu: layout changed"
src = src.replace(old, "#if 0  /* torch-only stub for sm < 75, cut by build-peers */")
src = cut(src, "torch::stable::Tensor marlin_gemm(", -1) + "#endif\n"
(build / "marlin_core.cu").write_text(src)

rep = torch_inc.sub("", (marlin / "gptq_marlin_repack.cu").read_text())
rep = cut(rep, "#define CALL_IF(NUM_BITS)")
assert "gptq_marlin_repack_kernel" in rep, "gptq_marlin_repack.cu: layout changed"
(build / "repack_core.cu").write_text(rep)
EOF

# -- 3. the shim: STD_TORCH_CHECK without torch, and our extern "C" API -------------------------
write_check_shim "$SHIM" marlin_peer

cat >"$BUILD/peer_api.cu" <<'EOF'
// quantrt's C API over vLLM's Marlin (bf16 x uint4b8 x group 128): raw device pointers and a
// stream, so Python reaches it through ctypes with no torch extension build.
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "marlin_core.cu"
#include "repack_core.cu"

namespace {
thread_local std::string last_error;

int fail(const std::string& why) {
  last_error = why;
  return 1;
}

int launched(const char* what) {
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? 0 : fail(std::string(what) + ": " + cudaGetErrorString(e));
}
}  // namespace

#define PEER_API __attribute__((visibility("default")))

extern "C" {

PEER_API int marlin_peer_abi_version(void) { return 1; }

PEER_API const char* marlin_peer_last_error(void) { return last_error.c_str(); }

// GPTQ int32 [K/8, N] (nibble i of word r = row 8r+i, no act-order perm) -> Marlin tiles,
// int32 [K/16, 2N]. K % 16 == 0, N % 64 == 0.
PEER_API int marlin_peer_repack_u4(const int32_t* qweight, int32_t* out, int64_t size_k, int64_t size_n,
                          cudaStream_t stream) {
  try {
    if (size_k % marlin::tile_k_size || size_n % marlin::tile_n_size)
      return fail("repack: K must divide by 16 and N by 64");
    int dev = 0, sms = 0, smem = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    auto kernel = marlin::gptq_marlin_repack_kernel<marlin::repack_threads, 4>;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    kernel<<<sms, marlin::repack_threads, smem, stream>>>(
        reinterpret_cast<const uint32_t*>(qweight), reinterpret_cast<uint32_t*>(out),
        static_cast<int>(size_k), static_cast<int>(size_n));
    return launched("repack");
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}

// C[M, N] = A[M, K] (bf16, row stride lda elements) x dequant(B), vLLM's thread-config choice.
// scales: bf16 [K/group_size, N] permuted as marlin_permute_scales does.
// locks: int32, >= SM count, zeroed once (the kernel leaves them zero).
// c_tmp: fp32, sms * min(ceil16(M), 64) * 256 elements when use_fp32_reduce, else unused.
PEER_API int marlin_peer_gemm_bf16_u4b8(const void* a, const void* b_q, const void* scales, void* c,
                               float* c_tmp, int32_t* locks, int64_t size_m, int64_t size_n,
                               int64_t size_k, int64_t lda, int64_t group_size,
                               int use_atomic_add, int use_fp32_reduce, cudaStream_t stream) {
  try {
    if (size_m <= 0) return 0;
    if (size_k % marlin::tile_size || size_n % marlin::min_thread_n)
      return fail("gemm: K must divide by 16 and N by 64");
    if (lda % 8 || reinterpret_cast<uintptr_t>(a) % 16)
      return fail("gemm: A must be 16-byte aligned with a row stride divisible by 8");
    if (group_size != -1 && (group_size <= 0 || size_k % group_size))
      return fail("gemm: group_size must divide K (or be -1)");
    int num_groups = group_size == -1 ? 1 : static_cast<int>(size_k / group_size);
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    marlin::marlin_mm(a, b_q, c, c_tmp, /*b_bias=*/nullptr, const_cast<void*>(scales),
                      /*g_s=*/nullptr, /*zp=*/nullptr, static_cast<int>(size_m),
                      static_cast<int>(size_n), static_cast<int>(size_k), static_cast<int>(lda),
                      locks, vllm::kBFloat16, vllm::kU4B8, vllm::kBFloat16, vllm::kBFloat16,
                      /*has_bias=*/false, /*has_zp=*/false, num_groups,
                      static_cast<int>(group_size), dev, stream, /*thread_k=*/-1,
                      /*thread_n=*/-1, sms, use_atomic_add != 0, use_fp32_reduce != 0,
                      /*is_zp_float=*/false);
    return launched("gemm");
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}

}  // extern "C"
EOF

# -- 4. nvcc --------------------------------------------------------------------------------------
FLAGS=(-gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90,code=compute_90
  -O3 -std="$CXX_STD" -Xcompiler -fPIC -Xcompiler -fvisibility=hidden --expt-relaxed-constexpr
  -static-global-template-stub=false -DENABLE_FP8 -DMARLIN_NAMESPACE_NAME=marlin
  --threads "${NVCC_THREADS:-2}" -I"$SHIM" -I"$SRC_OUT/csrc" -I"$MARLIN" -I"$BUILD")
start=$(date +%s)
"$NVCC" "${FLAGS[@]}" -c "$BUILD/sm80_kernel_bfloat16_u4b8_bfloat16.cu" -o "$BUILD/kernels.o"
"$NVCC" "${FLAGS[@]}" -c "$BUILD/peer_api.cu" -o "$BUILD/peer_api.o"
"$NVCC" -gencode=arch=compute_90a,code=sm_90a --shared -cudart static \
  "$BUILD/kernels.o" "$BUILD/peer_api.o" -o "$LIB.tmp"
mv "$LIB.tmp" "$LIB"
echo "build-peers: nvcc took $(($(date +%s) - start)) s"

# -- 5. report ------------------------------------------------------------------------------------
CUOBJDUMP=$(command -v cuobjdump || true)
[ -n "$CUOBJDUMP" ] || CUOBJDUMP=$(ls "$ROOT"/.venv/lib/python3*/site-packages/triton/backends/nvidia/bin/cuobjdump 2>/dev/null | head -1 || true)
if [ -n "$CUOBJDUMP" ]; then
  # --list-elf names the cubins sm_90 (older cuobjdumps); the arch line of each ELF says sm_90a
  "$CUOBJDUMP" --list-elf --list-ptx "$LIB" | sed 's/^/build-peers: /'
  archs=$("$CUOBJDUMP" --dump-resource-usage "$LIB" | awk '/^Fatbin/ {k = $2} /^arch = / {print k, $3}' | sort | uniq -c)
  echo "$archs" | sed 's/^ */build-peers: fatbin entries: /'
  echo "$archs" | grep -q 'elf sm_90a' || { echo "build-peers: no sm_90a code" >&2; exit 1; }
fi
nm -D --defined-only "$LIB" | grep -o 'marlin_peer_[a-z0-9_]*' | sed 's/^/build-peers: exports /'
size=$(stat -c %s "$LIB")
echo "build-peers: $LIB $size bytes ($((size / 1024 / 1024)) MiB)"
[ "$size" -lt $((40 * 1024 * 1024)) ] || { echo "build-peers: over 40 MB" >&2; exit 1; }
