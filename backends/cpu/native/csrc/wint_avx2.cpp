// Integer weight-only linear layers (int2/int3/int4/int8 codes, fp32/bf16/fp16 activations) for x86
// CPUs with AVX2 + FMA (x86-64-v3: no AVX-512, no bf16 dot products). They read the prepared layout
// of wint.cpp unchanged (tiles of 16 output rows, "steps" of 2, 4 or 8 codes of every row; see there),
// so one prepare serves the AVX-512 and the AVX2 builds.
//
// A tile's 16 rows are two halves of 8, one fp32 lane per row. A step is decoded to fp32 codes with
// one AND and one int -> float conversion per 8 codes: a 4-bit or 2-bit code is masked where it lies
// in its row's 16-bit word (bit position p), converted as c * 2^p, and met by x[k] * 2^-p, which the
// activation preparation scaled once per call (exact: a power of two; only subnormal products could
// lose bits). The products are fused multiply-adds into fp32 accumulators per fold (the group, or
// 256 codes for channel scales), which apply the fold's scales and zero points through the fold's
// activation sum: y = sum_f s_f * (sum_{k in f} c x - z_f * sum_{k in f} x), with c the unsigned code
// and z_f its zero point (2^(b-1) when symmetric). 8-bit codes are stored centred (c - 128) and stay
// so, their zero point taken as z - 128.
//
// Strategy: one pass over the codes per 4 activation rows (each step decoded once for them), threads
// taking tiles.
#include "avx2.h"
#include "layouts.h"
#include "wint_gemv.h"

#include <algorithm>
#include <cstdlib>

namespace {

using qrt::BF16;
using qrt::F16;
using qrt::F32;

constexpr int TILE = 16;
// the codes are asked for this many bytes ahead (every other step: a 64-byte line holds two or more)
#ifndef QRT_WINT_PREFETCH  // overridable for tuning builds
#define QRT_WINT_PREFETCH 2048
#endif
constexpr int64_t kPrefetch = QRT_WINT_PREFETCH;

using qrt::Scratch;
thread_local Scratch tl_x, tl_sum;

#ifdef QRT_AVX2
#define QRT_WINT_AVX2 1
using qrt::hsum8;
using qrt::YView;

template <int B>
using Step = WintStep<B>;

// code j of the 8 rows of half h of one step, as fp32 (times 2^P[j])
template <int B>
inline void decode(const uint8_t* q, int h, __m256* c) {
  constexpr int S = Step<B>::S;
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * h)));
  if constexpr (B == 8) {
    const __m256i sw = _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * h)));
    c[0] = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(sw, 24), 24));
    c[1] = _mm256_cvtepi32_ps(_mm256_srai_epi32(sw, 8));
  } else if constexpr (B == 3) {
    // low two bits as for 2 bits; bit 2 of code (r, k0 + 2f + e) is bit 2r + e of mask f
    const __m256i lane2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m256i shift = _mm256_add_epi32(lane2, _mm256_set1_epi32(16 * h));
    for (int f = 0; f < 4; ++f) {
      int32_t m;
      std::memcpy(&m, q + 32 + 4 * f, 4);
      const __m256i hb = _mm256_srlv_epi32(_mm256_set1_epi32(m), shift);
      for (int e = 0; e < 2; ++e) {
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi32(w, 2 * f + 8 * e), _mm256_set1_epi32(3));
        const __m256i hi = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hb, e), _mm256_set1_epi32(1)), 2);
        c[2 * f + e] = _mm256_cvtepi32_ps(_mm256_or_si256(lo, hi));
      }
    }
  } else {
    const int mask = B == 4 ? 15 : 3;
#pragma GCC unroll 8
    for (int j = 0; j < S; ++j)
      c[j] = _mm256_cvtepi32_ps(_mm256_and_si256(w, _mm256_set1_epi32(mask << Step<B>::P[j])));
  }
}

// x rows as fp32, zero from K to Kp, columns gathered through perm, code k of a step scaled by
// 2^-P[k mod S]; xsum[m][f] = the unscaled sum of row m over fold f
template <int B>
void xprep(const void* x, int32_t dt, int64_t M, int64_t sm, int64_t sk, const int32_t* perm, int64_t K,
           int64_t Kp, int64_t fold, int64_t nf, float* xs, float* xsum) {
  constexpr int S = Step<B>::S;
  alignas(32) float mul[8];
  for (int j = 0; j < 8; ++j) mul[j] = 1.f / float(1 << Step<B>::P[j % S]);
  const __m256 vmul = _mm256_load_ps(mul);
  for (int64_t m = 0; m < M; ++m) {
    float* row = xs + m * Kp;
    int64_t k = 0;
    if (!perm && sk == 1) {  // 8 at a time, scaled and summed as they are converted
      __m256 vs = _mm256_setzero_ps();
      for (; k + 8 <= K; k += 8) {
        const __m256 v = qrt::load8(x, dt, m * sm + k);
        vs = _mm256_add_ps(vs, v);
        _mm256_storeu_ps(row + k, _mm256_mul_ps(v, vmul));
        if ((k + 8) % fold == 0) {
          xsum[m * nf + k / fold] = hsum8(vs);
          vs = _mm256_setzero_ps();
        }
      }
      if (k % fold == 0 && k == K) {
        for (int64_t r = k; r < Kp; ++r) row[r] = 0.f;
        continue;  // every fold summed (Kp == K here, or only padding beyond)
      }
      k -= k % fold;  // the unfinished fold again, element by element
    }
    wint_prep_row<B>(x, dt, m * sm, sk, perm, K, Kp, fold, nf, k, row, xsum + m * nf);
  }
}

