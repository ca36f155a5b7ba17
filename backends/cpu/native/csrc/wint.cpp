// Integer weight-only linear layers (int2/int3/int4/int8 codes, fp32/bf16/fp16 activations) and
// W8A8 int8 linear layers, for x86 CPUs with AVX-512 (BF16 for the first, VNNI for the second).
//
// ---- wint: the prepared weight layout (one per weight, every batch size reads it) -------------
// Output rows are cut into tiles of 16 (N padded to Np = 16 T). Along K a tile is a run of
// "steps"; a step holds P pairs of consecutive codes (k, k+1) for all 16 rows, so one step
// covers S = 2P codes of every row (K padded to Kp, a multiple of S, with the code of zero):
//   bits 8: P=1, 32 bytes: byte 2r+e = code(row r, k0+e) - 128, as int8
//   bits 4: P=2, 32 bytes: byte 2r+e = code(r, k0+e) | code(r, k0+2+e) << 4
//   bits 2: P=4, 32 bytes: byte 2r+e = sum_f code(r, k0+2f+e) << 2f
//   bits 3: P=4, 48 bytes: 32 bytes of the low two bits laid out as bits 2, then four
//           little-endian uint32 masks: bit 2r+e of mask f = bit 2 of code(r, k0+2f+e)
// Decoding a step yields P vectors of 32 bf16 words, word 2r+e = code - 2^(b-1) (an exact small
// integer) for row r and code k0+2p+e of pair p: the operand layout of _mm512_dpbf16_ps against
// a broadcast pair (x[k], x[k+1]), so each fp32 lane accumulates one output row.
//   scales fp32 [T][ng][16]: scale column g of the tile's 16 rows (ng = 1 for channel scales)
//   zeros  int16 [T][ng][16]: z - 2^(b-1), asymmetric weights only
// Scales are applied in fp32 per "fold" of `fold` codes (the group size, or any length for
// channel scales): y = sum_f s_f * (sum_{k in f} (q - h) x - (z_f - h) * sum_{k in f} x).
// Activations are split into bf16 parts whose sum is x (1 part for bf16, 2 for fp16: exact,
// 3 for fp32: exact to fp32's 24 bits), so every product is exact and sums are fp32.
//
// Strategies over that one layout (Python picks by M with a threshold fixed at prepare):
//   GEMV (small M): threads take tiles; each step is decoded once and multiplied with up to 8 rows
//     of x (pair-interleaved, so the broadcasts of one k share a cache line), accumulators in
//     registers, scales folded per group.
//   panel GEMM (large M): threads take blocks of 4 tiles (64 rows); per K chunk of kc codes the
//     block is decoded into a bf16 panel [kc/2][4][32] (256 KiB, stays in L2), then a 6 x 64
//     register-blocked dpbf16 micro-kernel runs every row of x over it, folding each group into an
//     fp32 tile C [M][64]; the epilogue adds the bias and converts to the output dtype.
//
// ---- w8a8: the prepared weight layout ---------------------------------------------------------
// qweight uint8 [T][Kp/4][16][4]: byte 4r+i of quad j = code(row r, 4j+i) (zero point 128,
// padding 128); scales fp32 [Np]. _mm512_dpbusd_epi32 takes the codes as the unsigned operand
// and the activations' int8 codes as the signed one; the 128 offset is removed per row of x:
// y = a_m * s_n * (sum_k q x - 128 sum_k x). The GEMV and the 6 x 64 micro-kernel read the prepared
// weights directly (nothing to decode), accumulating int32 per K chunk of 4096.
#include "common.h"
#include "layouts.h"

#include <algorithm>
#include <cstdlib>
#include <limits>

namespace {

using qrt::BF16;
using qrt::F16;
using qrt::F32;


constexpr int TILE = 16;
constexpr int NT = 4;  // tiles per block of the large-M path (64 output rows)
constexpr int MR = 6;  // activation rows per micro-kernel call of the large-M path

using qrt::Scratch;
thread_local Scratch tl_x, tl_aux, tl_panel, tl_c;

inline int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

inline int32_t load_u32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define QRT_AVX512 1

inline __m512 bf16x16_to_f32(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// 16 activations x[row_off + col(k + i) * sk], i < 16, as fp32; columns >= K read as 0
inline __m512 load16(const void* x, int32_t dt, int64_t row_off, int64_t k, int64_t K, int64_t sk,
                     const int32_t* perm) {
  const int64_t n = std::min<int64_t>(16, K - k);
  if (n <= 0) return _mm512_setzero_ps();
  if (sk == 1 && !perm) {
    const __mmask16 m = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
    const int64_t o = row_off + k;
    switch (dt) {
      case BF16: return bf16x16_to_f32(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(x) + o));
      case F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(x) + o));
      default: return _mm512_maskz_loadu_ps(m, static_cast<const float*>(x) + o);
    }
  }
  alignas(64) float t[16] = {};
  for (int64_t i = 0; i < n; ++i) t[i] = qrt::load_act(x, row_off + (perm ? perm[k + i] : k + i) * sk, dt);
  return _mm512_load_ps(t);
}

// 16 bias values (fp32/bf16/fp16) from n0, lanes outside the mask 0; no bias gives 0
inline __m512 load_bias(const void* b, int32_t dt, int64_t n0, __mmask16 m) {
  if (!b) return _mm512_setzero_ps();
  switch (dt) {
    case BF16: return bf16x16_to_f32(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(b) + n0));
    case F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(b) + n0));
    default: return _mm512_maskz_loadu_ps(m, static_cast<const float*>(b) + n0);
  }
}

// 16 floats to bf16, round to nearest even (NaN stays NaN), with or without AVX512-BF16
inline __m256i f32_to_bf16x16(__m512 v) {
#ifdef __AVX512BF16__
  return (__m256i)_mm512_cvtneps_pbh(v);
#else
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
#endif
}

inline void store16(void* y, int32_t dt, int64_t off, __m512 v, __mmask16 m) {
  switch (dt) {
    case BF16:
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(y) + off, m, f32_to_bf16x16(v));
      break;
    case F16:
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(y) + off, m,
                               _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      break;
    default: _mm512_mask_storeu_ps(static_cast<float*>(y) + off, m, v);
  }
}

// the rows of a tile that exist (N is not always a multiple of 16)
inline __mmask16 row_mask(int64_t n0, int64_t N) {
  const int64_t n = std::min<int64_t>(16, N - n0);
  return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
}

using qrt::YView;

inline void store_tile_row(const YView& y, int64_t m, int64_t n0, __m512 v) {
  const __mmask16 mk = row_mask(n0, y.N);
  store16(y.p, y.dt, m * y.ld + n0, _mm512_add_ps(v, load_bias(y.bias, y.bdt, n0, mk)), mk);
}

// The micro-kernels keep their R x 4 accumulators in named variables: GCC spills arrays of them.
#define QRT_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)

#endif

#if defined(QRT_AVX512) && defined(__AVX512BF16__)
#define QRT_WINT 1

inline __m256i to_bf16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }

