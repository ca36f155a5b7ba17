// Shared helpers for quantrt's native CPU kernels: activation dtypes, fp16/bf16 conversion,
// and splitting work over the caller's thread count. Every kernel library includes this header
// and exports plain extern "C" functions (see build.py).
#pragma once
#include <cstdint>
#include <cstring>
#include <immintrin.h>
#include <omp.h>

namespace qrt {

// dtype codes the Python side passes for activations and outputs
enum DType : int32_t { F32 = 0, BF16 = 1, F16 = 2 };

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// round-to-nearest-even, NaN kept quiet (torch's conversion)
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t f32_to_f16(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

inline float load_act(const void* p, int64_t i, int32_t dtype) {
  switch (dtype) {
    case BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case F16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

inline void store_out(void* p, int64_t i, float v, int32_t dtype) {
  switch (dtype) {
    case BF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    case F16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
    default: static_cast<float*>(p)[i] = v;
  }
}

// a row of n activations of any dtype as fp32 (dst holds n floats)
inline void row_to_f32(const void* src, int64_t n, int32_t dtype, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = load_act(src, i, dtype);
}

}  // namespace qrt