// the 16 fp32 results (before bias) of tile t for R activation rows
template <int B, int R>
void gemv_tile(const int64_t* d, int64_t t, const float* xs, const float* xsum, int64_t nf, __m256 (&tot)[R][2]) {
  constexpr int S = Step<B>::S, NA = R == 1 ? 4 : (R == 2 ? 2 : 1);  // accumulators per row and half
  const int64_t Kp = d[W_KP], steps = Kp / S, fsteps = d[W_FOLD] / S, sstr = d[W_SSTRIDE] * TILE;
  const uint8_t* q = reinterpret_cast<const uint8_t*>(d[W_Q]) + t * steps * Step<B>::BYTES;
  const float* sc = reinterpret_cast<const float*>(d[W_SCALES]) + t * d[W_NG] * TILE;
  const int16_t* zr = d[W_ZEROS] ? reinterpret_cast<const int16_t*>(d[W_ZEROS]) + t * d[W_NG] * TILE : nullptr;
  // the zero point of an unsigned code: stored z - 2^(b-1) plus 2^(b-1); of a centred 8-bit one: z - 128
  const int32_t zbase = B == 8 ? 0 : 1 << (B - 1);
  for (int r = 0; r < R; ++r) tot[r][0] = tot[r][1] = _mm256_setzero_ps();
  for (int64_t s0 = 0, f = 0; s0 < steps; s0 += fsteps, ++f) {
    const int64_t s1 = std::min(steps, s0 + fsteps);
    __m256 acc[R][2][NA];
    for (int r = 0; r < R; ++r)
      for (int h = 0; h < 2; ++h)
        for (int a = 0; a < NA; ++a) acc[r][h][a] = _mm256_setzero_ps();
    for (int64_t s = s0; s < s1; ++s) {
      const uint8_t* p = q + s * Step<B>::BYTES;
      if ((s & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetch, _MM_HINT_T0);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        __m256 c[S];
        decode<B>(p, h, c);
#pragma GCC unroll 8
        for (int j = 0; j < S; ++j)
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r)
            acc[r][h][j % NA] = _mm256_fmadd_ps(c[j], _mm256_broadcast_ss(xs + r * Kp + s * S + j), acc[r][h][j % NA]);
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 sv = _mm256_loadu_ps(sc + f * sstr + 8 * h);
      __m256i zi = _mm256_set1_epi32(zbase);
      if (zr)
        zi = _mm256_add_epi32(zi, _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(zr + f * sstr + 8 * h))));
      const __m256 sz = _mm256_mul_ps(sv, _mm256_cvtepi32_ps(zi));
      for (int r = 0; r < R; ++r) {
        __m256 a = acc[r][h][0];
        for (int i = 1; i < NA; ++i) a = _mm256_add_ps(a, acc[r][h][i]);
        tot[r][h] = _mm256_fmadd_ps(a, sv, tot[r][h]);
        tot[r][h] = _mm256_fnmadd_ps(sz, _mm256_set1_ps(xsum[r * nf + f]), tot[r][h]);
      }
    }
  }
}

template <int B, int R>
void gemv_rows(const int64_t* d, const float* xs, const float* xsum, int64_t nf, const YView& y, int64_t m0,
               int threads) {
  qrt::tiles_in_parallel<R>(d[W_T], threads, y, m0, [&](int64_t t, float (&v)[R][16]) {
    __m256 tot[R][2];
    gemv_tile<B, R>(d, t, xs, xsum, nf, tot);
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(v[r], tot[r][0]), _mm256_storeu_ps(v[r] + 8, tot[r][1]);
  });
}

// this build's two templates, for wint_gemv.h's call
struct Isa {
  template <int B, class... A>
  static void prep(A... a) { xprep<B>(a...); }
  template <int B, int R, class... A>
  static void rows(A... a) { gemv_rows<B, R>(a...); }
};
#endif

}  // namespace

extern "C" {

// y[M, N] = x[M, K] @ W.T + bias for a prepared integer weight `d` (wint.cpp's layout and descriptor),
// with the ABI of quantrt_wint_linear (the strategy argument is accepted and ignored: one GEMV).
// Returns 0, 1 when not compiled, 2 when out of memory.
int32_t quantrt_wint_avx2_linear(const int64_t* d, const void* x, int32_t xdt, int64_t M, int64_t sxm,
                                 int64_t sxk, const void* bias, int32_t bdt, void* y, int32_t ydt, int64_t ldy,
                                 int32_t threads, int32_t strategy) {
  (void)strategy;
#ifdef QRT_WINT_AVX2
  return qrt::wint_linear<Isa>(d, x, xdt, M, sxm, sxk, bias, bdt, y, ydt, ldy, threads, tl_x, tl_sum);
#else
  (void)d, (void)x, (void)xdt, (void)M, (void)sxm, (void)sxk, (void)bias, (void)bdt, (void)y, (void)ydt, (void)ldy;
  (void)threads;
  return 1;
#endif
}

}  // extern "C"