// acc += w . broadcast(pair at p) with the broadcast folded into the instruction (GCC emits a separate
// vpbroadcastd for the intrinsic, one more vector uop per product)
inline __m512 dpbf16_pair(__m512 acc, __m512i w, const uint16_t* p) {
  asm("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}

// ---- activations ------------------------------------------------------------------------------
// x [M, K] (any strides, optional column gather `perm`) -> NP bf16 parts whose sum is x, zero from K
// to ldx, part p at xb + p * M * ldx: rows [M][ldx], or with `pairs` pair-interleaved [ldx/2][M][2]
// (the pairs (x[m][k], x[m][k+1]) of every row side by side, so the GEMV's broadcasts of one k share a
// cache line); and xsum[m][f] = fp32 sum of row m over fold f (when xsum != null).
void xprep(const void* x, int32_t dt, int64_t M, int64_t sm, int64_t sk, const int32_t* perm, int64_t K,
           int64_t ldx, int NP, bool pairs, uint16_t* xb, float* xsum, int64_t fold, int64_t nf, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (M >= 4)
  for (int64_t m = 0; m < M; ++m) {
    __m512 vs = _mm512_setzero_ps();
    for (int64_t k = 0; k < ldx; k += 16) {
      const __m512 v = load16(x, dt, m * sm, k, K, sk, perm);
      __m512 r = v;
      for (int p = 0; p < NP; ++p) {
        const __m256i h = to_bf16(r);
        uint16_t* dst = xb + p * M * ldx;
        if (pairs) {
          alignas(32) uint32_t w[8];
          _mm256_store_si256(reinterpret_cast<__m256i*>(w), h);
          for (int j = 0; j < 8; ++j) std::memcpy(dst + ((k / 2 + j) * M + m) * 2, w + j, 4);
        } else {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + m * ldx + k), h);
        }
        r = _mm512_sub_ps(r, bf16x16_to_f32(h));
      }
      if (xsum) {
        vs = _mm512_add_ps(vs, v);
        if ((k + 16) % fold == 0 || k + 16 >= ldx) {
          const int64_t f = k / fold;
          if (f < nf) xsum[m * nf + f] = _mm512_reduce_add_ps(vs);
          vs = _mm512_setzero_ps();
        }
      }
    }
  }
}

// ---- decoding one step ------------------------------------------------------------------------
template <int B>
struct Dec;

template <>
struct Dec<8> {
  static constexpr int P = 1, BYTES = 32;
  static inline void run(const uint8_t* p, __m512i, __m512i* w) {
    const __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
    const __m512 b = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(p + 16))));
    w[0] = (__m512i)_mm512_cvtne2ps_pbh(b, a);
  }
};

template <>
struct Dec<4> {
  static constexpr int P = 2, BYTES = 32;
  static inline void run(const uint8_t* p, __m512i tab, __m512i* w) {
    const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)p));
    w[0] = _mm512_permutexvar_epi16(v, tab);  // vpermw reads 5 index bits: the table repeats
    w[1] = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), tab);
  }
};

template <>
struct Dec<2> {
  static constexpr int P = 4, BYTES = 32;
  static inline void run(const uint8_t* p, __m512i tab, __m512i* w) {
    const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)p));
    w[0] = _mm512_permutexvar_epi16(v, tab);
    w[1] = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 2), tab);
    w[2] = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), tab);
    w[3] = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 6), tab);
  }
};

template <>
struct Dec<3> {
  static constexpr int P = 4, BYTES = 48;
  static inline void run(const uint8_t* p, __m512i tab, __m512i* w) {
    const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)p));
    const __m512i three = _mm512_set1_epi16(3), four = _mm512_set1_epi16(4);
    for (int f = 0; f < 4; ++f) {
      const __m512i lo = _mm512_and_si512(_mm512_srl_epi16(v, _mm_cvtsi32_si128(2 * f)), three);
      const __mmask32 hi = static_cast<__mmask32>(load_u32(p + 32 + 4 * f));
      w[f] = _mm512_permutexvar_epi16(_mm512_mask_add_epi16(lo, hi, lo, four), tab);
    }
  }
};

// 32 bf16 words: word i = code (i mod 2^b, or i mod 8 for 3 bits) minus 2^(b-1)
template <int B>
__m512i code_table() {
  alignas(64) uint16_t t[32];
  const int mask = B == 3 ? 7 : (1 << B) - 1, half = 1 << (B - 1);
  for (int i = 0; i < 32; ++i) t[i] = qrt::f32_to_bf16(float((i & mask) - half));
  return _mm512_load_si512(t);
}

// ---- small M: one pass over the codes, every row of x per decoded step ---------------------
struct XView {
  const uint16_t* p;  // part 0, row 0, pair 0
  int64_t ld;         // words between rows
  int64_t pstride;    // words between parts
  int64_t ps;         // words between pairs: 2 (rows) or 2M (pair-interleaved)
};

template <int B, int R, int NP, int NA, int U>
inline void dot_steps(const uint8_t* q, int64_t s, __m512i tab, const XView& x, __m512 (&acc)[R][NA]) {
  using D = Dec<B>;
  constexpr int P = D::P, S = 2 * P;
  __m512i w[U][P];
#pragma GCC unroll 4
  for (int u = 0; u < U; ++u) D::run(q + (s + u) * D::BYTES, tab, w[u]);
#pragma GCC unroll 4
  for (int u = 0; u < U; ++u) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const int64_t off = ((s + u) * P + p) * x.ps;
      const int slot = (u * P + p) % NA;
#pragma GCC unroll 8
      for (int m = 0; m < R; ++m) {
#pragma GCC unroll 3
        for (int e = 0; e < NP; ++e) {
          acc[m][slot] = dpbf16_pair(acc[m][slot], w[u][p], x.p + e * x.pstride + m * x.ld + off);
        }
      }
    }
  }
}

// y rows [R][16] of tile t (fp32, before bias)
template <int B, int R, int NP>
void gemv_tile(const int64_t* d, int64_t t, const XView& x, const float* xsum, int64_t nf, __m512* tot) {
  using D = Dec<B>;
  constexpr int P = D::P, S = 2 * P, U = P >= 4 ? 1 : 4 / P;
  constexpr int NA = std::min(U * P, std::max(2, 8 / R));  // independent accumulators per row
  const __m512i tab = B == 8 ? _mm512_setzero_si512() : code_table<B>();
  const int64_t steps = d[W_KP] / S, fsteps = d[W_FOLD] / S, sstr = d[W_SSTRIDE] * TILE;
  const uint8_t* q = reinterpret_cast<const uint8_t*>(d[W_Q]) + t * steps * D::BYTES;
  const float* sc = reinterpret_cast<const float*>(d[W_SCALES]) + t * d[W_NG] * TILE;
  const int16_t* zr = d[W_ZEROS] ? reinterpret_cast<const int16_t*>(d[W_ZEROS]) + t * d[W_NG] * TILE : nullptr;
  for (int m = 0; m < R; ++m) tot[m] = _mm512_setzero_ps();
  for (int64_t s0 = 0, f = 0; s0 < steps; s0 += fsteps, ++f) {
    const int64_t s1 = std::min(steps, s0 + fsteps);
    __m512 acc[R][NA];
    for (int m = 0; m < R; ++m)
      for (int a = 0; a < NA; ++a) acc[m][a] = _mm512_setzero_ps();
    int64_t s = s0;
    for (; s + U <= s1; s += U) dot_steps<B, R, NP, NA, U>(q, s, tab, x, acc);
    for (; s < s1; ++s) dot_steps<B, R, NP, NA, 1>(q, s, tab, x, acc);
    const __m512 sv = _mm512_loadu_ps(sc + f * sstr);
    __m512 zs = _mm512_setzero_ps();
    if (zr) zs = _mm512_mul_ps(sv, _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(
                                       _mm256_loadu_si256((const __m256i*)(zr + f * sstr)))));
    for (int m = 0; m < R; ++m) {
      __m512 a = acc[m][0];
      for (int i = 1; i < NA; ++i) a = _mm512_add_ps(a, acc[m][i]);
      tot[m] = _mm512_fmadd_ps(a, sv, tot[m]);
      if (zr) tot[m] = _mm512_fnmadd_ps(zs, _mm512_set1_ps(xsum[m * nf + f]), tot[m]);
    }
  }
}

