#!/usr/bin/env bash
# Builds vLLM's Machete mixed-input GEMM (Hopper, CUTLASS 3.x wgmma + TMA) as a benchmark baseline:
# .peers/libmachete_peer.so (git-ignored), next to build-peers.sh's Marlin.
#
# Usage: ci/build-peers-machete.sh VLLM_SRC CUTLASS_SRC
#   VLLM_SRC: a vLLM source tree (git checkout or unpacked sdist), a bare git dir ($VLLM_REV or
#   HEAD) or an sdist .tar.gz. CUTLASS_SRC: a CUTLASS tree (include/, tools/util/include/,
#   python/cutlass_library/) or a bare git dir, read at $CUTLASS_REV (default: the tag vLLM's
#   CMakeLists.txt pins). Nothing is downloaded here.
#
# Only bf16 activations x uint4b8 weights x bf16 group scales (no zeros, no channel/token scales),
# bf16 out, fp32 accumulate is instantiated, and of vLLM's nine schedules for it only those its
# heuristic picks for $MACHETE_MS x $MACHETE_SHAPES (K x N), 5 by default (~45 s of nvcc each,
# ~2.5 min on 2 cores); MACHETE_SCHEDULES=all builds all nine, or name them (comma-separated). A
# problem whose pick was not built fails loudly at its call.
# vLLM's own generate.py supplies the schedules, heuristic and type tags; its kernel, mainloop and
# prepack code compile as written. The torch-facing layer (launchers, dispatch, torch_utils.h) is
# not used: a shim stands in for the few torch headers the kernel headers include (STD_TORCH_CHECK
# and a non-owning strided view for torch::stable::Tensor), and an extern "C" API takes raw
# pointers. Env: NVCC (default /usr/local/bin/nvcc), JOBS (parallel nvcc, default 2),
# CXX_STD (default c++17), MACHETE_MS, MACHETE_SHAPES, MACHETE_SCHEDULES.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEERS="$ROOT/.peers"
SRC_OUT="$PEERS/machete-src"
BUILD="$PEERS/machete-build"
SHIM="$PEERS/machete-shim"
LIB="$PEERS/libmachete_peer.so"
NVCC=${NVCC:-/usr/local/bin/nvcc}
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3
CXX_STD=${CXX_STD:-c++17}
JOBS=${JOBS:-2}
export MACHETE_MS=${MACHETE_MS:-1,16,64,256,4096}
export MACHETE_SHAPES=${MACHETE_SHAPES:-8192x57344,28672x8192,4096x28672,4096x4096}
export MACHETE_SCHEDULES=${MACHETE_SCHEDULES:-heuristic}

