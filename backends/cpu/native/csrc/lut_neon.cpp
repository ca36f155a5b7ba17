// Code-book and float weight-only linear layers (NF4, bitsandbytes FP4, NVFP4, MXFP4, fp8 e4m3/e5m2)
// for Arm CPUs with NEON (aarch64), on lut.cpp's prepared layout with lut_avx2.cpp's descriptor (the
// fp32 code book and the fp8 format after lut.cpp's fields). A tile's 16 rows are four vectors of 4
// fp32 lanes; in a 4-bit step a row's lane holds its 8 codes (code k0 + 2p + e at bit 16e + 4p). A
// 4-bit code becomes its exact fp32 value through one TBL over the 64 bytes of the fp32 code book
// (byte indices 4c .. 4c + 3 per lane); an fp8 code through its bits, as lut_avx2.cpp. Fused
// multiply-adds per fold, the fold's block scales once per fold, the row multiplier at the end:
//   y[n] = rowscale[n] * sum_f s[n, f] * sum_{k in f} w[n, k] x[k] + bias[n].
// One GEMV, 4 activation rows per pass over the codes, threads taking tiles.
#include "common.h"
#include "layouts.h"

#include <algorithm>

namespace {

constexpr int TILE = 16;

using qrt::Scratch;
using qrt::YView;
thread_local Scratch tl_x;

#if defined(__aarch64__) && defined(__ARM_NEON)
#define QRT_LUT_NEON 1

// 4 e4m3 codes, each at bits 20-27 of its lane with its sign copied above, to fp32
inline float32x4_t e4m3_at20(int32x4_t v) {
  const uint32x4_t b = vandq_u32(vreinterpretq_u32_s32(v), vdupq_n_u32(0x87F00000u));
  return vmulq_n_f32(vreinterpretq_f32_u32(b), 0x1p120f);
}

// the 4 block scales of rows 4v .. 4v + 3 of fold f as fp32
inline float32x4_t fold_scale(int sk, const void* s, int64_t off) {
  const uint8_t* b = static_cast<const uint8_t*>(s) + off;
  switch (sk) {
    case SK_F32: return vld1q_f32(static_cast<const float*>(s) + off);
    case SK_E4M3: {
      const int8x8_t e8 = vreinterpret_s8_u32(vdup_n_u32(uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 |
                                                         uint32_t(b[3]) << 24));
      return e4m3_at20(vshlq_n_s32(vmovl_s16(vget_low_s16(vmovl_s8(e8))), 20));
    }
    case SK_E8M0: {  // 2^(E - 127); E = 0 is the subnormal 2^-127 (the loader rejects E = 255)
      const uint32x4_t e = {b[0], b[1], b[2], b[3]};
      const uint32x4_t z = vceqq_u32(e, vdupq_n_u32(0));
      return vreinterpretq_f32_u32(vbslq_u32(z, vdupq_n_u32(1u << 22), vshlq_n_u32(e, 23)));
    }
    default: return vdupq_n_f32(1.0f);
  }
}

constexpr int BOOK = 4, FP8 = 8;
template <int B>
struct Step;
template <>
struct Step<BOOK> {
  static constexpr int S = 8, BYTES = 64;
  // code j of rows 4v .. 4v + 3: the code book's 4 bytes per lane, picked by TBL
  static inline void run(const uint8_t* q, int v, const uint8x16x4_t& book, int, float32x4_t* c) {
    const uint32x4_t w = vld1q_u32(reinterpret_cast<const uint32_t*>(q + 16 * v));
    const uint32x4_t spread = vdupq_n_u32(0x04040404u), lanes = vdupq_n_u32(0x03020100u);
    for (int j = 0; j < 8; ++j) {
      const int at = 16 * (j & 1) + 4 * (j >> 1);
      const uint32x4_t code = vandq_u32(vshlq_u32(w, vdupq_n_s32(-at)), vdupq_n_u32(15));
      const uint8x16_t idx = vreinterpretq_u8_u32(vmlaq_u32(lanes, code, spread));
      c[j] = vreinterpretq_f32_u8(vqtbl4q_u8(book, idx));
    }
  }
};
template <>
struct Step<FP8> {
  static constexpr int S = 2, BYTES = 32;
  // byte 2r + e of the step is code (r, k0 + e): rows 4v .. 4v + 3 are 8 bytes
  static inline void run(const uint8_t* q, int v, const uint8x16x4_t&, int fmt, float32x4_t* c) {
    const uint16x4_t u = vld1_u16(reinterpret_cast<const uint16_t*>(q) + 4 * v);
    if (fmt == E5M2) {  // the high byte of an fp16
      c[0] = vcvt_f32_f16(vreinterpret_f16_u16(vshl_n_u16(u, 8)));
      c[1] = vcvt_f32_f16(vreinterpret_f16_u16(vand_u16(u, vdup_n_u16(0xFF00))));
      return;
    }
    const int32x4_t w = vmovl_s16(vreinterpret_s16_u16(u));  // lane r: byte 2r + 1 signed, then byte 2r
    c[0] = e4m3_at20(vshrq_n_s32(vshlq_n_s32(w, 24), 4));
    c[1] = e4m3_at20(vshlq_n_s32(w, 12));
  }
};

template <int B, int R>
void gemv_tile(const int64_t* d, const uint8x16x4_t& book, int fmt, int64_t t, const float* xs,
               float32x4_t (&tot)[R][4]) {
  using D = Step<B>;
  constexpr int S = D::S;
  const int64_t Kp = d[L_KP], steps = Kp / S, fsteps = d[L_FOLD] / S, ng = d[L_NG];
  const int sk = int(d[L_SKIND]);
  const uint8_t* q = reinterpret_cast<const uint8_t*>(d[L_Q]) + t * steps * D::BYTES;
  const int64_t esz = sk == SK_F32 ? 4 : 1;
  const char* sc = reinterpret_cast<const char*>(d[L_SCALES]) + t * ng * TILE * esz;
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) tot[r][v] = vdupq_n_f32(0.f);
  for (int64_t s0 = 0, f = 0; s0 < steps; s0 += fsteps, ++f) {
    const int64_t s1 = std::min(steps, s0 + fsteps);
    float32x4_t acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 4; ++v) acc[r][v] = vdupq_n_f32(0.f);
    for (int64_t s = s0; s < s1; ++s) {
      for (int v = 0; v < 4; ++v) {
        float32x4_t c[S];
        D::run(q + s * D::BYTES, v, book, fmt, c);
        for (int j = 0; j < S; ++j)
          for (int r = 0; r < R; ++r) acc[r][v] = vfmaq_n_f32(acc[r][v], c[j], xs[r * Kp + s * S + j]);
      }
    }
    for (int v = 0; v < 4; ++v) {
      const float32x4_t sv = fold_scale(sk, sc, f * TILE + 4 * v);
      for (int r = 0; r < R; ++r) tot[r][v] = vfmaq_f32(tot[r][v], acc[r][v], sv);
    }
  }
}