template <int B, int R, int NP>
void gemv_rows(const int64_t* d, const XView& x, const float* xsum, int64_t nf, const YView& y, int64_t m0,
               int threads) {
#pragma omp parallel for num_threads(std::min<int64_t>(threads, d[W_T])) schedule(dynamic, 4)
  for (int64_t t = 0; t < d[W_T]; ++t) {
    __m512 tot[R];
    gemv_tile<B, R, NP>(d, t, x, xsum, nf, tot);
    for (int m = 0; m < R; ++m) store_tile_row(y, m0 + m, t * TILE, tot[m]);
  }
}

template <int B, int NP>
void gemv(const int64_t* d, XView x, const float* xsum, int64_t nf, const YView& y, int64_t M, int threads) {
  for (int64_t m0 = 0; m0 < M; m0 += 8) {
    const XView xr{x.p + m0 * x.ld, x.ld, x.pstride, x.ps};
    const float* xs = xsum ? xsum + m0 * nf : nullptr;
    switch (std::min<int64_t>(8, M - m0)) {
      case 1: gemv_rows<B, 1, NP>(d, xr, xs, nf, y, m0, threads); break;
      case 2: gemv_rows<B, 2, NP>(d, xr, xs, nf, y, m0, threads); break;
      case 3: gemv_rows<B, 3, NP>(d, xr, xs, nf, y, m0, threads); break;
      case 4: gemv_rows<B, 4, NP>(d, xr, xs, nf, y, m0, threads); break;
      case 5: gemv_rows<B, 5, NP>(d, xr, xs, nf, y, m0, threads); break;
      case 6: gemv_rows<B, 6, NP>(d, xr, xs, nf, y, m0, threads); break;
      case 7: gemv_rows<B, 7, NP>(d, xr, xs, nf, y, m0, threads); break;
      default: gemv_rows<B, 8, NP>(d, xr, xs, nf, y, m0, threads); break;
    }
  }
}

// ---- large M: decode a 64-row panel of one K chunk into bf16, then a register-blocked GEMM --
// panel word ((p * NT + nt) * 32 + 2r + e): pair p of the chunk, tile nt of the block, row r.
template <int B>
void decode_panel(const int64_t* d, int64_t t0, int ntv, int64_t s0, int64_t s1, uint16_t* panel) {
  using D = Dec<B>;
  constexpr int P = D::P;
  const __m512i tab = B == 8 ? _mm512_setzero_si512() : code_table<B>();
  const int64_t steps = d[W_KP] / (2 * P);
  for (int nt = 0; nt < NT; ++nt) {
    if (nt >= ntv) {
      for (int64_t s = s0; s < s1; ++s)
        for (int p = 0; p < P; ++p)
          _mm512_store_si512(panel + (((s - s0) * P + p) * NT + nt) * 32, _mm512_setzero_si512());
      continue;
    }
    const uint8_t* q = reinterpret_cast<const uint8_t*>(d[W_Q]) + (t0 + nt) * steps * D::BYTES;
    for (int64_t s = s0; s < s1; ++s) {
      __m512i w[P];
      D::run(q + s * D::BYTES, tab, w);
      for (int p = 0; p < P; ++p) _mm512_store_si512(panel + (((s - s0) * P + p) * NT + nt) * 32, w[p]);
    }
  }
}

// one row of C (4 tiles) += s * acc - zs * xsum
inline void fold_row(float* c, __m512 a0, __m512 a1, __m512 a2, __m512 a3, const __m512* sv, const __m512* zs,
                     float xsum) {
  const __m512 acc[NT] = {a0, a1, a2, a3};
  const __m512 xv = _mm512_set1_ps(xsum);
  for (int n = 0; n < NT; ++n) {
    __m512 v = _mm512_fmadd_ps(acc[n], sv[n], _mm512_load_ps(c + n * TILE));
    if (zs) v = _mm512_fnmadd_ps(zs[n], xv, v);
    _mm512_store_ps(c + n * TILE, v);
  }
}

