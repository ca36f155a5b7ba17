// Code-book and float weight-only linear layers (NF4, bitsandbytes FP4, NVFP4, MXFP4, fp8 e4m3/e5m2)
// for x86 CPUs with AVX2 + FMA (x86-64-v3). They read lut.cpp's prepared layout unchanged (tiles of
// 16 output rows, steps of 8 four-bit or 2 eight-bit codes of every row; see there), so one prepare
// serves the AVX-512 and the AVX2 builds; the descriptor adds one field, an fp32 copy of the 16-entry
// code book (exact: no bf16 rounding, so no residual table).
//
// A tile's 16 rows are two halves of 8, one fp32 lane per row; in a 4-bit step's 32 bytes of a half,
// row r's lane holds its 8 codes: code k0 + 2p + e at bit 16e + 4p. A code becomes its fp32 value
// through two 8-entry table permutes (vpermps reads the low 3 index bits) blended on the code's bit 3,
// or, for e2m1 books (NVFP4, MXFP4), through a byte table (Step<E2M1>, half the work); an fp8 code
// through its bits: e4m3 into fp32's fields then times 2^120 (exact, subnormals too), e5m2
// as the high byte of an fp16. Products are fused multiply-adds into fp32 accumulators per fold, the
// fold's block scales (fp32, e4m3 or e8m0) applied once per fold, the row multiplier at the end:
//   y[n] = rowscale[n] * sum_f s[n, f] * sum_{k in f} w[n, k] x[k] + bias[n].
// Strategy: one pass over the codes per 4 activation rows, threads taking tiles.
#include "avx2.h"
#include "layouts.h"

#include <algorithm>
#include <cmath>

namespace {

constexpr int TILE = 16;
// the codes are asked for this many bytes ahead, as in wint_avx2.cpp
#ifndef QRT_LUT_PREFETCH  // overridable for tuning builds
#define QRT_LUT_PREFETCH 2048
#endif
constexpr int64_t kPrefetch = QRT_LUT_PREFETCH;

using qrt::Scratch;
thread_local Scratch tl_x, tl_sum;

#ifdef QRT_AVX2
#define QRT_LUT_AVX2 1
using qrt::YView;

// 8 e4m3 codes, each at bits 20-27 of its lane with its sign copied above, to fp32: the sign,
// exponent and mantissa fields kept where fp32 has them, then rebiased by 2^(127 - 7)
inline __m256 e4m3_at20(__m256i v) {
  const __m256i b = _mm256_and_si256(v, _mm256_set1_epi32(int32_t(0x87F00000u)));
  return _mm256_mul_ps(_mm256_castsi256_ps(b), _mm256_set1_ps(0x1p120f));
}

// the 8 block scales of rows 8h.. of fold f as fp32
inline __m256 fold_scale(int sk, const void* s, int64_t off) {
  switch (sk) {
    case SK_F32: return _mm256_loadu_ps(static_cast<const float*>(s) + off);
    case SK_E4M3: {
      const __m256i e = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const uint8_t*>(s) + off)));
      return e4m3_at20(_mm256_slli_epi32(e, 20));
    }
    case SK_E8M0: {  // 2^(E - 127); E = 0 is the subnormal 2^-127 (the loader rejects E = 255)
      const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const uint8_t*>(s) + off)));
      const __m256i z = _mm256_cmpeq_epi32(e, _mm256_setzero_si256());
      return _mm256_castsi256_ps(_mm256_blendv_epi8(_mm256_slli_epi32(e, 23), _mm256_set1_epi32(1 << 22), z));
    }
    default: return _mm256_set1_ps(1.0f);
  }
}

struct Book {
  __m256 lo, hi;  // code values 0-7, 8-15
  __m256i b2;     // e2m1 books: 2 * value + 12 (0 .. 24) per code, as bytes in both lanes
};

// Step kinds: 4-bit codes through the fp32 tables, e2m1 codes through the byte table, 8-bit codes
constexpr int BOOK = 4, E2M1 = 2, FP8 = 8;

