// Shared helpers for quantrt's native CPU kernels: activation dtypes, fp16/bf16 conversion,
// and splitting work over the caller's thread count. Every kernel library includes this header
// and exports plain extern "C" functions (see build.py).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif
#include <omp.h>
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace qrt {

// dtype codes the Python side passes for activations and outputs
enum DType : int32_t { F32 = 0, BF16 = 1, F16 = 2 };

// A 64-byte aligned scratch buffer per thread (the libraries' own: Python declares no workspace): it
// grows to the largest request and is given back when a request needs under a quarter of a big one.
struct Scratch {
  void* p = nullptr;
  size_t n = 0;
  ~Scratch() { std::free(p); }
  void* get(size_t bytes) {
    if (bytes > n || (n > (size_t(16) << 20) && bytes < n / 4)) {
      std::free(p);
      n = (bytes + 63) / 64 * 64;
      p = std::aligned_alloc(64, n);
      if (!p) n = 0;
    }
    return p;
  }
};

// The output of a linear call: y[m * ld + n] in dtype dt for n < N, an optional bias [N] in dtype bdt
// and an optional fp32 row multiplier [N] (applied before the bias).
struct YView {
  void* p;
  int32_t dt;
  int64_t ld;
  const void* bias;
  int32_t bdt;
  int64_t N;
  const float* rowscale = nullptr;
};

// f(std::integral_constant<int, R>{}) with R = min(rows, 4): a batch's row count as a template argument
template <class F>
inline void with_rows4(int64_t rows, F&& f) {
  switch (rows < 4 ? rows : 4) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, 4>{});
  }
}

// an fp32's bits and back (memcpy: no aliasing rules broken)
inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_f32(uint16_t h) { return float_of(uint32_t(h) << 16); }

// round-to-nearest-even, NaN kept quiet (torch's conversion)
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

#if defined(__aarch64__)
inline float f16_to_f32(uint16_t h) {
  __fp16 v;
  std::memcpy(&v, &h, 2);
  return float(v);
}
inline uint16_t f32_to_f16(float f) {  // round to nearest even, as the x86 conversion
  const __fp16 v = __fp16(f);
  uint16_t h;
  std::memcpy(&h, &v, 2);
  return h;
}
#else
inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t f32_to_f16(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
#endif

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

// Row m of one 16-row output tile from its fp32 sums v[16]: y[m * ld + n] for n = n0 + i < N, times the
// row multiplier (when given) plus the bias (when given), rounded once to the output dtype.
inline void store_tile_values(const YView& y, int64_t m, int64_t n0, const float* v) {
  for (int i = 0; i < 16 && n0 + i < y.N; ++i) {
    const int64_t n = n0 + i;
    float r = y.rowscale ? v[i] * y.rowscale[n] : v[i];
    if (y.bias) r += load_act(y.bias, n, y.bdt);
    store_out(y.p, m * y.ld + n, r, y.dt);
  }
}

// The GEMV kernels' two loops: passes over the activation rows, four at a time, f(m0, r) with r the
// pass's row count as a std::integral_constant; and one pass's 16-row tiles in parallel, tile(t, v)
// leaving the R x 16 results (before row scale and bias) in v, stored row by row.
template <class F>
inline void row_passes(int64_t M, F&& f) {
  for (int64_t m0 = 0; m0 < M; m0 += 4) with_rows4(M - m0, [&](auto r) { f(m0, r); });
}
template <int R, class F>
inline void tiles_in_parallel(int64_t tiles, int threads, const YView& y, int64_t m0, F&& tile) {
#pragma omp parallel for num_threads(std::min<int64_t>(threads, tiles)) schedule(dynamic, 4)
  for (int64_t t = 0; t < tiles; ++t) {
    alignas(64) float v[R][16];
    tile(t, v);
    for (int r = 0; r < R; ++r) store_tile_values(y, m0 + r, t * 16, v[r]);
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

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__linux__)
#define QRT_AMX 1
// ---- AMX tiles (Sapphire Rapids and later), for the panel GEMMs of wint.cpp and lut.cpp ----------
// Their decoded panels are already AMX's weight operand: a panel pair p holds, for 16 output rows,
// the bf16 pair (w[k], w[k+1]) of each row side by side (64 bytes), which is one row of a B tile of
// _tile_dpbf16ps; 16 consecutive pairs (32 k) are one tile, loaded with the pair stride.

// Linux gives a process AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); asked once, the answer kept. Without it a tile instruction faults.
inline bool amx_permitted() {
  static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return ok;
}

// tiles 0-3: four 16-column fp32 accumulators of rm rows; 4, 6, 7: bf16 activation parts, rm rows
// of 32 k; 5: a weight tile (16 pairs of k for 16 output rows). Per thread, before the first tile op.
struct alignas(64) TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
inline void amx_configure(int rm) {
  TileConfig c{};
  c.palette = 1;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = uint8_t(t == 5 ? 16 : rm);
  }
  _tile_loadconfig(&c);
}

// stage[r][64] (fp32, r < rm as configured) = sum over pairs p < np (np a multiple of 16), parts
// e < NP and sub-weights j < NQ of (x_e[r][k], x_e[r][k+1]) . (panel pair (p, j) of tile n), for the
// four 16-row tiles n of a panel laid out [pair][NQ][4 tiles][32 words]; x_e at x + e * pstride with
// rows ld words apart, its k = 0 at pair 0. Exact bf16 products, fp32 sums (as _mm512_dpbf16_ps).
template <int NP, int NQ>
inline void amx_block(const uint16_t* panel, int64_t np, const uint16_t* x, int64_t ld, int64_t pstride,
                      float* stage) {
  static_assert(NP >= 1 && NP <= 3, "three activation parts at most (tiles 4, 6, 7)");
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const int64_t xb = ld * 2, wb = NQ * 4 * 32 * 2;  // bytes between rows of x, between panel pairs
  for (int64_t p = 0; p < np; p += 16) {
    _tile_loadd(4, x + 2 * p, xb);
    if constexpr (NP > 1) _tile_loadd(6, x + pstride + 2 * p, xb);
    if constexpr (NP > 2) _tile_loadd(7, x + 2 * pstride + 2 * p, xb);
    for (int j = 0; j < NQ; ++j) {
      const uint16_t* w = panel + (p * NQ + j) * 4 * 32;
#define QRT_AMX_TILE(n)                                 \
  _tile_loadd(5, w + n * 32, wb);                       \
  _tile_dpbf16ps(n, 4, 5);                              \
  if constexpr (NP > 1) _tile_dpbf16ps(n, 6, 5);        \
  if constexpr (NP > 2) _tile_dpbf16ps(n, 7, 5);
      QRT_AMX_TILE(0)
      QRT_AMX_TILE(1)
      QRT_AMX_TILE(2)
      QRT_AMX_TILE(3)
#undef QRT_AMX_TILE
    }
  }
  _tile_stored(0, stage, 256);
  _tile_stored(1, stage + 16, 256);
  _tile_stored(2, stage + 32, 256);
  _tile_stored(3, stage + 48, 256);
}
#endif

}  // namespace qrt
