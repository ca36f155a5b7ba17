// Code-book and float weight-only linear layers for x86 CPUs with AVX-512 BF16: NF4 and
// bitsandbytes FP4 (fp32 absmax per block of G, resolved at load), NVFP4 (e2m1 codes, e4m3 scale
// per 16, fp32 global scale per output slice), MXFP4 (e2m1 codes, e8m0 scale per 32) and fp8
// e4m3/e5m2 (tensor, channel or block scales). Activations fp32/bf16/fp16, output any of those.
//
// ---- the prepared weight layout (one per weight; every batch size reads it) -----------------
// Output rows are cut into tiles of 16 (N padded to Np = 16 T, padding rows hold code 0 and scale
// 0). Along K a tile is a run of "steps"; a step holds P pairs of consecutive codes
// (k, k+1) for all 16 rows (K padded with code 0 to Kp, a multiple of 2P):
//   4-bit: P=4, 64 bytes: uint16 word 2r+e = sum_p code(r, k0+2p+e) << 4p (nibble p = pair p)
//   8-bit: P=1, 32 bytes: byte 2r+e = fp8 bits of (r, k0+e)
// Decoding a step gives P vectors of 32 bf16 words, word 2r+e = value(row r, code k0+2p+e): the
// operand layout of _mm512_dpbf16_ps against a broadcast pair (x[k], x[k+1]), so each fp32 lane
// accumulates one output row.
//   4-bit decode: three shifts of the 16-bit words and vpermw through a 32-word table (the 16 bf16 code values, twice: vpermw reads 5
//     index bits). e2m1 values are exact in bf16; a code book that is not (NF4, bnb FP4) also has
//     a second table of residuals (value - bf16(value)), used when x is fp32 ("NQ = 2").
//   8-bit decode: the 128 magnitudes as bf16 words in four registers, two vpermt2w (6 index bits
//     each) blended on bit 6, then the sign bit ORed in; every e4m3/e5m2 value is exact in bf16.
//   tab    uint16 [64] (4-bit: hi x2, lo x2) or [128] (8-bit magnitudes)
//   scales [T][ng][16] block scale of column block g for the tile's 16 rows, applied in fp32 per
//          "fold" of `fold` codes, kind by the descriptor: fp32 (bnb absmax, fp8 blocks), e4m3
//          bytes (NVFP4) or e8m0 bytes (MXFP4); none for fp8 tensor/channel scales
//   rowscale fp32 [Np] or null: a final per-row multiplier (NVFP4 global scale, fp8 tensor/channel)
// y[n] = rowscale[n] * sum_f s[n, f] * sum_{k in fold f} w[n, k] x[k] + bias[n]
// Activations are split into bf16 parts whose sum is x (1 part for bf16, 2 for fp16: exact, 3 for
// fp32), so every product of an exact bf16 weight is exact and sums are fp32.
//
// Strategies (Python picks by M with a threshold fixed at prepare), copied from wint.cpp:
//   GEMV (small M): threads take tiles; each step is decoded once and multiplied with up to 8 rows
//     of x (pair-interleaved from 2 rows on), accumulators in registers, scales folded per block.
//   panel GEMM (large M): threads take blocks of 4 tiles (64 rows); per K chunk of kc codes the
//     block is decoded into a bf16 panel [kc/2][NQ][4][32] (<= 256 KiB, stays in L2), then a 6 x 64
//     register-blocked dpbf16 micro-kernel runs every row of x over it, folding each block's scale
//     into an fp32 tile C [M][64].
#include "common.h"
#include "layouts.h"

#include <algorithm>
#include <cstdlib>

namespace {

using qrt::BF16;
using qrt::F16;
using qrt::F32;


constexpr int TILE = 16;
constexpr int NT = 4;  // tiles per block of the large-M path (64 output rows)
constexpr int MR = 6;  // activation rows per micro-kernel call of the large-M path

using qrt::Scratch;
thread_local Scratch tl_x, tl_panel, tl_c;

inline int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

inline int32_t load_u32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512BF16__)
#define QRT_LUT 1

inline __m512 bf16x16_to_f32(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

inline __m256i to_bf16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }

// 16 activations x[row_off + (k + i) * sk], i < 16, as fp32; columns >= K read as 0
inline __m512 load16(const void* x, int32_t dt, int64_t row_off, int64_t k, int64_t K, int64_t sk) {
  const int64_t n = std::min<int64_t>(16, K - k);
  if (n <= 0) return _mm512_setzero_ps();
  if (sk == 1) {
    const __mmask16 m = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
    const int64_t o = row_off + k;
    switch (dt) {
      case BF16: return bf16x16_to_f32(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(x) + o));
      case F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(x) + o));
      default: return _mm512_maskz_loadu_ps(m, static_cast<const float*>(x) + o);
    }
  }
  alignas(64) float t[16] = {};
  for (int64_t i = 0; i < n; ++i) t[i] = qrt::load_act(x, row_off + (k + i) * sk, dt);
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

