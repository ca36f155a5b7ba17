// Helpers shared by the AVX2 (x86-64-v3) kernels: activations to fp32, horizontal sums, and the
// output epilogue of a 16-row tile. Compiled only where AVX2, FMA and F16C are enabled.
#pragma once
#include "common.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QRT_AVX2 1

namespace qrt {

// 8 consecutive activations from element off of p (fp32, bf16 or fp16) as fp32
inline __m256 load8(const void* p, int32_t dt, int64_t off) {
  if (dt == F32) return _mm256_loadu_ps(static_cast<const float*>(p) + off);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + off));
  if (dt == F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// One activation row of K values (element stride sk, columns gathered through perm when given) as
// fp32 in row[0, K), zeros in row[K, Kp).
inline void row_f32(const void* x, int32_t dt, int64_t off, int64_t sk, const int32_t* perm, int64_t K, int64_t Kp,
                    float* row) {
  int64_t k = 0;
  if (sk == 1 && !perm)
    for (; k + 8 <= K; k += 8) _mm256_storeu_ps(row + k, load8(x, dt, off + k));
  for (; k < K; ++k) row[k] = load_act(x, off + (perm ? perm[k] : k) * sk, dt);
  for (; k < Kp; ++k) row[k] = 0.f;
}

}  // namespace qrt
#endif