if [ $# -ne 2 ]; then
  sed -n '2,9p' "$0" >&2
  exit 2
fi
VLLM_SRC=$1
CUTLASS_SRC=$2
NEEDED=(LICENSE CMakeLists.txt csrc/quantization/machete csrc/cutlass_extensions)

# -- 1. the vLLM sources, copied once per source (a matching SOURCE skips the copy) ---------------
. "$ROOT/ci/peers-lib.sh"
copy_vllm_sources build-peers-machete "$VLLM_SRC" "$SRC_OUT" "${NEEDED[@]}"
MACHETE="$SRC_OUT/csrc/quantization/machete"
pin=$(sed -n 's/^ *set(CUTLASS_REVISION "\([^"]*\)".*/\1/p' "$SRC_OUT/CMakeLists.txt" | head -1)
echo "build-peers-machete: vLLM pins CUTLASS ${pin:-(no CUTLASS_REVISION found)}"

# -- 2. CUTLASS: a tree as it is, or a git dir's revision extracted once --------------------------
if [ -d "$CUTLASS_SRC/include/cutlass" ]; then
  CUTLASS=$(cd "$CUTLASS_SRC" && pwd)
  cutlass_origin=$(cat "$CUTLASS/SOURCE" 2>/dev/null || git -C "$CUTLASS" rev-parse HEAD 2>/dev/null || echo "tree $CUTLASS")
else
  rev=${CUTLASS_REV:-$pin}
  commit=$(git --git-dir="$CUTLASS_SRC" rev-parse --verify -q "$rev^{commit}" || true)
  if [ -z "$commit" ]; then
    echo "build-peers-machete: $CUTLASS_SRC is no CUTLASS tree, or has no revision '$rev' (set CUTLASS_REV)" >&2
    exit 2
  fi
  cutlass_origin="$rev $commit"
  CUTLASS="$PEERS/cutlass-$commit"
  if [ "$(cat "$CUTLASS/SOURCE" 2>/dev/null)" != "$cutlass_origin" ]; then
    rm -rf "$CUTLASS"
    mkdir -p "$CUTLASS"
    paths=(include tools/util/include python/cutlass_library LICENSE.txt)
    git --git-dir="$CUTLASS_SRC" archive "$commit" "${paths[@]}" | tar -x -C "$CUTLASS"
    want=$(git --git-dir="$CUTLASS_SRC" ls-tree -r --name-only "$commit" "${paths[@]}" | wc -l)
    got=$(cd "$CUTLASS" && find "${paths[@]}" -type f | wc -l)
    [ "$want" = "$got" ] || { echo "build-peers-machete: CUTLASS $commit: $got of $want files extracted" >&2; exit 1; }
    echo "$cutlass_origin" >"$CUTLASS/SOURCE"
  fi
fi
[ -d "$CUTLASS/python/cutlass_library" ] || { echo "build-peers-machete: $CUTLASS has no python/cutlass_library (generate.py needs it)" >&2; exit 2; }
cver=$(awk '/define CUTLASS_(MAJOR|MINOR|PATCH) / {printf "%s%s", sep, $3; sep = "."}' "$CUTLASS/include/cutlass/version.h")
cdigest=$(cd "$CUTLASS" && find include tools/util/include -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)
echo "build-peers-machete: CUTLASS $cver: $cutlass_origin (headers sha256 $cdigest)"
[ "v$cver" = "$pin" ] || echo "build-peers-machete: note: CUTLASS $cver is not vLLM's pin $pin"

# -- 3. the shim: the few torch headers vLLM's kernel headers include, without torch ---------------
rm -rf "$BUILD" "$SHIM"
mkdir -p "$BUILD" "$SHIM/torch/headeronly/util" "$SHIM/torch/headeronly/core" "$SHIM/torch/csrc/stable"
write_check_shim "$SHIM" machete_peer

cat >"$SHIM/torch/headeronly/core/ScalarType.h" <<'EOF'
// quantrt peer shim: the dtype names torch_utils.hpp maps CUTLASS types to (names only).
#pragma once
#include <cstdint>

namespace torch::headeronly {
struct Half;
struct BFloat16;
enum class ScalarType : int8_t { Byte = 0, Int = 3, Half = 5, Float = 6, BFloat16 = 15 };
template <typename T>
struct CppTypeToScalarType;
template <>
struct CppTypeToScalarType<Half> {
  static constexpr ScalarType value = ScalarType::Half;
};
template <>
struct CppTypeToScalarType<BFloat16> {
  static constexpr ScalarType value = ScalarType::BFloat16;
};
}  // namespace torch::headeronly
EOF
for h in BFloat16 Half; do
  printf '#pragma once\n#include <torch/headeronly/core/ScalarType.h>\n' >"$SHIM/torch/headeronly/util/$h.h"
done

cat >"$SHIM/torch/csrc/stable/tensor.h" <<'EOF'
// quantrt peer shim: torch::stable::Tensor as a non-owning strided view, with the accessors
// vLLM's Machete kernel headers call (sizes, strides, data pointers). Nothing is allocated.
#pragma once
#include <cstdint>
#include <initializer_list>

#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

namespace torch::stable {
class Tensor {
 public:
  Tensor(void* data, std::initializer_list<int64_t> sizes, std::initializer_list<int64_t> strides,
         headeronly::ScalarType dtype, int64_t element_size)
      : data_(data), dtype_(dtype), element_size_(element_size) {
    STD_TORCH_CHECK(sizes.size() == strides.size() && sizes.size() <= 4, "shim tensor rank");
    for (int64_t s : sizes) sizes_[dim_++] = s;
    int64_t i = 0;
    for (int64_t s : strides) strides_[i++] = s;
  }
  void* data_ptr() const { return data_; }
  const void* const_data_ptr() const { return data_; }
  void* mutable_data_ptr() const { return data_; }
  int64_t dim() const { return dim_; }
  int64_t size(int64_t i) const { return sizes_[i < 0 ? i + dim_ : i]; }
  int64_t stride(int64_t i) const { return strides_[i < 0 ? i + dim_ : i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t i = 0; i < dim_; ++i) n *= sizes_[i];
    return n;
  }
  headeronly::ScalarType scalar_type() const { return dtype_; }
  int64_t element_size() const { return element_size_; }

 private:
  void* data_;
  headeronly::ScalarType dtype_;
  int64_t element_size_;
  int64_t dim_ = 0;
  int64_t sizes_[4] = {};
  int64_t strides_[4] = {};
};
}  // namespace torch::stable
EOF

# -- 4. our launcher (what vLLM's run_impl does, minus torch allocation) and the C API template ----
cat >"$BUILD/peer_launcher.cuh" <<'EOF'
// quantrt peer launcher for vLLM's Machete: the generated impl_* functions call run_impl<Kernel>
// as vLLM's do; here MMArgs carries non-owning views, the caller's stream and workspace, and the
// output is the caller's (vLLM allocates D and the workspace per call with torch).
#pragma once
#include <cstddef>
#include <optional>

#include "machete_mm_kernel.cuh"

namespace machete {

struct MMArgs {
  cudaStream_t stream;
  torch::stable::Tensor const& A;  // [M, K], unit stride along K
  torch::stable::Tensor const& B;  // prepacked, vLLM's shape [K / 8, N]
  torch::stable::Tensor& D;        // [M, N], contiguous
  std::optional<torch::stable::Tensor> const& maybe_group_scales;  // [ceil(K / g), N]
  std::optional<int64_t> maybe_group_size;
  void* workspace;
  size_t workspace_bytes;
  size_t* workspace_needed;  // non-null: report the workspace size, launch nothing
};

template <typename MacheteKernel>
torch::stable::Tensor run_impl(MMArgs args) {
  std::optional<torch::stable::Tensor> const none;
  auto arguments = MacheteKernel::create_arguments(
      args.stream, args.A, args.B, args.D, args.maybe_group_scales, none,
      args.maybe_group_size, none, none);
  STD_TORCH_CHECK(MacheteKernel::can_implement(arguments),
                  "Machete kernel cannot be run with these arguments");
  size_t workspace_size = MacheteKernel::get_workspace_size(arguments);
  if (args.workspace_needed) {
    *args.workspace_needed = workspace_size;
    return args.D;
  }
  STD_TORCH_CHECK(workspace_size <= args.workspace_bytes || workspace_size == 0,
                  "workspace: ", workspace_size, " bytes needed, ", args.workspace_bytes, " given");
  MacheteKernel::run(arguments, args.workspace, args.stream);
  return args.D;
}

}  // namespace machete
EOF

cat >"$BUILD/peer_api.cu.in" <<'EOF'
// quantrt's C API over vLLM's Machete (bf16 x uint4b8, bf16 group scales, bf16 out, f32
// accumulate): raw device pointers and a stream, for ctypes. The schedule table, heuristic and
// prepack types below were filled in from vLLM's generate.py by ci/build-peers-machete.sh.
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "peer_launcher.cuh"
#include "machete_prepack_kernel.cuh"

namespace machete {
@DECLS@
}  // namespace machete

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

using Impl = torch::stable::Tensor (*)(machete::MMArgs);
struct Schedule {
  const char* name;
  Impl impl;  // nullptr: not built here
};
// vLLM's schedules for this type, in its heuristic's order.
const Schedule kSchedules[@NSCHED@] = {
@TABLE@
};
constexpr int kNumSchedules = @NSCHED@;

// vLLM's default heuristic (generate.py), as its mm_dispatch evaluates it: an index in kSchedules.
int heuristic(int64_t M, int64_t N, int64_t K) {
@RULES@
}

using PrepackedLayoutB = @PREPACK@;

std::string built_list() {
  std::string out;
  for (const Schedule& s : kSchedules)
    if (s.impl) out += (out.empty() ? "" : ",") + std::string(s.name);
  return out;
}

int mm(const void* a, const void* b, const void* scales, void* d, void* workspace,
       size_t workspace_bytes, size_t* workspace_needed, int64_t M, int64_t N, int64_t K,
       int64_t lda, int64_t group_size, const char* schedule, cudaStream_t stream) {
  using torch::headeronly::ScalarType;
  if (M <= 0) {
    if (workspace_needed) *workspace_needed = 0;
    return 0;
  }
  if (K % 64 || N % 128) return fail("K must divide by 64 and N by 128 (Machete's prepacked blocks)");
  if (group_size != -1 && (group_size <= 0 || K % group_size))
    return fail("group_size must divide K (or be -1)");
  if (lda % 8 || reinterpret_cast<uintptr_t>(a) % 16)
    return fail("A must be 16-byte aligned with a row stride divisible by 8");
  int which = -1;
  if (schedule == nullptr || !*schedule) {
    which = heuristic(M, N, K);
  } else {
    for (int i = 0; i < kNumSchedules; ++i)
      if (!std::strcmp(schedule, kSchedules[i].name)) which = i;
    if (which < 0) return fail(std::string("unknown schedule ") + schedule);
  }
  if (!kSchedules[which].impl)
    return fail(std::string("schedule ") + kSchedules[which].name +
                (schedule && *schedule ? "" : " (vLLM's pick for M=" + std::to_string(M) +
                                                  ", N=" + std::to_string(N) + ", K=" +
                                                  std::to_string(K) + ")") +
                " is not built here (built: " + built_list() +
                "): rebuild with MACHETE_SCHEDULES=all or these M/shapes");
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);  // CUTLASS divides by the SM count it queries: no device, no call
  if (e != cudaSuccess) return fail(std::string("no CUDA device: ") + cudaGetErrorString(e));
  int64_t g = group_size == -1 ? K : group_size;
  torch::stable::Tensor A(const_cast<void*>(a), {M, K}, {lda, 1}, ScalarType::BFloat16, 2);
  torch::stable::Tensor B(const_cast<void*>(b), {K / 8, N}, {N, 1}, ScalarType::Int, 4);
  torch::stable::Tensor D(d, {M, N}, {N, 1}, ScalarType::BFloat16, 2);
  torch::stable::Tensor S(const_cast<void*>(scales), {(K + g - 1) / g, N}, {N, 1},
                          ScalarType::BFloat16, 2);
  std::optional<torch::stable::Tensor> const maybe_s(S);
  machete::MMArgs args{stream, A, B, D, maybe_s, std::optional<int64_t>(group_size),
                       workspace, workspace_bytes, workspace_needed};
  kSchedules[which].impl(args);
  return workspace_needed ? 0 : launched("gemm");
}
}  // namespace