inline void store16(void* y, int32_t dt, int64_t off, __m512 v, __mmask16 m) {
  switch (dt) {
    case BF16: _mm256_mask_storeu_epi16(static_cast<uint16_t*>(y) + off, m, to_bf16(v)); break;
    case F16:
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(y) + off, m,
                               _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      break;
    default: _mm512_mask_storeu_ps(static_cast<float*>(y) + off, m, v);
  }
}

inline __mmask16 row_mask(int64_t n0, int64_t N) {
  const int64_t n = std::min<int64_t>(16, N - n0);
  return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
}

using qrt::YView;

inline void store_tile_row(const YView& y, int64_t m, int64_t n0, __m512 v) {
  const __mmask16 mk = row_mask(n0, y.N);
  if (y.rowscale) v = _mm512_mul_ps(v, _mm512_loadu_ps(y.rowscale + n0));
  store16(y.p, y.dt, m * y.ld + n0, _mm512_add_ps(v, load_bias(y.bias, y.bdt, n0, mk)), mk);
}

// the 16 block scales of fold f of tile t as fp32
inline __m512 fold_scale(int sk, const void* s, int64_t off) {
  switch (sk) {
    case SK_F32: return _mm512_loadu_ps(static_cast<const float*>(s) + off);
    case SK_E4M3: {
      // e4m3 bits into fp32's fields (sign-extended byte << 20, keep sign, exponent low 4 bits and
      // mantissa), exact; * 2^(127 - 7) rebiases the exponent (subnormals come out right as well)
      const __m512i e = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(static_cast<const uint8_t*>(s) + off)));
      const __m512i b = _mm512_and_si512(_mm512_slli_epi32(e, 20), _mm512_set1_epi32(int32_t(0x87F00000u)));
      return _mm512_mul_ps(_mm512_castsi512_ps(b), _mm512_set1_ps(0x1p120f));
    }
    case SK_E8M0: {
      // 2^(E - 127) from fp32 bits; E = 0 is the subnormal 2^-127 (the loader rejects E = 255)
      const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(static_cast<const uint8_t*>(s) + off)));
      const __mmask16 z = _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512());
      return _mm512_castsi512_ps(_mm512_mask_mov_epi32(_mm512_slli_epi32(e, 23), z, _mm512_set1_epi32(1 << 22)));
    }
    default: return _mm512_set1_ps(1.0f);
  }
}

// acc += w . broadcast(pair at p), the broadcast folded into the instruction
inline __m512 dpbf16_pair(__m512 acc, __m512i w, const uint16_t* p) {
  asm("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}

// ---- activations ------------------------------------------------------------------------------
// x [M, K] (any strides) -> NP bf16 parts whose sum is x, zero from K to ldx, part p at
// xb + p * M * ldx: rows [M][ldx], or with `pairs` pair-interleaved [ldx/2][M][2].
void xprep(const void* x, int32_t dt, int64_t M, int64_t sm, int64_t sk, int64_t K, int64_t ldx, int NP, bool pairs,
           uint16_t* xb, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (M >= 4)
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < ldx; k += 16) {
      __m512 r = load16(x, dt, m * sm, k, K, sk);
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
    }
  }
}

// ---- decoding one step ------------------------------------------------------------------------
// the decode tables in registers
struct Tabs {
  __m512i t[4];
};

inline Tabs load_tabs(const int64_t* d) {
  const uint16_t* p = reinterpret_cast<const uint16_t*>(d[L_TAB]);
  Tabs r;
  const int n = d[L_BITS] == 8 ? 4 : 2;
  for (int i = 0; i < 4; ++i) r.t[i] = i < n ? _mm512_loadu_si512(p + 32 * i) : _mm512_setzero_si512();
  return r;
}

template <int B, int NQ>
struct Dec;

// w[p * NQ + q]: pair p, table q (the value, then its residual); nibble p of word 2r+e is pair p
template <int NQ>
struct Dec<4, NQ> {
  static constexpr int P = 4, BYTES = 64;
  static inline void run(const uint8_t* p, const Tabs& tb, __m512i* w) {
    const __m512i v = _mm512_loadu_si512(p);
    const __m512i n[4] = {v, _mm512_srli_epi16(v, 4), _mm512_srli_epi16(v, 8), _mm512_srli_epi16(v, 12)};
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      w[i * NQ] = _mm512_permutexvar_epi16(n[i], tb.t[0]);  // vpermw reads 5 index bits: the table repeats
      if constexpr (NQ == 2) w[i * NQ + 1] = _mm512_permutexvar_epi16(n[i], tb.t[1]);
    }
  }
};