// C[m][64] += fold of R rows of x against `np` panel pairs: C += s * acc - zs * xsum
template <int R, int NP>
void micro_fold(const uint16_t* panel, int64_t np, const XView& x, float* C, const __m512* sv,
                const __m512* zs, const float* xs, int64_t nf) {
#define QRT_DECL(i) __m512 c##i##0 = _mm512_setzero_ps(), c##i##1 = c##i##0, c##i##2 = c##i##0, c##i##3 = c##i##0;
  QRT_ROWS(QRT_DECL)
#undef QRT_DECL
  for (int64_t p = 0; p < np; ++p) {
    const uint16_t* wp = panel + p * NT * 32;
    const __m512bh w0 = (__m512bh)_mm512_load_si512(wp), w1 = (__m512bh)_mm512_load_si512(wp + 32);
    const __m512bh w2 = (__m512bh)_mm512_load_si512(wp + 64), w3 = (__m512bh)_mm512_load_si512(wp + 96);
#define QRT_STEP(i)                                                                                       \
  if constexpr (R > i) {                                                                                  \
    for (int e = 0; e < NP; ++e) {                                                                        \
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(load_u32(x.p + e * x.pstride + i * x.ld + 2 * p)); \
      c##i##0 = _mm512_dpbf16_ps(c##i##0, w0, xv);                                                        \
      c##i##1 = _mm512_dpbf16_ps(c##i##1, w1, xv);                                                        \
      c##i##2 = _mm512_dpbf16_ps(c##i##2, w2, xv);                                                        \
      c##i##3 = _mm512_dpbf16_ps(c##i##3, w3, xv);                                                        \
    }                                                                                                     \
  }
    QRT_ROWS(QRT_STEP)
#undef QRT_STEP
  }
#define QRT_FOLD(i) \
  if constexpr (R > i) fold_row(C + i * NT * TILE, c##i##0, c##i##1, c##i##2, c##i##3, sv, zs, zs ? xs[i * nf] : 0.0f);
  QRT_ROWS(QRT_FOLD)
#undef QRT_FOLD
}

template <int NP>
void micro_dispatch(int r, const uint16_t* panel, int64_t np, const XView& x, float* C, const __m512* sv,
                    const __m512* zs, const float* xs, int64_t nf) {
  switch (r) {
    case 1: micro_fold<1, NP>(panel, np, x, C, sv, zs, xs, nf); break;
    case 2: micro_fold<2, NP>(panel, np, x, C, sv, zs, xs, nf); break;
    case 3: micro_fold<3, NP>(panel, np, x, C, sv, zs, xs, nf); break;
    case 4: micro_fold<4, NP>(panel, np, x, C, sv, zs, xs, nf); break;
    case 5: micro_fold<5, NP>(panel, np, x, C, sv, zs, xs, nf); break;
    default: micro_fold<6, NP>(panel, np, x, C, sv, zs, xs, nf); break;
  }
}

// Whether the large-M path can run on AMX tiles for this weight: compiled for and permitted on this
// CPU, and every fold a whole number of 32-k weight tiles.
bool amx_ready(const int64_t* d) {
#ifdef QRT_AMX
  return qrt::amx_permitted() && d[W_KP] % 32 == 0 && d[W_FOLD] % 32 == 0 && d[W_KC] % 32 == 0;
#else
  (void)d;
  return false;
#endif
}

template <int B, int NP>
int large(const int64_t* d, const XView& x, const float* xsum, int64_t nf, const YView& y, int64_t M,
          int threads, bool amx) {
  constexpr int S = 2 * Dec<B>::P;
  const int64_t T = d[W_T], Kp = d[W_KP], kc = d[W_KC], fold = d[W_FOLD], ng = d[W_NG];
  const int64_t sstr = d[W_SSTRIDE] * TILE, nblk = (T + NT - 1) / NT;
  const float* scales = reinterpret_cast<const float*>(d[W_SCALES]);
  const int16_t* zeros = reinterpret_cast<const int16_t*>(d[W_ZEROS]);
  amx = amx && amx_ready(d);
  int failed = 0;
#pragma omp parallel num_threads(std::min<int64_t>(threads, nblk)) reduction(| : failed)
  {
    uint16_t* panel = static_cast<uint16_t*>(tl_panel.get(sizeof(uint16_t) * NT * TILE * kc));
    float* C = static_cast<float*>(tl_c.get(sizeof(float) * NT * TILE * M));
    if (!panel || !C) failed = 1;
#ifdef QRT_AMX
    alignas(64) float stage[TILE * NT * TILE];
    int rows_configured = 0;  // the tile shape loaded in this thread (0: none)
#endif
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < nblk; ++b) {
      if (failed) continue;
      const int64_t t0 = b * NT;
      const int ntv = int(std::min<int64_t>(NT, T - t0));
      std::memset(C, 0, sizeof(float) * NT * TILE * M);
      for (int64_t k0 = 0; k0 < Kp; k0 += kc) {
        const int64_t k1 = std::min(Kp, k0 + kc);
        decode_panel<B>(d, t0, ntv, k0 / S, k1 / S, panel);
        for (int64_t g0 = k0; g0 < k1; g0 += fold) {
          const int64_t g1 = std::min(k1, g0 + fold), f = g0 / fold;
          __m512 sv[NT], zs[NT];
          for (int n = 0; n < NT; ++n) {
            const int64_t o = ((t0 + n) * ng) * TILE + f * sstr;
            sv[n] = n < ntv ? _mm512_loadu_ps(scales + o) : _mm512_setzero_ps();
            zs[n] = n < ntv && zeros ? _mm512_mul_ps(sv[n], _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(
                                                                _mm256_loadu_si256((const __m256i*)(zeros + o)))))
                                     : _mm512_setzero_ps();
          }
#ifdef QRT_AMX
          if (amx) {  // 16 rows of x per tile product, then the same fold per row
            for (int64_t m0 = 0; m0 < M; m0 += TILE) {
              const int rm = int(std::min<int64_t>(TILE, M - m0));
              if (rm != rows_configured) qrt::amx_configure(rows_configured = rm);
              qrt::amx_block<NP, 1>(panel + (g0 - k0) / 2 * NT * 32, (g1 - g0) / 2, x.p + m0 * x.ld + g0, x.ld,
                                    x.pstride, stage);
              for (int i = 0; i < rm; ++i) {
                const float* s = stage + i * NT * TILE;
                fold_row(C + (m0 + i) * NT * TILE, _mm512_load_ps(s), _mm512_load_ps(s + 16), _mm512_load_ps(s + 32),
                         _mm512_load_ps(s + 48), sv, zeros ? zs : nullptr, xsum ? xsum[(m0 + i) * nf + f] : 0.0f);
              }
            }
            continue;
          }
#endif
          for (int64_t m0 = 0; m0 < M; m0 += MR) {
            const XView xr{x.p + m0 * x.ld + g0, x.ld, x.pstride, 2};
            micro_dispatch<NP>(int(std::min<int64_t>(MR, M - m0)), panel + (g0 - k0) / 2 * NT * 32, (g1 - g0) / 2,
                               xr, C + m0 * NT * TILE, sv, zeros ? zs : nullptr, xsum ? xsum + m0 * nf + f : nullptr,
                               nf);
          }
        }
      }
      for (int64_t m = 0; m < M; ++m)
        for (int n = 0; n < ntv; ++n)
          store_tile_row(y, m, (t0 + n) * TILE, _mm512_load_ps(C + (m * NT + n) * TILE));
    }
#ifdef QRT_AMX
    if (rows_configured) _tile_release();
#endif
  }
  return failed ? 2 : 0;
}

// big: 0 the GEMV, 1 the panel GEMM on AVX-512 BF16, 2 the panel GEMM on AMX tiles (where amx_ready)
template <int B>
int run_bits(const int64_t* d, const XView& x, int NP, const float* xsum, int64_t nf, const YView& y, int64_t M,
             int threads, int big) {
  const bool amx = big == 2;
  switch (NP) {
    case 1: return big ? large<B, 1>(d, x, xsum, nf, y, M, threads, amx) : (gemv<B, 1>(d, x, xsum, nf, y, M, threads), 0);
    case 2: return big ? large<B, 2>(d, x, xsum, nf, y, M, threads, amx) : (gemv<B, 2>(d, x, xsum, nf, y, M, threads), 0);
    default: return big ? large<B, 3>(d, x, xsum, nf, y, M, threads, amx) : (gemv<B, 3>(d, x, xsum, nf, y, M, threads), 0);
  }
}
#endif  // QRT_WINT

#if defined(QRT_AVX512) && defined(__AVX512VNNI__)
#define QRT_W8A8 1

// acc += u8 a . s8 b per 32-bit lane. Inline asm: GCC 12 copies the accumulator around the intrinsic.
inline __m512i dpbusd(__m512i acc, __m512i a, __m512i b) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

