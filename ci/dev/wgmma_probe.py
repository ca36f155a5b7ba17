"""Probe (GPU machine): can CuPy/NVRTC build sm_90a code, and what do wgmma's B descriptor fields mean?"""

import traceback

import cupy
import numpy as np

SRC = r"""
#include <cuda_bf16.h>
typedef unsigned int u32;
__device__ __forceinline__ unsigned long long desc(const void* p, u32 lbo, u32 sbo) {
  u32 a = (u32)__cvta_generic_to_shared(p);
  return (unsigned long long)((a & 0x3FFFF) >> 4) | ((unsigned long long)((lbo >> 4) & 0x3FFF) << 16) |
         ((unsigned long long)((sbo >> 4) & 0x3FFF) << 32);
}
// A [64][16] bf16 row-major, B given as Bt [16 n][16 k] bf16, D [64][16] f32
extern "C" __global__ void probe(const __nv_bfloat16* A, const __nv_bfloat16* Bt, float* D, int lbo, int sbo) {
  __shared__ __align__(128) __nv_bfloat16 sb[16 * 16];
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  // smem: core matrix (ng, kh) at (ng * 2 + kh) * 64 elements, row r of it (n = 8ng + r) = k 8kh..8kh+7
  for (int e = tid; e < 256; e += 128) {
    int n = e / 16, k = e % 16, ng = n / 8, r = n % 8, kh = k / 8;
    sb[(ng * 2 + kh) * 64 + r * 8 + (k % 8)] = Bt[n * 16 + k];
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  auto pr = [&](int row, int col) {
    __nv_bfloat162 v; v.x = A[row * 16 + col]; v.y = A[row * 16 + col + 1];
    return *reinterpret_cast<u32*>(&v);
  };
  u32 a0 = pr(16 * w + g, 2 * t), a1 = pr(16 * w + g + 8, 2 * t), a2 = pr(16 * w + g, 2 * t + 8),
      a3 = pr(16 * w + g + 8, 2 * t + 8);
  float d[8];
  for (int i = 0; i < 8; i++) d[i] = 0.f;
  unsigned long long db = desc(sb, lbo, sbo);
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(1));
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  for (int j = 0; j < 2; j++)
    for (int r = 0; r < 4; r++) D[(16 * w + g + 8 * (r >> 1)) * 16 + 8 * j + 2 * t + (r & 1)] = d[4 * j + r];
}
"""


def build_rawmodule():
    m = cupy.RawModule(code=SRC, options=("--std=c++17", "-arch=sm_90a"))
    return m.get_function("probe")


def build_nvrtc():
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(SRC, "probe.cu", (), ())
    try:
        nvrtc.compileProgram(prog, ("--std=c++17", "-arch=sm_90a"))
    except Exception:
        print(nvrtc.getProgramLog(prog))
        raise
    cubin = nvrtc.getCUBIN(prog)
    mod = cupy.cuda.function.Module()
    mod.load(cubin)
    return mod.get_function("probe")


def main():
    rng = np.random.default_rng(0)
    A = rng.integers(-3, 4, (64, 16)).astype(np.float32)
    Bt = rng.integers(-3, 4, (16, 16)).astype(np.float32)
    ref = A @ Bt.T
    bf = lambda a: cupy.asarray(a).astype(cupy.float32).view(cupy.uint32) >> 16  # noqa: E731
    Ad = (bf(A)).astype(cupy.uint16)
    Bd = (bf(Bt)).astype(cupy.uint16)
    for name, build in (("rawmodule", build_rawmodule), ("nvrtc", build_nvrtc)):
        try:
            fn = build()
        except Exception:
            print(name, "build failed:", traceback.format_exc()[-600:])
            continue
        for lbo, sbo in ((128, 256), (256, 128)):
            D = cupy.zeros((64, 16), dtype=cupy.float32)
            fn((1,), (128,), (Ad, Bd, D, np.int32(lbo), np.int32(sbo)))
            cupy.cuda.runtime.deviceSynchronize()
            err = float(np.abs(cupy.asnumpy(D) - ref).max())
            print(f"{name} lbo={lbo} sbo={sbo}: max err {err}")


if __name__ == "__main__":
    main()