template <int NQ>
struct Dec<8, NQ> {
  static constexpr int P = 1, BYTES = 32;
  static inline void run(const uint8_t* p, const Tabs& tb, __m512i* w) {
    const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)p));
    const __m512i lo = _mm512_permutex2var_epi16(tb.t[0], v, tb.t[1]);  // magnitudes 0..63
    const __m512i hi = _mm512_permutex2var_epi16(tb.t[2], v, tb.t[3]);  // magnitudes 64..127
    const __m512i mag = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(v, _mm512_set1_epi16(0x40)), lo, hi);
    // mag | ((v << 8) & 0x8000): the sign bit
    w[0] = _mm512_ternarylogic_epi32(mag, _mm512_slli_epi16(v, 8), _mm512_set1_epi16(int16_t(0x8000)), 0xF8);
  }
};

// ---- small M: one pass over the codes, every row of x per decoded step ---------------------
struct XView {
  const uint16_t* p;  // part 0, row 0, pair 0
  int64_t ld;         // words between rows
  int64_t pstride;    // words between parts
  int64_t ps;         // words between pairs: 2 (rows) or 2M (pair-interleaved)
};

template <int B, int NQ, int R, int NP, int NA, int U>
inline void dot_steps(const uint8_t* q, int64_t s, const Tabs& tb, const XView& x, __m512 (&acc)[R][NA]) {
  using D = Dec<B, NQ>;
  constexpr int P = D::P;
  __m512i w[U][P * NQ];
#pragma GCC unroll 4
  for (int u = 0; u < U; ++u) D::run(q + (s + u) * D::BYTES, tb, w[u]);
#pragma GCC unroll 4
  for (int u = 0; u < U; ++u) {
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p) {
      const int64_t off = ((s + u) * P + p) * x.ps;
      const int slot = (u * P + p) % NA;
#pragma GCC unroll 8
      for (int m = 0; m < R; ++m) {
#pragma GCC unroll 3
        for (int e = 0; e < NP; ++e) {
#pragma GCC unroll 2
          for (int j = 0; j < NQ; ++j)
            acc[m][slot] = dpbf16_pair(acc[m][slot], w[u][p * NQ + j], x.p + e * x.pstride + m * x.ld + off);
        }
      }
    }
  }
}

// y rows [R][16] of tile t (fp32, before the row scale and bias). Two accumulators per row: at
// M = 1 four took twice the time (measured on Zen 4 with bench/cpu_lut.py, all code books).
template <int B, int NQ, int R, int NP>
void gemv_tile(const int64_t* d, const Tabs& tb, int64_t t, const XView& x, __m512* tot) {
  using D = Dec<B, NQ>;
  constexpr int P = D::P, S = 2 * P, U = 4 / P;
  constexpr int NA = 2;  // independent accumulators per row
  const int64_t steps = d[L_KP] / S, fsteps = d[L_FOLD] / S, ng = d[L_NG];
  const int sk = int(d[L_SKIND]);
  const uint8_t* q = reinterpret_cast<const uint8_t*>(d[L_Q]) + t * steps * D::BYTES;
  const int64_t esz = sk == SK_F32 ? 4 : 1;
  const char* sc = reinterpret_cast<const char*>(d[L_SCALES]) + t * ng * TILE * esz;
  for (int m = 0; m < R; ++m) tot[m] = _mm512_setzero_ps();
  for (int64_t s0 = 0, f = 0; s0 < steps; s0 += fsteps, ++f) {
    const int64_t s1 = std::min(steps, s0 + fsteps);
    __m512 acc[R][NA];
    for (int m = 0; m < R; ++m)
      for (int a = 0; a < NA; ++a) acc[m][a] = _mm512_setzero_ps();
    int64_t s = s0;
    for (; s + U <= s1; s += U) dot_steps<B, NQ, R, NP, NA, U>(q, s, tb, x, acc);
    for (; s < s1; ++s) dot_steps<B, NQ, R, NP, NA, 1>(q, s, tb, x, acc);
    if (sk == SK_NONE) {
      for (int m = 0; m < R; ++m)
        for (int i = 0; i < NA; ++i) tot[m] = _mm512_add_ps(tot[m], acc[m][i]);
    } else {
      const __m512 sv = fold_scale(sk, sc, f * TILE);
      for (int m = 0; m < R; ++m) {
        __m512 a = acc[m][0];
        for (int i = 1; i < NA; ++i) a = _mm512_add_ps(a, acc[m][i]);
        tot[m] = _mm512_fmadd_ps(a, sv, tot[m]);
      }
    }
  }
}

template <int B, int NQ, int R, int NP>
void gemv_rows(const int64_t* d, const XView& x, const YView& y, int64_t m0, int threads) {
#pragma omp parallel for num_threads(std::min<int64_t>(threads, d[L_T])) schedule(dynamic, 4)
  for (int64_t t = 0; t < d[L_T]; ++t) {
    const Tabs tb = load_tabs(d);
    __m512 tot[R];
    gemv_tile<B, NQ, R, NP>(d, tb, t, x, tot);
    for (int m = 0; m < R; ++m) store_tile_row(y, m0 + m, t * TILE, tot[m]);
  }
}

