// Integer weight-only linear layers (int2/int3/int4/int8 codes, fp32/bf16/fp16 activations) for Arm
// CPUs with NEON (aarch64). They read wint.cpp's prepared layout unchanged, as wint_avx2.cpp does, with
// the same arithmetic: a tile's 16 rows are four vectors of 4 fp32 lanes, one per row; a 2- or 4-bit
// code is masked where it lies in its row's 16-bit word and converted as code * 2^p against
// x * 2^-p (prepared once per call), 3- and 8-bit codes are converted as integers; fused
// multiply-adds per fold, the fold's scale and zero point applied through its activation sum:
//   y = sum_f s_f * (sum_{k in f} c x - z_f * sum_{k in f} x).
// One GEMV, 4 activation rows per pass over the codes, threads taking tiles.
#include "common.h"
#include "layouts.h"
#include "wint_gemv.h"

#include <algorithm>

namespace {

constexpr int TILE = 16;

using qrt::Scratch;
using qrt::YView;
thread_local Scratch tl_x, tl_sum;

#if defined(__aarch64__) && defined(__ARM_NEON)
#define QRT_WINT_NEON 1

template <int B>
using Step = WintStep<B>;

// code j of the 4 rows of quarter v (rows 4v .. 4v + 3) of one step, as fp32 (times 2^P[j])
template <int B>
inline void decode(const uint8_t* q, int v, float32x4_t* c) {
  constexpr int S = Step<B>::S;
  const uint16_t* words = reinterpret_cast<const uint16_t*>(q) + 4 * v;
  if constexpr (B == 8) {
    const int32x4_t w = vmovl_s16(vld1_s16(reinterpret_cast<const int16_t*>(words)));
    c[0] = vcvtq_f32_s32(vshrq_n_s32(vshlq_n_s32(w, 24), 24));
    c[1] = vcvtq_f32_s32(vshrq_n_s32(w, 8));
  } else if constexpr (B == 3) {
    // the low two bits as for 2 bits; bit 2 of code (r, k0 + 2f + e) is bit 2r + e of mask f
    const uint32x4_t w = vmovl_u16(vld1_u16(words));
    const int32_t r0 = 4 * v;
    const int32x4_t lane2 = {-2 * r0, -2 * (r0 + 1), -2 * (r0 + 2), -2 * (r0 + 3)};
    for (int f = 0; f < 4; ++f) {
      uint32_t m;
      std::memcpy(&m, q + 32 + 4 * f, 4);
      for (int e = 0; e < 2; ++e) {
        const uint32x4_t lo = vandq_u32(vshlq_u32(w, vdupq_n_s32(-(2 * f + 8 * e))), vdupq_n_u32(3));
        const uint32x4_t hb = vandq_u32(vshlq_u32(vdupq_n_u32(m), vaddq_s32(lane2, vdupq_n_s32(-e))), vdupq_n_u32(1));
        c[2 * f + e] = vcvtq_f32_u32(vorrq_u32(lo, vshlq_n_u32(hb, 2)));
      }
    }
  } else {
    const uint32x4_t w = vmovl_u16(vld1_u16(words));
    const uint32_t mask = B == 4 ? 15 : 3;
    for (int j = 0; j < S; ++j) c[j] = vcvtq_f32_u32(vandq_u32(w, vdupq_n_u32(mask << Step<B>::P[j])));
  }
}

// x rows as fp32, zero from K to Kp, columns gathered through perm, code k of a step scaled by
// 2^-P[k mod S]; xsum[m][f] = the unscaled sum of row m over fold f
template <int B>
void xprep(const void* x, int32_t dt, int64_t M, int64_t sm, int64_t sk, const int32_t* perm, int64_t K,
           int64_t Kp, int64_t fold, int64_t nf, float* xs, float* xsum) {
  for (int64_t m = 0; m < M; ++m)
    wint_prep_row<B>(x, dt, m * sm, sk, perm, K, Kp, fold, nf, 0, xs + m * Kp, xsum + m * nf);
}

// the 16 fp32 results (before bias) of tile t for R activation rows
template <int B, int R>
void gemv_tile(const int64_t* d, int64_t t, const float* xs, const float* xsum, int64_t nf, float32x4_t (&tot)[R][4]) {
  constexpr int S = Step<B>::S;
  const int64_t Kp = d[W_KP], steps = Kp / S, fsteps = d[W_FOLD] / S, sstr = d[W_SSTRIDE] * TILE;
  const uint8_t* q = reinterpret_cast<const uint8_t*>(d[W_Q]) + t * steps * Step<B>::BYTES;
  const float* sc = reinterpret_cast<const float*>(d[W_SCALES]) + t * d[W_NG] * TILE;
  const int16_t* zr = d[W_ZEROS] ? reinterpret_cast<const int16_t*>(d[W_ZEROS]) + t * d[W_NG] * TILE : nullptr;
  const int32_t zbase = B == 8 ? 0 : 1 << (B - 1);  // as in wint_avx2.cpp
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) tot[r][v] = vdupq_n_f32(0.f);
  for (int64_t s0 = 0, f = 0; s0 < steps; s0 += fsteps, ++f) {
    const int64_t s1 = std::min(steps, s0 + fsteps);
    float32x4_t acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 4; ++v) acc[r][v] = vdupq_n_f32(0.f);
    for (int64_t s = s0; s < s1; ++s) {
      const uint8_t* p = q + s * Step<B>::BYTES;
      for (int v = 0; v < 4; ++v) {
        float32x4_t c[S];
        decode<B>(p, v, c);
        for (int j = 0; j < S; ++j)
          for (int r = 0; r < R; ++r) acc[r][v] = vfmaq_n_f32(acc[r][v], c[j], xs[r * Kp + s * S + j]);
      }
    }
    for (int v = 0; v < 4; ++v) {
      const float32x4_t sv = vld1q_f32(sc + f * sstr + 4 * v);
      int32x4_t zi = vdupq_n_s32(zbase);
      if (zr) zi = vaddq_s32(zi, vmovl_s16(vld1_s16(zr + f * sstr + 4 * v)));
      const float32x4_t sz = vmulq_f32(sv, vcvtq_f32_s32(zi));
      for (int r = 0; r < R; ++r) {
        tot[r][v] = vfmaq_f32(tot[r][v], acc[r][v], sv);
        tot[r][v] = vfmsq_n_f32(tot[r][v], sz, xsum[r * nf + f]);
      }
    }
  }
}