// x [M, K] -> int8 codes xq[m][ldq] (zeros from K on), scales a[m] and code sums qs[m], exactly as
// quantrt.torchops: s = amax / 127 (1 where that is 0) per row, or the static scale; then
// round-half-even(x / s) clamped to [-128, 127].
// A row where some x / s is NaN gets scale NaN, so all of its outputs are NaN as the reference's are
// (an Inf over a static scale saturates to a code, as there).
void xquant(const void* x, int32_t dt, int64_t M, int64_t sm, int64_t sk, int64_t K, int64_t ldq, float in_scale,
            int8_t* xq, float* a, int32_t* qs, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (M >= 4)
  for (int64_t m = 0; m < M; ++m) {
    float s = in_scale;
    if (!(in_scale > 0.0f)) {
      __m512 mx = _mm512_setzero_ps();
      for (int64_t k = 0; k < K; k += 16) mx = _mm512_max_ps(mx, _mm512_abs_ps(load16(x, dt, m * sm, k, K, sk, nullptr)));
      s = _mm512_reduce_max_ps(mx) / 127.0f;
      if (s == 0.0f) s = 1.0f;
    }
    const __m512 sv = _mm512_set1_ps(s), lo = _mm512_set1_ps(-128.0f), hi = _mm512_set1_ps(127.0f);
    __m512i sum = _mm512_setzero_si512();
    __mmask16 nan = 0;
    for (int64_t k = 0; k < ldq; k += 16) {
      const __m512 v = _mm512_div_ps(load16(x, dt, m * sm, k, K, sk, nullptr), sv);
      nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      const __m512 r = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m512i c = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(r, lo), hi));
      sum = _mm512_add_epi32(sum, c);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + m * ldq + k), _mm512_cvtepi32_epi8(c));
    }
    // x / s is NaN where the reference's code is NaN (a NaN input; with per-token scales also an Inf,
    // whose scale is Inf): the reference's outputs of the row are all NaN, so its scale is NaN too
    a[m] = nan ? std::numeric_limits<float>::quiet_NaN() : s;
    qs[m] = _mm512_reduce_add_epi32(sum);
  }
}

struct A8X {
  const int8_t* q;
  int64_t ld;
  const float* a;
  const int32_t* qs;
};

inline __m512 a8_finish(__m512i acc, const A8X& x, int64_t m, __m512 sv) {
  const __m512i c = _mm512_sub_epi32(acc, _mm512_set1_epi32(128 * x.qs[m]));
  return _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(c), _mm512_set1_ps(x.a[m])), sv);
}

template <int R>
void a8_gemv_rows(const int64_t* d, const A8X& x, const YView& y, int64_t m0, int threads) {
  constexpr int NA = R == 1 ? 4 : (R == 2 ? 2 : 1);
  const int64_t Kq = d[A_KP] / 4;
  const float* scales = reinterpret_cast<const float*>(d[A_SCALES]);
#pragma omp parallel for num_threads(std::min<int64_t>(threads, d[A_T])) schedule(dynamic, 4)
  for (int64_t t = 0; t < d[A_T]; ++t) {
    const uint8_t* w = reinterpret_cast<const uint8_t*>(d[A_Q]) + t * Kq * 64;
    __m512i acc[R][NA];
    for (int m = 0; m < R; ++m)
      for (int i = 0; i < NA; ++i) acc[m][i] = _mm512_setzero_si512();
    int64_t j = 0;
    for (; j + 4 <= Kq; j += 4) {
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) {
        const __m512i wv = _mm512_loadu_si512(w + (j + u) * 64);
#pragma GCC unroll 8
        for (int m = 0; m < R; ++m)
          acc[m][u % NA] = dpbusd(acc[m][u % NA], wv,
                                               _mm512_set1_epi32(load_u32(x.q + (m0 + m) * x.ld + 4 * (j + u))));
      }
    }
    for (; j < Kq; ++j) {
      const __m512i wv = _mm512_loadu_si512(w + j * 64);
      for (int m = 0; m < R; ++m)
        acc[m][0] = dpbusd(acc[m][0], wv, _mm512_set1_epi32(load_u32(x.q + (m0 + m) * x.ld + 4 * j)));
    }
    const __m512 sv = _mm512_loadu_ps(scales + t * TILE);
    for (int m = 0; m < R; ++m) {
      __m512i a = acc[m][0];
      for (int i = 1; i < NA; ++i) a = _mm512_add_epi32(a, acc[m][i]);
      store_tile_row(y, m0 + m, t * TILE, a8_finish(a, x, m0 + m, sv));
    }
  }
}