template <int B, int NQ, int NP>
void gemv(const int64_t* d, XView x, const YView& y, int64_t M, int threads) {
  for (int64_t m0 = 0; m0 < M; m0 += 8) {
    const XView xr{x.p + m0 * x.ld, x.ld, x.pstride, x.ps};
    switch (std::min<int64_t>(8, M - m0)) {
      case 1: gemv_rows<B, NQ, 1, NP>(d, xr, y, m0, threads); break;
      case 2: gemv_rows<B, NQ, 2, NP>(d, xr, y, m0, threads); break;
      case 3: gemv_rows<B, NQ, 3, NP>(d, xr, y, m0, threads); break;
      case 4: gemv_rows<B, NQ, 4, NP>(d, xr, y, m0, threads); break;
      case 5: gemv_rows<B, NQ, 5, NP>(d, xr, y, m0, threads); break;
      case 6: gemv_rows<B, NQ, 6, NP>(d, xr, y, m0, threads); break;
      case 7: gemv_rows<B, NQ, 7, NP>(d, xr, y, m0, threads); break;
      default: gemv_rows<B, NQ, 8, NP>(d, xr, y, m0, threads); break;
    }
  }
}

// ---- large M: decode a 64-row panel of one K chunk into bf16, then a register-blocked GEMM --
// panel word (((p * NQ + j) * NT + nt) * 32 + 2r + e): pair p of the chunk, table j, tile nt, row r.
// With `pre` (NVFP4) the block scale is multiplied in while decoding: e2m1 x e4m3 has at most 6
// significant bits and stays in bf16's normal range, so the panel is exact and needs no folds.
template <int B, int NQ>
void decode_panel(const int64_t* d, const Tabs& tb, int64_t t0, int ntv, int64_t s0, int64_t s1, bool pre,
                  uint16_t* panel) {
  using D = Dec<B, NQ>;
  constexpr int P = D::P, S = 2 * P;
  const int64_t steps = d[L_KP] / S, fold = d[L_FOLD], ng = d[L_NG];
  const int sk = int(d[L_SKIND]);
  const __m512i dup_lo = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i dup_hi = _mm512_add_epi32(dup_lo, _mm512_set1_epi32(8));
  for (int nt = 0; nt < NT; ++nt) {
    const int64_t t = t0 + std::min(nt, ntv - 1);
    const uint8_t* q = reinterpret_cast<const uint8_t*>(d[L_Q]) + t * steps * D::BYTES;
    const uint8_t* sc = reinterpret_cast<const uint8_t*>(d[L_SCALES]) + t * ng * TILE;
    int64_t f_cur = -1;
    __m512 sa = _mm512_setzero_ps(), sb = sa;
    for (int64_t s = s0; s < s1; ++s) {
      __m512i w[P * NQ];
      D::run(q + s * D::BYTES, tb, w);
      if (pre) {
        const int64_t f = s * S / fold;
        if (f != f_cur) {
          const __m512 sv = fold_scale(sk, sc, f * TILE);
          sa = _mm512_permutexvar_ps(dup_lo, sv);
          sb = _mm512_permutexvar_ps(dup_hi, sv);
          f_cur = f;
        }
        for (int i = 0; i < P * NQ; ++i) {
          const __m512 lo = _mm512_mul_ps(bf16x16_to_f32(_mm512_castsi512_si256(w[i])), sa);
          const __m512 hi = _mm512_mul_ps(bf16x16_to_f32(_mm512_extracti64x4_epi64(w[i], 1)), sb);
          w[i] = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
        }
      }
      for (int i = 0; i < P * NQ; ++i) _mm512_store_si512(panel + (((s - s0) * P * NQ + i) * NT + nt) * 32, w[i]);
    }
  }
}

// The micro-kernels keep their R x 4 accumulators in named variables: GCC spills arrays of them.
#define QRT_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)

// one row of C (4 tiles) += s * acc
inline void fold_row(float* c, __m512 a0, __m512 a1, __m512 a2, __m512 a3, const __m512* sv) {
  const __m512 acc[NT] = {a0, a1, a2, a3};
  for (int n = 0; n < NT; ++n) _mm512_store_ps(c + n * TILE, _mm512_fmadd_ps(acc[n], sv[n], _mm512_load_ps(c + n * TILE)));
}

