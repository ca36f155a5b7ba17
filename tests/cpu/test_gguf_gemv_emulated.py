"""The CUDA GGUF GEMV's per-lane decode (``qg::Step`` in backends/cuda/kernels/gguf_gemv.cu),
compiled as host C++ with stand-ins for the CUDA intrinsics it uses, against gguf-py's own
dequantizer: every lane of every step of every row, summed as the kernel's reductions sum them.

This checks on a CPU what no interpreter can run: the lane-to-bytes mapping, the byte-permute
decode (0.5 + u/256), q4_k's 6-bit scales and mins, q6_k's high bits and signed scales, the
tails of K (lanes past the last block), and both activation types. The launch,
the warp and block reductions and the bias run on the GPU only (tests/gpu/test_cuda_lut_gguf.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize as gguf_dequantize

from quantrt.backends.cuda import gguf_gemv

SOURCE = Path(gguf_gemv.__file__).parent / "kernels" / gguf_gemv.SOURCE
pytestmark = pytest.mark.skipif(
    shutil.which("c++") is None or shutil.which("ninja") is None, reason="needs a C++ compiler and ninja"
)

SHIM = r"""
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include <torch/extension.h>
#define QG_HOST_SHIM 1
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __restrict__
#define __shared__
#define __launch_bounds__(...)
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct float2 { float x, y; };
struct __half { unsigned short b; };
struct __half2 { __half x, y; };
struct __nv_bfloat16 { unsigned short b; };
struct Dim3 { unsigned x, y, z; };
static Dim3 threadIdx, blockIdx, blockDim;
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __byte_perm(unsigned a, unsigned b, unsigned s) {
  unsigned char v[8];
  std::memcpy(v, &a, 4);
  std::memcpy(v + 4, &b, 4);
  unsigned r = 0;
  for (int n = 0; n < 4; ++n) r |= unsigned(v[(s >> (4 * n)) & 7]) << (8 * n);
  return r;
}
template <class P> inline P __ldg(const P* p) { return *p; }
template <class P> inline P __ldcs(const P* p) { return *p; }
inline float __half2float(__half h) {
  const unsigned e = (h.b >> 10) & 31, m = h.b & 1023;
  const float s = (h.b >> 15) ? -1.f : 1.f;
  if (e == 0) return s * std::ldexp(float(m), -24);
  if (e == 31) return m ? NAN : s * INFINITY;
  return s * std::ldexp(float(m | 1024), int(e) - 25);
}
inline __half __ushort_as_half(unsigned short b) { return __half{b}; }
inline float2 __half22float2(__half2 h) { return float2{__half2float(h.x), __half2float(h.y)}; }
inline float __bfloat162float(__nv_bfloat16 v) { return __uint_as_float(unsigned(v.b) << 16); }
inline __nv_bfloat16 __float2bfloat16_rn(float) { return __nv_bfloat16{0}; }  // epilogue only
inline __half __float2half_rn(float) { return __half{0}; }
inline float __shfl_xor_sync(unsigned, float v, int) { return v; }
inline void __syncthreads() {}
"""

GLUE = r"""
template <typename T, int TYPE>
static void rows_of(const T* x, const std::vector<const unsigned char*>& p, float* y, int64_t M, int64_t N,
                    int64_t K) {
  const int64_t steps = (K + qg::Step<TYPE>::WEIGHTS - 1) / qg::Step<TYPE>::WEIGHTS;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double total = 0;  // the warp and block sums, in any order
      for (int64_t s = 0; s < steps; ++s)
        for (int lane = 0; lane < 32; ++lane) {
          float acc[1][1] = {{0.f}};
          const T* xr[1] = {x + m * K};
          long long rows[1] = {n};
          qg::Step<TYPE>::template run<T, 1, 1>((int)s, lane, K, xr, p.data(), rows, acc);
          total += acc[0][0];
        }
      y[m * N + n] = (float)total;
    }
}