// C[R][64] (int32) += R rows of x against 64 weight rows over `nq` quads
template <int R>
void a8_micro(const uint8_t* const* w, int64_t nq, const int8_t* x, int64_t ld, int32_t* C) {
#define QRT_DECL(i) \
  __m512i c##i##0 = _mm512_setzero_si512(), c##i##1 = c##i##0, c##i##2 = c##i##0, c##i##3 = c##i##0;
  QRT_ROWS(QRT_DECL)
#undef QRT_DECL
  const uint8_t *p0 = w[0], *p1 = w[1], *p2 = w[2], *p3 = w[3];
  for (int64_t j = 0; j < nq; ++j) {
    const __m512i w0 = _mm512_loadu_si512(p0 + j * 64), w1 = _mm512_loadu_si512(p1 + j * 64);
    const __m512i w2 = _mm512_loadu_si512(p2 + j * 64), w3 = _mm512_loadu_si512(p3 + j * 64);
#define QRT_STEP(i)                                                    \
  if constexpr (R > i) {                                               \
    const __m512i xv = _mm512_set1_epi32(load_u32(x + i * ld + 4 * j)); \
    c##i##0 = dpbusd(c##i##0, w0, xv);                    \
    c##i##1 = dpbusd(c##i##1, w1, xv);                    \
    c##i##2 = dpbusd(c##i##2, w2, xv);                    \
    c##i##3 = dpbusd(c##i##3, w3, xv);                    \
  }
    QRT_ROWS(QRT_STEP)
#undef QRT_STEP
  }
#define QRT_ADD(i)                                                                                          \
  if constexpr (R > i) {                                                                                    \
    int32_t* c = C + i * NT * TILE;                                                                         \
    _mm512_store_si512(c, _mm512_add_epi32(_mm512_load_si512(c), c##i##0));                                 \
    _mm512_store_si512(c + TILE, _mm512_add_epi32(_mm512_load_si512(c + TILE), c##i##1));                   \
    _mm512_store_si512(c + 2 * TILE, _mm512_add_epi32(_mm512_load_si512(c + 2 * TILE), c##i##2));           \
    _mm512_store_si512(c + 3 * TILE, _mm512_add_epi32(_mm512_load_si512(c + 3 * TILE), c##i##3));           \
  }
  QRT_ROWS(QRT_ADD)
#undef QRT_ADD
}

int a8_large(const int64_t* d, const A8X& x, const YView& y, int64_t M, int threads) {
  const int64_t T = d[A_T], Kq = d[A_KP] / 4, nblk = (T + NT - 1) / NT, qc = 1024;
  const float* scales = reinterpret_cast<const float*>(d[A_SCALES]);
  int failed = 0;
#pragma omp parallel num_threads(std::min<int64_t>(threads, nblk)) reduction(| : failed)
  {
    int32_t* C = static_cast<int32_t*>(tl_c.get(sizeof(int32_t) * NT * TILE * M));
    if (!C) failed = 1;
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < nblk; ++b) {
      if (failed) continue;
      const int64_t t0 = b * NT;
      const int ntv = int(std::min<int64_t>(NT, T - t0));
      const uint8_t* w[NT];
      for (int n = 0; n < NT; ++n)
        w[n] = reinterpret_cast<const uint8_t*>(d[A_Q]) + (t0 + (n < ntv ? n : 0)) * Kq * 64;
      std::memset(C, 0, sizeof(int32_t) * NT * TILE * M);
      for (int64_t j0 = 0; j0 < Kq; j0 += qc) {
        const int64_t nq = std::min(qc, Kq - j0);
        const uint8_t* wj[NT];
        for (int n = 0; n < NT; ++n) wj[n] = w[n] + j0 * 64;
        for (int64_t m0 = 0; m0 < M; m0 += MR) {
          const int8_t* xr = x.q + m0 * x.ld + 4 * j0;
          int32_t* Cm = C + m0 * NT * TILE;
          switch (std::min<int64_t>(MR, M - m0)) {
            case 1: a8_micro<1>(wj, nq, xr, x.ld, Cm); break;
            case 2: a8_micro<2>(wj, nq, xr, x.ld, Cm); break;
            case 3: a8_micro<3>(wj, nq, xr, x.ld, Cm); break;
            case 4: a8_micro<4>(wj, nq, xr, x.ld, Cm); break;
            case 5: a8_micro<5>(wj, nq, xr, x.ld, Cm); break;
            default: a8_micro<6>(wj, nq, xr, x.ld, Cm); break;
          }
        }
      }
      for (int64_t m = 0; m < M; ++m)
        for (int n = 0; n < ntv; ++n) {
          const __m512 sv = _mm512_loadu_ps(scales + (t0 + n) * TILE);
          const __m512i acc = _mm512_load_si512(C + (m * NT + n) * TILE);
          store_tile_row(y, m, (t0 + n) * TILE, a8_finish(acc, x, m, sv));
        }
    }
  }
  return failed ? 2 : 0;
}
#endif  // QRT_W8A8

}  // namespace

extern "C" {

// bit 0: the wint kernels are compiled (AVX-512 F/BW/VL + BF16), bit 1: the W8A8 kernels (+ VNNI)
int32_t quantrt_wint_isa() {
  int32_t r = 0;
#ifdef QRT_WINT
  r |= 1;
#endif
#ifdef QRT_W8A8
  r |= 2;
#endif
#if defined(QRT_WINT) && defined(QRT_AMX)
  if (qrt::amx_permitted()) r |= 4;  // the panel GEMM can run on AMX tiles (big = 2)
#endif
  return r;
}

// 1 when the large-M path of this weight runs on AMX tiles when asked (big = 2), else 0
int32_t quantrt_wint_amx_ready(const int64_t* d) {
#ifdef QRT_WINT
  return amx_ready(d) ? 1 : 0;
#else
  (void)d;
  return 0;
#endif
}

// y[M, N] = x[M, K] @ W.T + bias for a prepared integer weight `d` (see the layout above).
// x: dtype code xdt, element strides sxm/sxk; y: dtype ydt, row stride ldy (unit column stride);
// bias: dtype bdt or null; big: the strategy (0 GEMV, 1 panel GEMM, 2 panel GEMM on AMX tiles where
// quantrt_wint_amx_ready, else 1). Returns 0, 1 when not compiled, 2 when out of memory.
int32_t quantrt_wint_linear(const int64_t* d, const void* x, int32_t xdt, int64_t M, int64_t sxm, int64_t sxk,
                            const void* bias, int32_t bdt, void* y, int32_t ydt, int64_t ldy, int32_t threads,
                            int32_t big) {
#ifdef QRT_WINT
  if (M <= 0) return 0;
  threads = std::max(threads, 1);
  const int NP = xdt == BF16 ? 1 : (xdt == F16 ? 2 : 3);
  const int64_t K = d[W_K], Kp = d[W_KP], fold = d[W_FOLD];
  const int32_t* perm = reinterpret_cast<const int32_t*>(d[W_PERM]);
  const bool asym = d[W_ZEROS] != 0;
  const int64_t ldx = round_up(Kp, 16), nf = (Kp + fold - 1) / fold;
  // the GEMV reads x pair-interleaved from 2 rows on; the large-M path reads rows (bf16 ones in place)
  const bool pairs = !big && M >= 2;
  XView xv{static_cast<const uint16_t*>(x), sxm, 0, 2};
  float* xsum = nullptr;
  if (NP != 1 || sxk != 1 || perm || asym || Kp != K || pairs) {
    uint16_t* xb = static_cast<uint16_t*>(tl_x.get(sizeof(uint16_t) * NP * M * ldx));
    if (asym) xsum = static_cast<float*>(tl_aux.get(sizeof(float) * M * nf));
    if (!xb || (asym && !xsum)) return 2;
    xprep(x, xdt, M, sxm, sxk, perm, K, ldx, NP, pairs, xb, xsum, fold, nf, threads);
    xv = pairs ? XView{xb, 2, M * ldx, 2 * M} : XView{xb, ldx, M * ldx, 2};
  }
  const YView yv{y, ydt, ldy, bias, bdt, d[W_N]};
  switch (d[W_BITS]) {
    case 8: return run_bits<8>(d, xv, NP, xsum, nf, yv, M, threads, big);
    case 4: return run_bits<4>(d, xv, NP, xsum, nf, yv, M, threads, big);
    case 3: return run_bits<3>(d, xv, NP, xsum, nf, yv, M, threads, big);
    default: return run_bits<2>(d, xv, NP, xsum, nf, yv, M, threads, big);
  }
#else
  return 1;
#endif
}

// The activation quantization of the W8A8 kernel on its own (tests compare it with torch's):
// codes xq [M, K] int8 and scales a [M] fp32; in_scale > 0 is a static scale.
int32_t quantrt_w8a8_quantize(const void* x, int32_t xdt, int64_t M, int64_t sxm, int64_t sxk, int64_t K,
                              float in_scale, int8_t* xq, float* a, int32_t threads) {
#ifdef QRT_W8A8
  const int64_t ldq = round_up(K, 64);
  int8_t* buf = static_cast<int8_t*>(tl_x.get(size_t(M * ldq)));
  int32_t* qs = static_cast<int32_t*>(tl_aux.get(sizeof(int32_t) * std::max<int64_t>(M, 1)));
  if (!buf || !qs) return 2;
  xquant(x, xdt, M, sxm, sxk, K, ldq, in_scale, buf, a, qs, std::max(threads, 1));
  for (int64_t m = 0; m < M; ++m) std::memcpy(xq + m * K, buf + m * ldq, size_t(K));
  return 0;
#else
  return 1;
#endif
}

// y[M, N] = dequant(quant(x)) @ W.T + bias for a prepared W8A8 weight `d`; in_scale > 0: static.
int32_t quantrt_w8a8_linear(const int64_t* d, const void* x, int32_t xdt, int64_t M, int64_t sxm, int64_t sxk,
                            float in_scale, const void* bias, int32_t bdt, void* y, int32_t ydt, int64_t ldy,
                            int32_t threads, int32_t big) {
#ifdef QRT_W8A8
  if (M <= 0) return 0;
  threads = std::max(threads, 1);
  const int64_t ldq = round_up(d[A_KP], 64);
  char* buf = static_cast<char*>(tl_x.get(size_t(M * ldq + 8 * M + 64)));
  if (!buf) return 2;
  int8_t* xq = reinterpret_cast<int8_t*>(buf);
  float* a = reinterpret_cast<float*>(buf + round_up(M * ldq, 64));
  int32_t* qs = reinterpret_cast<int32_t*>(a + M);
  xquant(x, xdt, M, sxm, sxk, d[A_K], ldq, in_scale, xq, a, qs, threads);
  const A8X xv{xq, ldq, a, qs};
  const YView yv{y, ydt, ldy, bias, bdt, d[A_N]};
  if (big) return a8_large(d, xv, yv, M, threads);
  for (int64_t m0 = 0; m0 < M; m0 += 8) {
    switch (std::min<int64_t>(8, M - m0)) {
      case 1: a8_gemv_rows<1>(d, xv, yv, m0, threads); break;
      case 2: a8_gemv_rows<2>(d, xv, yv, m0, threads); break;
      case 3: a8_gemv_rows<3>(d, xv, yv, m0, threads); break;
      case 4: a8_gemv_rows<4>(d, xv, yv, m0, threads); break;
      case 5: a8_gemv_rows<5>(d, xv, yv, m0, threads); break;
      case 6: a8_gemv_rows<6>(d, xv, yv, m0, threads); break;
      case 7: a8_gemv_rows<7>(d, xv, yv, m0, threads); break;
      default: a8_gemv_rows<8>(d, xv, yv, m0, threads); break;
    }
  }
  return 0;
#else
  return 1;
#endif
}

}  // extern "C"

// ---- dequantized rows (the AMX path of backends/cpu/amx.py) -----------------------------------
// Rows [n0, n1) of the dequantized weight, read from the prepared layout above, written to
// out[(n - n0) * ldo + k] for the K original columns (act-order codes go back to their columns
// through perm) in dtype odt (fp32, bf16 or fp16). Each value is computed as the reference does,
// s * (q - z) in fp32 (both integers are exact, one rounding), then rounded once to odt, so the bf16
// output equals the fp32 dequantized weight rounded to bf16. Scalar decode, parallel over rows.
namespace {

// the code of row r (of a tile) at padded column k, minus 2^(b-1), from the tile's step stream
inline int32_t wint_code(const uint8_t* q, int bits, int64_t r, int64_t k) {
  switch (bits) {
    case 8: return static_cast<int8_t>(q[(k / 2) * 32 + 2 * r + (k & 1)]);
    case 4: {
      const uint8_t b = q[(k / 4) * 32 + 2 * r + (k & 1)];
      return int32_t((b >> (4 * ((k % 4) / 2))) & 15) - 8;
    }
    case 2: {
      const uint8_t b = q[(k / 8) * 32 + 2 * r + (k & 1)];
      return int32_t((b >> (2 * ((k % 8) / 2))) & 3) - 2;
    }
    default: {  // 3 bits: low two bits as for 2, bit 2 in mask f
      const uint8_t* st = q + (k / 8) * 48;
      const int f = int((k % 8) / 2);
      const int32_t lo = (st[2 * r + (k & 1)] >> (2 * f)) & 3;
      const uint32_t mask = uint32_t(load_u32(st + 32 + 4 * f));
      return (lo | int32_t(((mask >> (2 * r + (k & 1))) & 1) << 2)) - 4;
    }
  }
}

// one row of the dequantized weight (see quantrt_wint_dequant_rows), bits and output dtype fixed
template <int BITS, int ODT>
void wint_dequant_row(const uint8_t* q, const float* scales, const int16_t* zeros, const int32_t* perm, int64_t t,
                      int64_t r, int64_t K, int64_t ng, int64_t fold, int64_t sstr, void* out, int64_t kfrom = 0) {
  for (int64_t k0 = kfrom / fold * fold; k0 < K; k0 += fold) {
    const int64_t k1 = std::min(K, k0 + fold), o = (t * ng + (k0 / fold) * sstr) * TILE + r;
    const float s = scales[o];
    const int32_t z = zeros ? int32_t(zeros[o]) : 0;
    for (int64_t k = std::max(k0, kfrom); k < k1; ++k) {
      // (q - h) - (z - h) = q - z, exact; one fp32 product as (q - z) * s in the reference
      const float v = float(wint_code(q, BITS, r, k) - z) * s;
      const int64_t c = perm ? perm[k] : k;
      if constexpr (ODT == BF16) static_cast<uint16_t*>(out)[c] = qrt::f32_to_bf16(v);
      else if constexpr (ODT == F16) static_cast<uint16_t*>(out)[c] = qrt::f32_to_f16(v);
      else static_cast<float*>(out)[c] = v;
    }
  }
}

#ifdef QRT_AVX512
// The same row with AVX-512 (bits 8, 4 and, with VBMI, 2; fold a multiple of 16): one gather takes
// the 16-bit word of row r from 16 consecutive steps (the aligned dword holding it, so no read
// leaves the step), which holds the row's next 2 / 4 / 8 codes; the codes are put in column order,
// widened to int32, and every 16 columns get (q - z) as fp32 times the scale of their fold (one
// rounding, as the reference), then one rounding to odt. Columns from the last whole block to K
// are scalar. Returns the first column not written.
template <int BITS>
int64_t wint_dequant_row_vec(int32_t odt, const uint8_t* q, const float* scales, const int16_t* zeros,
                             const int32_t* perm, int64_t t, int64_t r, int64_t K, int64_t ng, int64_t fold,
                             int64_t sstr, void* out, int64_t kb, int64_t ke) {
  constexpr int S = BITS == 8 ? 2 : (BITS == 4 ? 4 : 8), KB = 16 * S, NV = KB / 16;
  constexpr int32_t H = 1 << (BITS - 1);
  const __m512i idx = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                          _mm512_set1_epi32(32)),
                                       _mm512_set1_epi32(int32_t(2 * r) & ~3));
  const __m128i sh = _mm_cvtsi32_si128(int(r & 1) * 16);
  int64_t k = kb, gend = (kb / fold + 1) * fold, o = (t * ng + (kb / fold) * sstr) * TILE + r;
  __m512 sv = _mm512_set1_ps(scales[o]);
  __m512i zv = _mm512_set1_epi32(zeros ? int32_t(zeros[o]) : 0);
  for (; k + KB <= ke; k += KB) {
    const __m512i g = _mm512_srl_epi32(_mm512_i32gather_epi32(idx, q + (k / S) * 32, 1), sh);
    __m512i c[NV];
    if constexpr (BITS == 8) {
      const __m256i b = _mm512_cvtepi32_epi16(g);  // 32 int8 codes (q - 128) in column order
      c[0] = _mm512_cvtepi8_epi32(_mm256_castsi256_si128(b));
      c[1] = _mm512_cvtepi8_epi32(_mm256_extracti128_si256(b, 1));
    } else if constexpr (BITS == 4) {
      // word = c0 | c2 << 4 | c1 << 8 | c3 << 12 -> bytes c0, c1, c2, c3
      const __m512i b = _mm512_or_si512(_mm512_and_si512(g, _mm512_set1_epi32(0x0F0F)),
                                        _mm512_slli_epi32(_mm512_and_si512(g, _mm512_set1_epi32(0xF0F0)), 12));
      c[0] = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(b, 0)), _mm512_set1_epi32(H));
      c[1] = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(b, 1)), _mm512_set1_epi32(H));
      c[2] = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(b, 2)), _mm512_set1_epi32(H));
      c[3] = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(b, 3)), _mm512_set1_epi32(H));
    } else {
#ifdef __AVX512VBMI__
      // code j of a word (column 8s + j) at bit 8 (j & 1) + 2 (j / 2)
      const __m512i ctl = _mm512_set1_epi64(0x0E060C040A020800LL);
      const __m256i w16 = _mm512_cvtepi32_epi16(g);
      const __m512i b0 = _mm512_and_si512(_mm512_multishift_epi64_epi8(ctl, _mm512_cvtepu16_epi64(_mm256_castsi256_si128(w16))),
                                          _mm512_set1_epi8(3));
      const __m512i b1 = _mm512_and_si512(
          _mm512_multishift_epi64_epi8(ctl, _mm512_cvtepu16_epi64(_mm256_extracti128_si256(w16, 1))), _mm512_set1_epi8(3));
      c[0] = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(b0, 0)), _mm512_set1_epi32(H));
      c[1] = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(b0, 1)), _mm512_set1_epi32(H));
      c[2] = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(b0, 2)), _mm512_set1_epi32(H));
      c[3] = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(b0, 3)), _mm512_set1_epi32(H));
      c[4] = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(b1, 0)), _mm512_set1_epi32(H));
      c[5] = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(b1, 1)), _mm512_set1_epi32(H));
      c[6] = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(b1, 2)), _mm512_set1_epi32(H));
      c[7] = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(b1, 3)), _mm512_set1_epi32(H));