// C[m][64] += s * (R rows of x against `np` panel pairs)
template <int R, int NP, int NQ>
void micro_fold(const uint16_t* panel, int64_t np, const XView& x, float* C, const __m512* sv) {
#define QRT_DECL(i) __m512 c##i##0 = _mm512_setzero_ps(), c##i##1 = c##i##0, c##i##2 = c##i##0, c##i##3 = c##i##0;
  QRT_ROWS(QRT_DECL)
#undef QRT_DECL
  for (int64_t p = 0; p < np; ++p) {
    for (int j = 0; j < NQ; ++j) {
      const uint16_t* wp = panel + (p * NQ + j) * NT * 32;
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
  }
#define QRT_FOLD(i) \
  if constexpr (R > i) fold_row(C + i * NT * TILE, c##i##0, c##i##1, c##i##2, c##i##3, sv);
  QRT_ROWS(QRT_FOLD)
#undef QRT_FOLD
}

template <int NP, int NQ>
void micro_dispatch(int r, const uint16_t* panel, int64_t np, const XView& x, float* C, const __m512* sv) {
  switch (r) {
    case 1: micro_fold<1, NP, NQ>(panel, np, x, C, sv); break;
    case 2: micro_fold<2, NP, NQ>(panel, np, x, C, sv); break;
    case 3: micro_fold<3, NP, NQ>(panel, np, x, C, sv); break;
    case 4: micro_fold<4, NP, NQ>(panel, np, x, C, sv); break;
    case 5: micro_fold<5, NP, NQ>(panel, np, x, C, sv); break;
    default: micro_fold<6, NP, NQ>(panel, np, x, C, sv); break;
  }
}

// Whether the panel GEMM multiplies the block scales into the decoded panel (one fold per K chunk
// instead of one per group): where code * scale is exact in bf16, e4m3 scales on e2m1 codes (at
// most 7 significant bits), and e8m0 scales Python found within a safe range (L_PRE, E8M0_EXACT).
inline bool prescaled(const int64_t* d) { return int(d[L_SKIND]) == SK_E4M3 || d[L_PRE] != 0; }

// Whether the large-M path can run on AMX tiles for this weight: compiled for and permitted on this
// CPU, and every fold a whole number of 32-k weight tiles.
bool amx_ready(const int64_t* d) {
#ifdef QRT_AMX
  const int64_t span = prescaled(d) ? d[L_KC] : d[L_FOLD];
  return qrt::amx_permitted() && d[L_KP] % 32 == 0 && span % 32 == 0 && d[L_KC] % 32 == 0;
#else
  (void)d;
  return false;
#endif
}

template <int B, int NQ, int NP>
int large(const int64_t* d, const XView& x, const YView& y, int64_t M, int threads, bool amx) {
  constexpr int S = 2 * Dec<B, NQ>::P;
  const int64_t T = d[L_T], Kp = d[L_KP], kc = d[L_KC], fold = d[L_FOLD], ng = d[L_NG];
  const int64_t nblk = (T + NT - 1) / NT;
  const int sk = int(d[L_SKIND]);
  const int64_t esz = sk == SK_F32 ? 4 : 1;
  const char* scales = reinterpret_cast<const char*>(d[L_SCALES]);
  const bool pre = prescaled(d);  // scales multiplied into the panel: one fold per chunk
  const int64_t span = pre ? kc : fold;
  amx = amx && amx_ready(d);
  int failed = 0;
#pragma omp parallel num_threads(std::min<int64_t>(threads, nblk)) reduction(| : failed)
  {
    uint16_t* panel = static_cast<uint16_t*>(tl_panel.get(sizeof(uint16_t) * NQ * NT * TILE * kc));
    float* C = static_cast<float*>(tl_c.get(sizeof(float) * NT * TILE * M));
    const Tabs tb = load_tabs(d);
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
        decode_panel<B, NQ>(d, tb, t0, ntv, k0 / S, k1 / S, pre, panel);
        for (int64_t g0 = k0; g0 < k1; g0 += span) {
          const int64_t g1 = std::min(k1, g0 + span), f = g0 / fold;
          __m512 sv[NT];
          for (int n = 0; n < NT; ++n)
            sv[n] = n >= ntv ? _mm512_setzero_ps()
                    : pre    ? _mm512_set1_ps(1.0f)
                             : fold_scale(sk, scales + ((t0 + n) * ng + f) * TILE * esz, 0);
#ifdef QRT_AMX
          if (amx) {  // 16 rows of x per tile product, then the same fold per row
            for (int64_t m0 = 0; m0 < M; m0 += TILE) {
              const int rm = int(std::min<int64_t>(TILE, M - m0));
              if (rm != rows_configured) qrt::amx_configure(rows_configured = rm);
              qrt::amx_block<NP, NQ>(panel + (g0 - k0) / 2 * NQ * NT * 32, (g1 - g0) / 2, x.p + m0 * x.ld + g0,
                                     x.ld, x.pstride, stage);
              for (int i = 0; i < rm; ++i) {
                const float* s = stage + i * NT * TILE;
                fold_row(C + (m0 + i) * NT * TILE, _mm512_load_ps(s), _mm512_load_ps(s + 16), _mm512_load_ps(s + 32),
                         _mm512_load_ps(s + 48), sv);
              }
            }
            continue;
          }
#endif
          for (int64_t m0 = 0; m0 < M; m0 += MR) {
            const XView xr{x.p + m0 * x.ld + g0, x.ld, x.pstride, 2};
            micro_dispatch<NP, NQ>(int(std::min<int64_t>(MR, M - m0)), panel + (g0 - k0) / 2 * NQ * NT * 32,
                                   (g1 - g0) / 2, xr, C + m0 * NT * TILE, sv);
          }
        }
      }
      for (int64_t m = 0; m < M; ++m)
        for (int n = 0; n < ntv; ++n) store_tile_row(y, m, (t0 + n) * TILE, _mm512_load_ps(C + (m * NT + n) * TILE));
    }
#ifdef QRT_AMX
    if (rows_configured) _tile_release();
#endif
  }
  return failed ? 2 : 0;
}

