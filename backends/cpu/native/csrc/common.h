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


#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// 16 fp32 values rounded once to dtype odt (exactly as f32_to_bf16 / f32_to_f16 / a copy) and
// stored at out[i + j], j < 16 in the mask; with `cols`, at out[cols[j]] instead (act-order). The
// bf16 rounding is integer RNE (vcvtneps2bf16 would flush denormals), NaN quieted as f32_to_bf16.
inline __m256i f32_to_bf16x16_rne(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}

inline void store16_rounded(void* out, int32_t odt, int64_t i, __m512 v, __mmask16 m = 0xFFFF,
                            const int32_t* cols = nullptr) {
  if (cols) {
    alignas(64) float f[16];
    alignas(32) uint16_t h[16];
    if (odt == BF16) _mm256_store_si256(reinterpret_cast<__m256i*>(h), f32_to_bf16x16_rne(v));
    else if (odt == F16)
      _mm256_store_si256(reinterpret_cast<__m256i*>(h), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    else _mm512_store_ps(f, v);
    for (int j = 0; j < 16; ++j) {
      if (!((m >> j) & 1)) continue;
      if (odt == F32) static_cast<float*>(out)[cols[j]] = f[j];
      else static_cast<uint16_t*>(out)[cols[j]] = h[j];
    }
    return;
  }
  if (m == 0xFFFF) {
    switch (odt) {
      case BF16: _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + i), f32_to_bf16x16_rne(v)); break;
      case F16:
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + i),
                            _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        break;
      default: _mm512_storeu_ps(static_cast<float*>(out) + i, v);
    }
    return;
  }
  switch (odt) {
    case BF16: _mm256_mask_storeu_epi16(static_cast<uint16_t*>(out) + i, m, f32_to_bf16x16_rne(v)); break;
    case F16:
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(out) + i, m,
                               _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      break;
    default: _mm512_mask_storeu_ps(static_cast<float*>(out) + i, m, v);
  }
}
#endif

}  // namespace qrt