// 4-bit: code j = 2p + e of the 8 rows of half h of one step, as fp32 values
template <int B>
struct Step;
template <>
struct Step<BOOK> {
  static constexpr int S = 8, BYTES = 64;
  static inline void run(const uint8_t* q, int h, const Book& bk, int, __m256* c) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * h));
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const int at = 16 * (j & 1) + 4 * (j >> 1);
      const __m256i idx = at ? _mm256_srli_epi32(v, at) : v;
      const __m256 sel = _mm256_castsi256_ps(at == 28 ? v : _mm256_slli_epi32(v, 28 - at));  // bit 3 -> bit 31
      c[j] = _mm256_blendv_ps(_mm256_permutevar8x32_ps(bk.lo, idx), _mm256_permutevar8x32_ps(bk.hi, idx), sel);
    }
  }
};
// e2m1 (NVFP4, MXFP4): 2 * value + 12 is a byte below 128, so one VPSHUFB turns the low nibbles of
// every byte into their values and one the high ones: row r's lane then holds 4 of its codes' values
// in its 4 bytes (low nibbles: codes k0, k0 + 4, k0 + 1, k0 + 5; high: k0 + 2, k0 + 6, k0 + 3, k0 + 7).
// Byte t of a lane is masked where it lies and converted: (2v + 12) * 2^(8t), met by x[k] * 2^-(8t+1)
// (prepared once per call); the fold removes 6 * sum(x).
template <>
struct Step<E2M1> {
  static constexpr int S = 8, BYTES = 64;
  // the byte of each code j, and whether it comes from the high nibbles
  static constexpr int T[8] = {0, 2, 0, 2, 1, 3, 1, 3};
  static constexpr bool HI[8] = {false, false, true, true, false, false, true, true};
  static inline void run(const uint8_t* q, int h, const Book& bk, int, __m256* c) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * h));
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m256i lo = _mm256_shuffle_epi8(bk.b2, _mm256_and_si256(v, m4));
    const __m256i hi = _mm256_shuffle_epi8(bk.b2, _mm256_and_si256(_mm256_srli_epi32(v, 4), m4));
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j)
      c[j] = _mm256_cvtepi32_ps(_mm256_and_si256(HI[j] ? hi : lo, _mm256_set1_epi32(int32_t(0xFFu << (8 * T[j])))));
  }
};
// 8-bit: byte 2r + e of a half's 16 bytes is code (r, k0 + e)
template <>
struct Step<FP8> {
  static constexpr int S = 2, BYTES = 32;
  static inline void run(const uint8_t* q, int h, const Book&, int fmt, __m256* c) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * h));
    if (fmt == E5M2) {  // the high byte of an fp16
      c[0] = _mm256_cvtph_ps(_mm_slli_epi16(v, 8));
      c[1] = _mm256_cvtph_ps(_mm_and_si128(v, _mm_set1_epi16(int16_t(0xFF00))));
      return;
    }
    const __m256i w = _mm256_cvtepi16_epi32(v);  // lane r: byte 2r + 1 signed, then byte 2r
    c[0] = e4m3_at20(_mm256_srai_epi32(_mm256_slli_epi32(w, 24), 4));
    c[1] = e4m3_at20(_mm256_slli_epi32(w, 12));
  }
};

// the 16 fp32 results (before the row multiplier and bias) of tile t for R activation rows
template <int B, int R>
void gemv_tile(const int64_t* d, const Book& bk, int fmt, int64_t t, const float* xs, const float* xsum, int64_t nf,
               __m256 (&tot)[R][2]) {
  using D = Step<B>;
  constexpr int S = D::S, NA = R == 1 ? 4 : (R == 2 ? 2 : 1);  // accumulators per row and half
  const int64_t Kp = d[L_KP], steps = Kp / S, fsteps = d[L_FOLD] / S, ng = d[L_NG];
  const int sk = int(d[L_SKIND]);
  const uint8_t* q = reinterpret_cast<const uint8_t*>(d[L_Q]) + t * steps * D::BYTES;
  const int64_t esz = sk == SK_F32 ? 4 : 1;
  const char* sc = reinterpret_cast<const char*>(d[L_SCALES]) + t * ng * TILE * esz;
  for (int r = 0; r < R; ++r) tot[r][0] = tot[r][1] = _mm256_setzero_ps();
  for (int64_t s0 = 0, f = 0; s0 < steps; s0 += fsteps, ++f) {
    const int64_t s1 = std::min(steps, s0 + fsteps);
    __m256 acc[R][2][NA];
    for (int r = 0; r < R; ++r)
      for (int h = 0; h < 2; ++h)
        for (int a = 0; a < NA; ++a) acc[r][h][a] = _mm256_setzero_ps();
    for (int64_t s = s0; s < s1; ++s) {
      _mm_prefetch(reinterpret_cast<const char*>(q + s * D::BYTES) + kPrefetch, _MM_HINT_T0);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        __m256 c[S];
        D::run(q + s * D::BYTES, h, bk, fmt, c);
#pragma GCC unroll 8
        for (int j = 0; j < S; ++j)
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r)
            acc[r][h][j % NA] = _mm256_fmadd_ps(c[j], _mm256_broadcast_ss(xs + r * Kp + s * S + j), acc[r][h][j % NA]);
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 sv = fold_scale(sk, sc, f * TILE + 8 * h);
      for (int r = 0; r < R; ++r) {
        __m256 a = acc[r][h][0];
        for (int i = 1; i < NA; ++i) a = _mm256_add_ps(a, acc[r][h][i]);
        if constexpr (B == E2M1) a = _mm256_sub_ps(a, _mm256_set1_ps(6.f * xsum[r * nf + f]));
        tot[r][h] = _mm256_fmadd_ps(a, sv, tot[r][h]);
      }
    }
  }
}