// big: 0 the GEMV, 1 the panel GEMM on AVX-512 BF16, 2 the panel GEMM on AMX tiles (where amx_ready)
template <int B, int NQ, int NP>
int run_one(const int64_t* d, const XView& x, const YView& y, int64_t M, int threads, int big) {
  if (big) return large<B, NQ, NP>(d, x, y, M, threads, big == 2);
  gemv<B, NQ, NP>(d, x, y, M, threads);
  return 0;
}

template <int B>
int run_bits(const int64_t* d, const XView& x, int NP, int NQ, const YView& y, int64_t M, int threads, int big) {
  switch (NP) {
    case 1: return run_one<B, 1, 1>(d, x, y, M, threads, big);
    case 2: return run_one<B, 1, 2>(d, x, y, M, threads, big);
    default:
      if constexpr (B == 4)
        if (NQ == 2) return run_one<B, 2, 3>(d, x, y, M, threads, big);
      return run_one<B, 1, 3>(d, x, y, M, threads, big);
  }
}
#endif  // QRT_LUT

}  // namespace

extern "C" {

// 1 when the kernels are compiled (AVX-512 F/BW/VL + BF16)
int32_t quantrt_lut_isa() {
#ifdef QRT_LUT
  return 1;
#else
  return 0;
#endif
}

// 1 when the large-M path of this weight runs on AMX tiles when asked (big = 2), else 0
int32_t quantrt_lut_amx_ready(const int64_t* d) {
#ifdef QRT_LUT
  return amx_ready(d) ? 1 : 0;
#else
  (void)d;
  return 0;
#endif
}

// y[M, N] = x[M, K] @ W.T + bias for a prepared weight `d` (see the layout above).
// x: dtype code xdt, element strides sxm/sxk; y: dtype ydt, row stride ldy (unit column stride);
// bias: dtype bdt or null; big: the strategy (0 GEMV, 1 panel GEMM, 2 panel GEMM on AMX tiles where
// quantrt_lut_amx_ready, else 1). Returns 0, 1 when not compiled, 2 when out of memory.
int32_t quantrt_lut_linear(const int64_t* d, const void* x, int32_t xdt, int64_t M, int64_t sxm, int64_t sxk,
                           const void* bias, int32_t bdt, void* y, int32_t ydt, int64_t ldy, int32_t threads,
                           int32_t big) {
#ifdef QRT_LUT
  if (M <= 0) return 0;
  threads = std::max(threads, 1);
  const int NP = xdt == BF16 ? 1 : (xdt == F16 ? 2 : 3);
  const int NQ = NP == 3 && d[L_HASLO] ? 2 : 1;  // the residual table only matters at fp32's precision
  const int64_t K = d[L_K], Kp = d[L_KP];
  const int64_t ldx = round_up(Kp, 16);
  const bool pairs = !big && M >= 2;  // the GEMV reads x pair-interleaved from 2 rows on
  XView xv{static_cast<const uint16_t*>(x), sxm, 0, 2};
  if (NP != 1 || sxk != 1 || Kp != K || pairs) {
    uint16_t* xb = static_cast<uint16_t*>(tl_x.get(sizeof(uint16_t) * NP * M * ldx));
    if (!xb) return 2;
    xprep(x, xdt, M, sxm, sxk, K, ldx, NP, pairs, xb, threads);
    xv = pairs ? XView{xb, 2, M * ldx, 2 * M} : XView{xb, ldx, M * ldx, 2};
  }
  const YView yv{y, ydt, ldy, bias, bdt, d[L_N], reinterpret_cast<const float*>(d[L_ROWSCALE])};
  if (d[L_BITS] == 8) return run_bits<8>(d, xv, NP, NQ, yv, M, threads, big);
  return run_bits<4>(d, xv, NP, NQ, yv, M, threads, big);
#else
  return 1;
#endif
}

}  // extern "C"