#define PEER_API __attribute__((visibility("default")))

extern "C" {

PEER_API int machete_peer_abi_version(void) { return 1; }

PEER_API const char* machete_peer_last_error(void) { return last_error.c_str(); }

// The schedules built here, comma-separated (vLLM's names).
PEER_API const char* machete_peer_schedules(void) {
  static const std::string names = built_list();
  return names.c_str();
}

// The schedule vLLM's heuristic picks for this problem (built here or not).
PEER_API const char* machete_peer_heuristic(int64_t M, int64_t N, int64_t K) {
  return kSchedules[heuristic(M, N, K)].name;
}

// uint4b8 codes, int32 words [N, K/8] row-major (word r of row n holds k = 8r..8r+7, LSB first):
// vLLM's B [K/8, N] with strides (1, K/8), as machete.py hands it over (w.t().contiguous().t()).
// out: N * K / 8 int32 (vLLM's prepacked tensor, shape [K/8, N]). K % 64 == 0, N % 128 == 0.
PEER_API int machete_peer_prepack_B_u4b8(const int32_t* b, int32_t* out, int64_t size_k,
                                         int64_t size_n, cudaStream_t stream) {
  try {
    using namespace cute;
    using ElementB = typename PrepackedLayoutB::ElementB;
    using PPBlockShape_NK = typename PrepackedLayoutB::PPBlockShape_NK;
    if (size_k % size<1>(PPBlockShape_NK{}) || size_n % size<0>(PPBlockShape_NK{}))
      return fail("prepack: K must divide by 64 and N by 128");
    // (N, K, L=1) element layout, contiguous along K: what vLLM's prepack_impl derives from its
    // (N, packed_K) view by scaling shape[1] and the other strides by the 8 codes a word.
    auto const layout_Bt = make_layout(make_shape(size_n, size_k, int64_t(1)),
                                       make_stride(size_k, _1{}, int64_t(0)));
    machete::prepack_B_template<PrepackedLayoutB>(stream, reinterpret_cast<ElementB const*>(b),
                                                  layout_Bt, reinterpret_cast<ElementB*>(out));
    return launched("prepack");
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}

// Bytes of workspace machete_peer_gemm_bf16_u4b8 needs for this problem (the stream-K scheduler's).
PEER_API int machete_peer_workspace_bf16_u4b8(const void* a, const void* b, const void* scales,
                                              void* d, int64_t M, int64_t N, int64_t K,
                                              int64_t lda, int64_t group_size,
                                              const char* schedule, size_t* bytes) {
  try {
    return mm(a, b, scales, d, nullptr, 0, bytes, M, N, K, lda, group_size, schedule, nullptr);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}

// D[M, N] (bf16, contiguous) = A[M, K] (bf16, row stride lda) x dequant(B), B from
// machete_peer_prepack_B_u4b8; scales bf16 [K / group_size, N] row-major (group_size -1: one
// row). schedule: vLLM's name, or null / "" for vLLM's heuristic. workspace: at least what
// machete_peer_workspace_bf16_u4b8 said (the kernel initialises it on the stream itself).
PEER_API int machete_peer_gemm_bf16_u4b8(const void* a, const void* b, const void* scales, void* d,
                                         void* workspace, size_t workspace_bytes, int64_t M,
                                         int64_t N, int64_t K, int64_t lda, int64_t group_size,
                                         const char* schedule, cudaStream_t stream) {
  try {
    return mm(a, b, scales, d, workspace, workspace_bytes, nullptr, M, N, K, lda, group_size,
              schedule, stream);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}

}  // extern "C"
EOF

# -- 5. vLLM's generator, for the one type config; our launcher, prepack and C API around it -------
PYTHONPATH="$SRC_OUT/csrc/cutlass_extensions:$CUTLASS/python${PYTHONPATH:+:$PYTHONPATH}" \
  "$PY" - "$MACHETE" "$BUILD" <<'EOF'
"""Runs vLLM's generate.py, keeps bf16 x uint4b8 (bf16 group scales, bf16 out, f32 accumulate),
renders its impl template once per chosen schedule, and writes the dispatch + C API (ours)."""
import importlib.util
import os
import re
import sys
from pathlib import Path

machete, build = Path(sys.argv[1]), Path(sys.argv[2])
spec = importlib.util.spec_from_file_location("machete_generate", machete / "generate.py")
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)

seen = []
gen.create_sources = lambda impl_configs, num_impl_files=8: seen.extend(impl_configs) or []
gen.__file__ = str(build / "generate.py")  # generate() (re)makes SCRIPT_DIR/generated: ours, empty
gen.generate()
D = gen.DataType
want = dict(a=D.bf16, b=gen.VLLMDataType.u4b8, b_group_scale=D.bf16, b_group_zeropoint=D.void,
            b_channel_scale=D.void, a_token_scale=D.void, out=D.bf16, accumulator=D.f32)
ics = [ic for ic in seen if all(getattr(ic.types, k) == v for k, v in want.items())]
assert len(ics) == 1, f"generate.py: {len(ics)} bf16 x u4b8 configs with bf16 group scales"
ic = ics[0]
type_sig = gen.generate_type_signature(ic.types)
sig = gen.generate_terse_sch_sig
order = [s for s in ic.schedules]  # vLLM's unique schedules, in heuristic order
conds = []
for cond, s in ic.heuristic:
    assert cond is None or re.fullmatch(r"[MNK0-9<>=& ]+", cond), f"heuristic condition {cond!r}"
    conds.append((cond, order.index(s)))
assert conds[-1][0] is None, "heuristic has no default"


def pick(M: int, N: int, K: int) -> int:
    for cond, i in conds:
        if cond is None or eval(cond.replace("&&", " and "), {}, {"M": M, "N": N, "K": K}):
            return i
    raise AssertionError


choice = os.environ["MACHETE_SCHEDULES"]
if choice == "all":
    built = set(range(len(order)))
elif choice == "heuristic":
    ms = [int(m) for m in os.environ["MACHETE_MS"].split(",")]
    kns = [tuple(map(int, s.split("x"))) for s in os.environ["MACHETE_SHAPES"].split(",")]
    built = {pick(M, N, K) for M in ms for K, N in kns}
else:
    names = [sig(s) for s in order]
    unknown = [c for c in choice.split(",") if c not in names]
    assert not unknown, f"unknown schedules {unknown}; vLLM's: {names}"
    built = {names.index(c) for c in choice.split(",")}
built = sorted(built)
print(f"build-peers-machete: type {type_sig}: {len(order)} schedules in vLLM's heuristic, building {len(built)}:")
gen_dir = build / "generated"
gen_dir.mkdir(exist_ok=True)
include = '#include "../machete_mm_launcher.cuh"'
for i in built:
    s = order[i]
    one = gen.ImplConfig(ic.types, [s], ic.heuristic)
    code = gen.mm_impl_template.render(impl_configs=[one])
    assert code.count(include) == 1 and f"impl_{type_sig}_sch_{sig(s)}(MMArgs" in code, "impl template changed"
    (gen_dir / f"impl_{sig(s)}.cu").write_text(code.replace(include, '#include "peer_launcher.cuh"'))
    print(f"build-peers-machete:   {sig(s)}")

tag = gen.VLLMDataTypeTag
table = ",\n".join(
    f'    {{"{sig(s)}", {f"&machete::impl_{type_sig}_sch_{sig(s)}" if i in built else "nullptr"}}}'
    for i, s in enumerate(order)
)
decls = "\n".join(f"extern torch::stable::Tensor impl_{type_sig}_sch_{sig(order[i])}(MMArgs);" for i in built)
rules = "\n".join(
    f"  if ({c}) return {i};" if c is not None else f"  return {i};" for c, i in conds
)
t = ic.types
convert = t.a if t.b_group_scale == D.void else t.b_group_scale  # as create_sources picks it
prepack = (
    f"machete::PrepackedLayoutBTemplate<{tag[t.a]}, {tag[gen.unsigned_type_with_bitwidth(gen.VLLMDataTypeSize[t.b])]},"
    f" {tag[convert]}, {tag[t.accumulator]}, cutlass::layout::ColumnMajor,"
    " cutlass::gemm::KernelTmaWarpSpecializedCooperative>"
)
api = (build / "peer_api.cu.in").read_text()
for k, v in {"DECLS": decls, "TABLE": table, "RULES": rules, "PREPACK": prepack, "NSCHED": str(len(order))}.items():
    api = api.replace(f"@{k}@", v)
assert "@" not in api, "peer_api.cu.in: a placeholder left"
(build / "peer_api.cu").write_text(api)
EOF

# -- 6. nvcc: one translation unit per schedule, $JOBS at a time ---------------------------------
# vLLM's flags for its CUTLASS kernels (Release: -O3 -DNDEBUG; torch's --expt-relaxed-constexpr),
# sm_90a only: Machete's wgmma/TMA code is sm_90a-specific (no PTX to JIT elsewhere). CUTLASS finds
# cuTensorMapEncodeTiled through the runtime's driver entry point (vLLM links the driver instead:
# CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL), so the library needs no libcuda at link time.
FLAGS=(-gencode=arch=compute_90a,code=sm_90a -O3 -DNDEBUG -std="$CXX_STD" -Xcompiler -fPIC
  -Xcompiler -fvisibility=hidden --expt-relaxed-constexpr -DENABLE_FP8
  -I"$SHIM" -I"$SRC_OUT/csrc" -I"$MACHETE" -I"$BUILD" -I"$CUTLASS/include" -I"$CUTLASS/tools/util/include")
printf '%s\n' "${FLAGS[@]}" >"$BUILD/nvcc.flags"
start=$(date +%s)
export NVCC BUILD
ls "$BUILD"/generated/impl_*.cu "$BUILD/peer_api.cu" | xargs -P "$JOBS" -I{} bash -c '
  f={}; o="$BUILD/$(basename "$f" .cu).o"; t0=$(date +%s)
  mapfile -t flags <"$BUILD/nvcc.flags"
  if "$NVCC" "${flags[@]}" -c "$f" -o "$o" >"$o.log" 2>&1; then
    echo "build-peers-machete: $(basename "$f") compiled in $(($(date +%s) - t0)) s"
  else
    echo "build-peers-machete: $(basename "$f") FAILED:" >&2; head -c 20000 "$o.log" >&2; exit 255
  fi'
"$NVCC" -gencode=arch=compute_90a,code=sm_90a --shared -cudart static "$BUILD"/*.o -o "$LIB.tmp"
mv "$LIB.tmp" "$LIB"
echo "build-peers-machete: nvcc took $(($(date +%s) - start)) s"

# -- 7. report ------------------------------------------------------------------------------------
CUOBJDUMP=$(command -v cuobjdump || true)
[ -n "$CUOBJDUMP" ] || CUOBJDUMP=$(ls "$("$NVCC" --dryrun -E -x cu /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)"/bin/cuobjdump "$ROOT"/.venv/lib/python3*/site-packages/triton/backends/nvidia/bin/cuobjdump 2>/dev/null | head -1 || true)
if [ -n "$CUOBJDUMP" ]; then
  usage=$("$CUOBJDUMP" --dump-resource-usage "$LIB")  # whole, not piped to grep -q: no SIGPIPE
  echo "$usage" | awk '/^arch = / {a = $3} /^ Function / {n[a]++} END {for (k in n) print "build-peers-machete: " n[k] " kernels for " k}'
  echo "$usage" | grep -q '^arch = sm_90a' || { echo "build-peers-machete: no sm_90a code" >&2; exit 1; }
fi
nm -D --defined-only "$LIB" | grep -o 'machete_peer_[A-Za-z0-9_]*' | sed 's/^/build-peers-machete: exports /'
size=$(stat -c %s "$LIB")
echo "build-peers-machete: $LIB $size bytes ($((size / 1024 / 1024)) MiB)"
[ "$size" -lt $((60 * 1024 * 1024)) ] || { echo "build-peers-machete: over 60 MB" >&2; exit 1; }
