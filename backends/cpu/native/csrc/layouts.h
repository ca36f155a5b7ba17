// The int64 descriptors Python builds per prepared weight (pointers as integers), shared by the
// builds that read one layout: wint.cpp, wint_avx2.cpp and wint_neon.cpp (wint_native.py WINT_FIELDS),
// lut.cpp, lut_avx2.cpp and lut_neon.cpp (lut_native.py FIELDS, then GEMV_FIELDS, which lut.cpp does not
// read).
#pragma once
#include "common.h"

#include <algorithm>

// an integer weight: codes, scales, zeros, act-order permutation, sizes, bits, fold
enum WintField : int {
  W_Q, W_SCALES, W_ZEROS, W_PERM, W_N, W_K, W_KP, W_T, W_NG, W_BITS, W_FOLD, W_SSTRIDE, W_KC, W_LEN
};
// An integer weight's step (wint.cpp's layout): codes per row and step, bytes per step, and the power
// of two p of code j of a step for the GEMVs that decode in place (wint_avx2.cpp, wint_neon.cpp): its
// bit position in its row's 16-bit word, 0 for 3 and 8 bits, which they decode to plain integers
template <int B>
struct WintStep;
template <>
struct WintStep<8> {
  static constexpr int S = 2, BYTES = 32;
  static constexpr int P[2] = {0, 0};
};
template <>
struct WintStep<4> {
  // word r: bits 0-3 code k0, 4-7 k0 + 2, 8-11 k0 + 1, 12-15 k0 + 3
  static constexpr int S = 4, BYTES = 32;
  static constexpr int P[4] = {0, 8, 4, 12};
};
template <>
struct WintStep<2> {
  // word r: bits 2f (+ 8 for odd codes) hold code k0 + 2f + e
  static constexpr int S = 8, BYTES = 32;
  static constexpr int P[8] = {0, 8, 2, 10, 4, 12, 6, 14};
};
template <>
struct WintStep<3> {
  static constexpr int S = 8, BYTES = 48;
  static constexpr int P[8] = {0, 0, 0, 0, 0, 0, 0, 0};
};

// One activation row prepared for a GEMV that decodes WintStep<B> codes in place, from element k0 on
// (the elements before it done by the caller, whole folds of them): row[k] = x[perm[k]] (zero from K
// to Kp), xsum[f] = the fold's sum, then row[k] scaled by 2^-P[k mod S] (exact: a power of two).
template <int B>
inline void wint_prep_row(const void* x, int32_t dt, int64_t off, int64_t sk, const int32_t* perm, int64_t K,
                          int64_t Kp, int64_t fold, int64_t nf, int64_t k0, float* row, float* xsum) {
  constexpr int S = WintStep<B>::S;
  for (int64_t k = k0; k < Kp; ++k) row[k] = k < K ? qrt::load_act(x, off + (perm ? perm[k] : k) * sk, dt) : 0.f;
  for (int64_t f = k0 / fold; f < nf; ++f) {
    float s = 0.f;
    for (int64_t k = f * fold; k < std::min(Kp, (f + 1) * fold); ++k) s += row[k];
    xsum[f] = s;
  }
  for (int64_t k = k0; k < Kp; ++k) row[k] *= 1.f / float(1 << WintStep<B>::P[k % S]);
}

// a W8A8 int8 weight
enum A8Field : int { A_Q, A_SCALES, A_N, A_K, A_KP, A_T, A_LEN };
// a code-book or float weight; the GEMV builds add the fp32 code book and the fp8 format
enum LutField : int {
  L_Q, L_SCALES, L_ROWSCALE, L_TAB, L_N, L_K, L_KP, L_T, L_NG, L_BITS, L_FOLD, L_SKIND, L_KC, L_HASLO, L_PRE,
  L_TAB32, L_FP8, L_LEN
};
// how a code-book weight's block scales are stored
enum ScaleKind : int { SK_NONE = 0, SK_F32 = 1, SK_E4M3 = 2, SK_E8M0 = 3 };
// the fp8 format of L_FP8
enum Fp8Format : int { E4M3 = 0, E5M2 = 1 };