#endif
    }
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      const int64_t col = k + 16 * j;
      if (col >= gend) {  // the next fold (no division per vector)
        gend += fold;
        o += sstr * TILE;
        sv = _mm512_set1_ps(scales[o]);
        zv = _mm512_set1_epi32(zeros ? int32_t(zeros[o]) : 0);
      }
      const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(c[j], zv)), sv);
      qrt::store16_rounded(out, odt, col, v, 0xFFFF, perm ? perm + col : nullptr);
    }
  }
  return k;
}
#endif

// rows r0..r1-1 of tile t (row r0 at out, rows ldo_b bytes apart): with AVX-512, K chunks of 16
// blocks (8 KiB of codes for the 16 rows, kept in L1 while every row of the tile reads it), then
// the columns past the last whole block scalar; else the scalar rows
template <int BITS, int ODT>
void wint_dequant_seg(const uint8_t* q, const float* scales, const int16_t* zeros, const int32_t* perm, int64_t t,
                      int64_t r0, int64_t r1, int64_t K, int64_t ng, int64_t fold, int64_t sstr, uint8_t* out,
                      int64_t ldo_b) {
  int64_t kv = 0;
#ifdef QRT_AVX512
#ifdef __AVX512VBMI__
  constexpr bool vec = BITS != 3;
#else
  constexpr bool vec = BITS == 8 || BITS == 4;
#endif
  if constexpr (vec) {
    constexpr int64_t KB = 16 * (BITS == 8 ? 2 : (BITS == 4 ? 4 : 8)), KC = 16 * KB;
    if (fold % 16 == 0) {
      kv = K / KB * KB;
      for (int64_t k0 = 0; k0 < kv; k0 += KC)
        for (int64_t r = r0; r < r1; ++r)
          wint_dequant_row_vec<BITS>(ODT, q, scales, zeros, perm, t, r, K, ng, fold, sstr, out + (r - r0) * ldo_b, k0,
                                     std::min(kv, k0 + KC));
    }
  }
#endif
  if (kv < K)
    for (int64_t r = r0; r < r1; ++r)
      wint_dequant_row<BITS, ODT>(q, scales, zeros, perm, t, r, K, ng, fold, sstr, out + (r - r0) * ldo_b, kv);
}