template <int B, int R>
void gemv_rows(const int64_t* d, const float* xs, const float* xsum, int64_t nf, const YView& y, int64_t m0,
               int threads) {
  qrt::tiles_in_parallel<R>(d[W_T], threads, y, m0, [&](int64_t t, float (&v)[R][16]) {
    float32x4_t tot[R][4];
    gemv_tile<B, R>(d, t, xs, xsum, nf, tot);
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 4; ++i) vst1q_f32(v[r] + 4 * i, tot[r][i]);
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
// Returns 0, 1 when not compiled (not an Arm NEON build), 2 when out of memory.
int32_t quantrt_wint_neon_linear(const int64_t* d, const void* x, int32_t xdt, int64_t M, int64_t sxm,
                                 int64_t sxk, const void* bias, int32_t bdt, void* y, int32_t ydt, int64_t ldy,
                                 int32_t threads, int32_t strategy) {
  (void)strategy;
#ifdef QRT_WINT_NEON
  return qrt::wint_linear<Isa>(d, x, xdt, M, sxm, sxk, bias, bdt, y, ydt, ldy, threads, tl_x, tl_sum);
#else
  (void)d, (void)x, (void)xdt, (void)M, (void)sxm, (void)sxk, (void)bias, (void)bdt, (void)y, (void)ydt, (void)ldy;
  (void)threads;
  return 1;
#endif
}

}  // extern "C"