torch::Tensor emulate(torch::Tensor x, std::vector<torch::Tensor> planes, int64_t type, int64_t N, int64_t K,
                      bool half) {
  const int64_t M = x.size(0);
  auto y = torch::empty({M, N}, torch::kFloat32);
  std::vector<const unsigned char*> p;
  for (auto& t : planes) p.push_back(reinterpret_cast<const unsigned char*>(t.data_ptr()));
  while (p.size() < 4) p.push_back(p[0]);
  float* out = y.data_ptr<float>();
#define QG_CASE(ID)                                                                                   \
  case ID:                                                                                            \
    if (half)                                                                                         \
      rows_of<__half, ID>(reinterpret_cast<const __half*>(x.data_ptr()), p, out, M, N, K);            \
    else                                                                                              \
      rows_of<__nv_bfloat16, ID>(reinterpret_cast<const __nv_bfloat16*>(x.data_ptr()), p, out, M, N, K); \
    break;
  switch (type) {
    QG_CASE(7)
    QG_CASE(9)
    default:
      TORCH_CHECK(false, "unknown type id ", type);
  }
  return y;
}
"""


@pytest.fixture(scope="module")
def ext():
    from torch.utils.cpp_extension import load_inline

    src = SHIM + SOURCE.read_text() + GLUE
    return load_inline(
        name="quantrt_gguf_gemv_emulated",
        cpp_sources=[src],
        functions=["emulate"],
        extra_cflags=["-O1", "-std=c++17"],
        verbose=False,
    )


#: llama.cpp's block layouts: (elements, bytes) and the byte offsets of the fp16 scales in a block
BLOCK = {"q4_k": (256, 144, (0, 2)), "q6_k": (256, 210, (208,))}


def planes_of(q: torch.Tensor, t: str, N: int, K: int) -> list[torch.Tensor]:
    """The kernel's planes, imported late: importing a Triton module before tests/triton/conftest.py
    sets TRITON_INTERPRET would build its kernels for a GPU in this process."""
    from quantrt.backends.triton.gguf import gguf_planes, plane_list

    return plane_list(gguf_planes(q, t, N, K), t)


def random_blocks(t: str, N: int, K: int, g: torch.Generator) -> torch.Tensor:
    """Random bytes in every field (all codes, scales, mins, signs) with finite fp16 block scales."""
    B, T, d_offsets = BLOCK[t]
    blocks = torch.randint(0, 256, (N, K // B, T), generator=g, dtype=torch.uint8)
    for off in d_offsets:
        d = (torch.rand(N, K // B, generator=g) * 2 - 1).half()
        blocks[:, :, off : off + 2] = d.view(torch.uint8).reshape(N, K // B, 2)
    return blocks.reshape(N, -1)


@pytest.mark.parametrize("t", list(gguf_gemv.TYPE_ID))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_lane_decode_matches_gguf_py(ext, t: str, dtype: torch.dtype) -> None:
    B = BLOCK[t][0]
    g = torch.Generator().manual_seed(3)
    # K: one block short of a step (idle lanes), several steps plus a partial one, one block
    for K, N in [(B * 3, 5), (gguf_gemv.STEP_WEIGHTS[t] * 2 + B, 3), (B, 2)]:
        q = random_blocks(t, N, K, g)
        w = gguf_dequantize(q.numpy(), gguf.GGMLQuantizationType[t.upper()]).reshape(N, K).astype(np.float64)
        x = torch.randn(3, K, generator=g).to(dtype)
        planes = planes_of(q, t, N, K)
        y = ext.emulate(x.view(torch.int16), planes, gguf_gemv.TYPE_ID[t], N, K, dtype == torch.float16)
        ref = x.double().numpy() @ w.T
        err = np.linalg.norm(y.double().numpy() - ref) / np.linalg.norm(ref)
        assert err < 1e-5, (t, K, N, err)


def test_a_wrong_lane_mapping_is_caught(ext) -> None:
    """The check can fail: the same planes with two code bytes swapped give another result."""
    t, K, N = "q4_k", 512, 2
    q = random_blocks(t, N, K, torch.Generator().manual_seed(5))
    w = gguf_dequantize(q.numpy(), gguf.GGMLQuantizationType.Q4_K).reshape(N, K).astype(np.float64)
    planes = planes_of(q, t, N, K)
    planes[1] = planes[1].clone()
    planes[1][:, [0, 17]] = planes[1][:, [17, 0]]
    x = torch.randn(1, K, dtype=torch.float64).to(torch.bfloat16)
    y = ext.emulate(x.view(torch.int16), planes, gguf_gemv.TYPE_ID[t], N, K, False)
    ref = x.double().numpy() @ w.T
    assert np.linalg.norm(y.double().numpy() - ref) / np.linalg.norm(ref) > 1e-4