template <int BITS>
void wint_dequant_seg_any(int32_t odt, const uint8_t* q, const float* scales, const int16_t* zeros,
                          const int32_t* perm, int64_t t, int64_t r0, int64_t r1, int64_t K, int64_t ng, int64_t fold,
                          int64_t sstr, uint8_t* out, int64_t ldo_b) {
  switch (odt) {
    case BF16: wint_dequant_seg<BITS, BF16>(q, scales, zeros, perm, t, r0, r1, K, ng, fold, sstr, out, ldo_b); break;
    case F16: wint_dequant_seg<BITS, F16>(q, scales, zeros, perm, t, r0, r1, K, ng, fold, sstr, out, ldo_b); break;
    default: wint_dequant_seg<BITS, F32>(q, scales, zeros, perm, t, r0, r1, K, ng, fold, sstr, out, ldo_b);
  }
}

}  // namespace

extern "C" {

// Returns 0, 3 when the row range or output dtype is invalid.
int32_t quantrt_wint_dequant_rows(const int64_t* d, int64_t n0, int64_t n1, void* out, int32_t odt, int64_t ldo,
                                  int32_t threads) {
  const int64_t N = d[W_N], K = d[W_K], Kp = d[W_KP], ng = d[W_NG], fold = d[W_FOLD], sstr = d[W_SSTRIDE];
  const int bits = int(d[W_BITS]);
  if (n0 < 0 || n1 > N || n0 > n1 || (odt != F32 && odt != BF16 && odt != F16) || ldo < K) return 3;
  const int bytes = bits == 3 ? 48 : 32, S = bits == 8 ? 2 : (bits == 4 ? 4 : 8);
  const int64_t tile_bytes = (Kp / S) * bytes;
  const uint8_t* Q = reinterpret_cast<const uint8_t*>(d[W_Q]);
  const float* scales = reinterpret_cast<const float*>(d[W_SCALES]);
  const int16_t* zeros = reinterpret_cast<const int16_t*>(d[W_ZEROS]);
  const int32_t* perm = reinterpret_cast<const int32_t*>(d[W_PERM]);
  const int64_t ldo_b = ldo * (odt == F32 ? 4 : 2);
  const int nth = int(std::max<int64_t>(1, std::min<int64_t>(threads, n1 - n0)));
#pragma omp parallel num_threads(nth)
  {
    // rows split over threads as schedule(static) would; each thread walks its rows tile by tile
    const int64_t cnt = n1 - n0, nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t a = n0 + cnt * id / nt, b = n0 + cnt * (id + 1) / nt;
    for (int64_t n = a; n < b;) {
      const int64_t t = n / TILE, r0 = n % TILE, r1 = std::min<int64_t>(TILE, b - t * TILE);
      const uint8_t* q = Q + t * tile_bytes;
      uint8_t* o = static_cast<uint8_t*>(out) + (n - n0) * ldo_b;
      switch (bits) {
        case 8: wint_dequant_seg_any<8>(odt, q, scales, zeros, perm, t, r0, r1, K, ng, fold, sstr, o, ldo_b); break;
        case 4: wint_dequant_seg_any<4>(odt, q, scales, zeros, perm, t, r0, r1, K, ng, fold, sstr, o, ldo_b); break;
        case 3: wint_dequant_seg_any<3>(odt, q, scales, zeros, perm, t, r0, r1, K, ng, fold, sstr, o, ldo_b); break;
        default: wint_dequant_seg_any<2>(odt, q, scales, zeros, perm, t, r0, r1, K, ng, fold, sstr, o, ldo_b);
      }
      n = t * TILE + r1;
    }
  }
  return 0;
}

}  // extern "C"