// ---- dequantized rows (the AMX path of backends/cpu/amx.py) -----------------------------------
// Rows [n0, n1) of the dequantized weight, read from the prepared layout above, written to
// out[(n - n0) * ldo + k], k < K, in dtype odt (fp32, bf16 or fp16): value(code) * block scale
// * row multiplier in fp32, in the reference's order, then rounded once to odt. 4-bit values come
// from `code32` (the fp32 code book, 16 entries) when given, else from the bf16 table, which is
// exact for e2m1; a bnb code book is exact only in fp32, so pass it. Scalar decode, parallel
// over rows.
namespace {

inline float lut_bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// block scale kind sk at byte/word index i, as fold_scale decodes it
inline float lut_scale(int sk, const void* s, int64_t i) {
  switch (sk) {
    case SK_F32: return static_cast<const float*>(s)[i];
    case SK_E4M3: {
      const int32_t e = static_cast<int8_t>(static_cast<const uint8_t*>(s)[i]);
      return lut_bits_f32(uint32_t(e << 20) & 0x87F00000u) * 0x1p120f;
    }
    case SK_E8M0: {
      const uint32_t e = static_cast<const uint8_t*>(s)[i];
      return lut_bits_f32(e ? e << 23 : 1u << 22);
    }
    default: return 1.0f;
  }
}

inline void lut_dequant_row_scalar(const uint8_t* q, const uint16_t* tab, const float* vals, int bits, int sk,
                                   const void* scales, const float* rowscale, int64_t t, int64_t r, int64_t ng,
                                   int64_t fold, int64_t kfrom, int64_t K, void* out, int64_t off, int32_t odt,
                                   int64_t n) {
    const float rs = rowscale ? rowscale[n] : 1.0f;
    for (int64_t k = kfrom; k < K; ++k) {
      float v;
      if (bits == 8) {
        const uint8_t b = q[(k / 2) * 32 + 2 * r + (k & 1)];
        v = qrt::bf16_to_f32(uint16_t(tab[b & 127] | ((b & 128) << 8)));
      } else {
        uint16_t w;
        std::memcpy(&w, q + (k / 8) * 64 + 2 * (2 * r + (k & 1)), 2);
        v = vals[(w >> (4 * ((k % 8) / 2))) & 15];
      }
      if (sk != SK_NONE) v = v * lut_scale(sk, scales, (t * ng + k / fold) * TILE + r);
      if (rowscale) v = v * rs;
      qrt::store_out(out, off + k, v, odt);
    }
}

#ifdef QRT_LUT
// Columns [kb, ke) of row r (blocks of 16 steps, kb a block start, fold a multiple of 16) with
// AVX-512: one gather takes the row's 4-byte (4-bit) or 2-byte (8-bit, the aligned dword holding it)
// share of 16 consecutive steps; 4-bit codes are put in column order with vpmultishiftqb and looked
// up in the 16 fp32 values (code32 or the bf16 table, as the scalar path), 8-bit codes decode
// through Dec<8> (exact bf16); then value * block scale * row multiplier in fp32, one rounding to
// odt. Returns the first column not written.
template <int BITS>
int64_t lut_dequant_row_vec(int32_t odt, const uint8_t* q, const Tabs& tb, __m512 vals, int sk, const void* scales,
                            float rs, bool has_rs, int64_t t, int64_t r, int64_t ng, int64_t fold, void* out,
                            int64_t kb, int64_t ke) {
  constexpr int S = BITS == 8 ? 2 : 8, SB = BITS == 8 ? 32 : 64, KB = 16 * S, NV = KB / 16;
  const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i idx = _mm512_add_epi32(_mm512_mullo_epi32(iota, _mm512_set1_epi32(SB)),
                                       _mm512_set1_epi32(BITS == 8 ? int32_t(2 * r) & ~3 : int32_t(4 * r)));
  const __m128i sh = _mm_cvtsi32_si128(BITS == 8 ? int(r & 1) * 16 : 0);
  int64_t k = kb, gend = (kb / fold + 1) * fold, so = (t * ng + kb / fold) * TILE + r;
  __m512 sv = _mm512_set1_ps(lut_scale(sk, scales, so));
  const __m512 rv = _mm512_set1_ps(rs);
  for (; k + KB <= ke; k += KB) {
    const __m512i g = _mm512_srl_epi32(_mm512_i32gather_epi32(idx, q + (k / S) * SB, 1), sh);
    __m512 v[NV];
    if constexpr (BITS == 8) {
      alignas(32) uint8_t b[32];
      _mm256_store_si256(reinterpret_cast<__m256i*>(b), _mm512_cvtepi32_epi16(g));  // 32 codes, column order
      __m512i w;
      Dec<8, 1>::run(b, tb, &w);
      v[0] = bf16x16_to_f32(_mm512_castsi512_si256(w));
      v[1] = bf16x16_to_f32(_mm512_extracti64x4_epi64(w, 1));
    } else {
      // code j of a dword (column 8s + j) at bit 16 (j & 1) + 4 (j / 2)
      const __m512i ctl = _mm512_set1_epi64(0x1C0C180814041000LL);
      const __m512i b0 = _mm512_and_si512(
          _mm512_multishift_epi64_epi8(ctl, _mm512_cvtepu32_epi64(_mm512_castsi512_si256(g))), _mm512_set1_epi8(15));
      const __m512i b1 = _mm512_and_si512(
          _mm512_multishift_epi64_epi8(ctl, _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(g, 1))), _mm512_set1_epi8(15));
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        v[j] = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(b0, j)), vals);
        v[4 + j] = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(b1, j)), vals);
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      const int64_t col = k + 16 * j;
      if (col >= gend) {  // the next block scale (no division per vector)
        gend += fold;
        so += TILE;
        sv = _mm512_set1_ps(lut_scale(sk, scales, so));
      }
      __m512 x = v[j];
      if (sk != SK_NONE) x = _mm512_mul_ps(x, sv);
      if (has_rs) x = _mm512_mul_ps(x, rv);
      qrt::store16_rounded(out, odt, col, x);
    }
  }
  return k;
}
#endif

}  // namespace