template <int B, int R>
void gemv_rows(const int64_t* d, const Book& bk, int fmt, const float* xs, const float* xsum, int64_t nf,
               const YView& y, int64_t m0, int threads) {
  qrt::tiles_in_parallel<R>(d[L_T], threads, y, m0, [&](int64_t t, float (&v)[R][16]) {
    __m256 tot[R][2];
    gemv_tile<B, R>(d, bk, fmt, t, xs, xsum, nf, tot);
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(v[r], tot[r][0]), _mm256_storeu_ps(v[r] + 8, tot[r][1]);
  });
}

template <int B>
int run(const int64_t* d, const void* x, int32_t xdt, int64_t M, int64_t sxm, int64_t sxk, const YView& y,
        int threads) {
  const int64_t K = d[L_K], Kp = d[L_KP], fold = d[L_FOLD], nf = (Kp + fold - 1) / fold;
  float* xs = static_cast<float*>(tl_x.get(sizeof(float) * M * Kp));
  float* xsum = static_cast<float*>(tl_sum.get(sizeof(float) * M * nf));
  if (!xs || !xsum) return 2;
  for (int64_t m = 0; m < M; ++m) {
    float* row = xs + m * Kp;
    qrt::row_f32(x, xdt, m * sxm, sxk, nullptr, K, Kp, row);
    if constexpr (B == E2M1) {  // the fold sums, then code j of each step scaled by 2^-(8 T[j] + 1)
      for (int64_t f = 0; f < nf; ++f) {
        float sum = 0.f;
        for (int64_t k = f * fold; k < std::min(Kp, (f + 1) * fold); ++k) sum += row[k];
        xsum[m * nf + f] = sum;
      }
      alignas(32) float mul[8];
      for (int j = 0; j < 8; ++j) mul[j] = std::ldexp(1.f, -(8 * Step<E2M1>::T[j] + 1));
      const __m256 vm = _mm256_load_ps(mul);
      for (int64_t k = 0; k < Kp; k += 8) _mm256_storeu_ps(row + k, _mm256_mul_ps(_mm256_loadu_ps(row + k), vm));
    }
  }
  Book bk{_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_si256()};
  const int fmt = int(d[L_FP8]);
  if constexpr (B != FP8) {
    const float* t32 = reinterpret_cast<const float*>(d[L_TAB32]);
    bk.lo = _mm256_loadu_ps(t32);
    bk.hi = _mm256_loadu_ps(t32 + 8);
    alignas(32) int8_t b2[32];
    for (int i = 0; i < 32; ++i) b2[i] = int8_t(2.f * t32[i % 16] + 12.f);
    bk.b2 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b2));
  }
  qrt::row_passes(M, [&](int64_t m0, auto r) {
    gemv_rows<B, decltype(r)::value>(d, bk, fmt, xs + m0 * Kp, xsum + m0 * nf, nf, y, m0, threads);
  });
  return 0;
}

// whether a 16-entry code book is e2m1's: every 2 * value an integer in [-12, 12]
bool e2m1_book(const float* t32) {
  for (int i = 0; i < 16; ++i) {
    const float v = 2.f * t32[i];
    if (!(v >= -12.f && v <= 12.f) || v != std::nearbyint(v)) return false;
  }
  return true;
}
#endif

}  // namespace

extern "C" {

// y[M, N] = x[M, K] @ W.T + bias for a prepared code-book or fp8 weight `d` (lut.cpp's layout and
// descriptor, plus the fp32 code book), with the ABI of quantrt_lut_linear (the strategy argument is
// accepted and ignored: one GEMV). Returns 0, 1 when not compiled, 2 when out of memory.
int32_t quantrt_lut_avx2_linear(const int64_t* d, const void* x, int32_t xdt, int64_t M, int64_t sxm, int64_t sxk,
                                const void* bias, int32_t bdt, void* y, int32_t ydt, int64_t ldy, int32_t threads,
                                int32_t strategy) {
  (void)strategy;
#ifdef QRT_LUT_AVX2
  if (M <= 0) return 0;
  threads = std::max(threads, 1);
  const YView yv{y, ydt, ldy, bias, bdt, d[L_N], reinterpret_cast<const float*>(d[L_ROWSCALE])};
  if (d[L_BITS] == 8) return run<FP8>(d, x, xdt, M, sxm, sxk, yv, threads);
  return e2m1_book(reinterpret_cast<const float*>(d[L_TAB32])) ? run<E2M1>(d, x, xdt, M, sxm, sxk, yv, threads)
                                                               : run<BOOK>(d, x, xdt, M, sxm, sxk, yv, threads);
#else
  (void)d, (void)x, (void)xdt, (void)M, (void)sxm, (void)sxk, (void)bias, (void)bdt, (void)y, (void)ydt, (void)ldy;
  (void)threads;
  return 1;
#endif
}

}  // extern "C"