template <int B, int R>
void gemv_rows(const int64_t* d, const uint8x16x4_t& book, int fmt, const float* xs, const YView& y, int64_t m0,
               int threads) {
  qrt::tiles_in_parallel<R>(d[L_T], threads, y, m0, [&](int64_t t, float (&v)[R][16]) {
    float32x4_t tot[R][4];
    gemv_tile<B, R>(d, book, fmt, t, xs, tot);
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 4; ++i) vst1q_f32(v[r] + 4 * i, tot[r][i]);
  });
}

template <int B>
int run(const int64_t* d, const void* x, int32_t xdt, int64_t M, int64_t sxm, int64_t sxk, const YView& y,
        int threads) {
  const int64_t K = d[L_K], Kp = d[L_KP];
  float* xs = static_cast<float*>(tl_x.get(sizeof(float) * M * Kp));
  if (!xs) return 2;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < Kp; ++k) xs[m * Kp + k] = k < K ? qrt::load_act(x, m * sxm + k * sxk, xdt) : 0.f;
  uint8x16x4_t book = {};
  if constexpr (B == BOOK) {
    const uint8_t* t32 = reinterpret_cast<const uint8_t*>(d[L_TAB32]);
    book = {vld1q_u8(t32), vld1q_u8(t32 + 16), vld1q_u8(t32 + 32), vld1q_u8(t32 + 48)};
  }
  const int fmt = int(d[L_FP8]);
  qrt::row_passes(M, [&](int64_t m0, auto r) {
    gemv_rows<B, decltype(r)::value>(d, book, fmt, xs + m0 * Kp, y, m0, threads);
  });
  return 0;
}
#endif

}  // namespace

extern "C" {

// y[M, N] = x[M, K] @ W.T + bias for a prepared code-book or fp8 weight `d` (lut.cpp's layout,
// lut_avx2.cpp's descriptor), with the ABI of quantrt_lut_linear (the strategy argument is accepted
// and ignored: one GEMV). Returns 0, 1 when not compiled (not an Arm NEON build), 2 when out of memory.
int32_t quantrt_lut_neon_linear(const int64_t* d, const void* x, int32_t xdt, int64_t M, int64_t sxm, int64_t sxk,
                                const void* bias, int32_t bdt, void* y, int32_t ydt, int64_t ldy, int32_t threads,
                                int32_t strategy) {
  (void)strategy;
#ifdef QRT_LUT_NEON
  if (M <= 0) return 0;
  threads = std::max(threads, 1);
  const YView yv{y, ydt, ldy, bias, bdt, d[L_N], reinterpret_cast<const float*>(d[L_ROWSCALE])};
  return d[L_BITS] == 8 ? run<FP8>(d, x, xdt, M, sxm, sxk, yv, threads) : run<BOOK>(d, x, xdt, M, sxm, sxk, yv, threads);
#else
  (void)d, (void)x, (void)xdt, (void)M, (void)sxm, (void)sxk, (void)bias, (void)bdt, (void)y, (void)ydt, (void)ldy;
  (void)threads;
  return 1;
#endif
}

}  // extern "C"