extern "C" {

// Returns 0, 3 when the row range or output dtype is invalid.
int32_t quantrt_lut_dequant_rows(const int64_t* d, const float* code32, int64_t n0, int64_t n1, void* out,
                                 int32_t odt, int64_t ldo, int32_t threads) {
  const int64_t N = d[L_N], K = d[L_K], Kp = d[L_KP], ng = d[L_NG], fold = d[L_FOLD];
  const int bits = int(d[L_BITS]), sk = int(d[L_SKIND]);
  if (n0 < 0 || n1 > N || n0 > n1 || (odt != F32 && odt != BF16 && odt != F16) || ldo < K) return 3;
  const int64_t tile_bytes = bits == 8 ? (Kp / 2) * 32 : (Kp / 8) * 64;
  const uint8_t* Q = reinterpret_cast<const uint8_t*>(d[L_Q]);
  const uint16_t* tab = reinterpret_cast<const uint16_t*>(d[L_TAB]);
  const void* scales = reinterpret_cast<const void*>(d[L_SCALES]);
  const float* rowscale = reinterpret_cast<const float*>(d[L_ROWSCALE]);
  alignas(64) float vals[16] = {};
  if (bits == 4)
    for (int c = 0; c < 16; ++c) vals[c] = code32 ? code32[c] : qrt::bf16_to_f32(tab[c]);
  const int64_t ldo_b = ldo * (odt == F32 ? 4 : 2);
  // the rows from column kv on are scalar (all of them without AVX-512 VBMI/BF16 or when the block
  // scale changes inside 16 columns)
  int64_t kv = 0;
#if defined(QRT_LUT) && defined(__AVX512VBMI__)
  const int64_t KB = bits == 8 ? 32 : 128;
  if (fold % 16 == 0 || sk == SK_NONE) kv = K / KB * KB;
  const Tabs tb = load_tabs(d);
  const __m512 vv = _mm512_loadu_ps(vals);
#endif
  const int nth = int(std::max<int64_t>(1, std::min<int64_t>(threads, n1 - n0)));
#pragma omp parallel num_threads(nth)
  {
    // rows split over threads as schedule(static) would; each thread walks its rows tile by tile,
    // K chunks of 16 blocks (16 KiB of codes or less, in L1 while the tile's rows read it)
    const int64_t cnt = n1 - n0, nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t a = n0 + cnt * id / nt, b = n0 + cnt * (id + 1) / nt;
    for (int64_t n = a; n < b;) {
      const int64_t t = n / TILE, e = std::min<int64_t>(b, (t + 1) * TILE);
#if defined(QRT_LUT) && defined(__AVX512VBMI__)
      const int64_t KC = 16 * KB, fl = sk == SK_NONE ? K : fold;
      for (int64_t k0 = 0; k0 < kv; k0 += KC)
        for (int64_t m = n; m < e; ++m) {
          uint8_t* o = static_cast<uint8_t*>(out) + (m - n0) * ldo_b;
          const float rs = rowscale ? rowscale[m] : 1.0f;
          if (bits == 8)
            lut_dequant_row_vec<8>(odt, Q + t * tile_bytes, tb, vv, sk, scales, rs, rowscale, t, m % TILE, ng, fl, o,
                                   k0, std::min(kv, k0 + KC));
          else
            lut_dequant_row_vec<4>(odt, Q + t * tile_bytes, tb, vv, sk, scales, rs, rowscale, t, m % TILE, ng, fl, o,
                                   k0, std::min(kv, k0 + KC));
        }
#endif
      for (int64_t m = n; m < e; ++m) lut_dequant_row_scalar(Q + t * tile_bytes, tab, vals, bits, sk, scales, rowscale, t,
                                                             m % TILE, ng, fold, kv, K, out, (m - n0) * ldo, odt, m);
      n = e;
    }
  }
  return 0;
}

}  // extern "C"
