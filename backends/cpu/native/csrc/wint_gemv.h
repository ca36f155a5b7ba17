// The call shared by the integer-weight GEMV builds (wint_avx2.cpp, wint_neon.cpp): the activation
// rows prepared once into scratch (their ISA's xprep), then one pass over the codes per group of up
// to 4 rows (qrt::row_passes, their ISA's gemv_rows). Each build names its two templates in a struct
// (`prep<B>`, `rows<B, R>`) and calls wint_linear from its C entry point.
#pragma once
#include "common.h"
#include "layouts.h"

namespace qrt {

template <class Isa, int B>
int wint_run(const int64_t* d, const void* x, int32_t xdt, int64_t M, int64_t sxm, int64_t sxk, const YView& y,
             int threads, Scratch& xbuf, Scratch& sumbuf) {
  const int64_t K = d[W_K], Kp = d[W_KP], fold = d[W_FOLD], nf = (Kp + fold - 1) / fold;
  float* xs = static_cast<float*>(xbuf.get(sizeof(float) * M * Kp));
  float* xsum = static_cast<float*>(sumbuf.get(sizeof(float) * M * nf));
  if (!xs || !xsum) return 2;
  Isa::template prep<B>(x, xdt, M, sxm, sxk, reinterpret_cast<const int32_t*>(d[W_PERM]), K, Kp, fold, nf, xs,
                        xsum);
  row_passes(M, [&](int64_t m0, auto r) {
    Isa::template rows<B, decltype(r)::value>(d, xs + m0 * Kp, xsum + m0 * nf, nf, y, m0, threads);
  });
  return 0;
}

// y[M, N] = x[M, K] @ W.T + bias for a prepared integer weight `d` (wint.cpp's layout and descriptor):
// 0, or 2 when the scratch cannot be had.
template <class Isa>
int32_t wint_linear(const int64_t* d, const void* x, int32_t xdt, int64_t M, int64_t sxm, int64_t sxk,
                    const void* bias, int32_t bdt, void* y, int32_t ydt, int64_t ldy, int32_t threads, Scratch& xbuf,
                    Scratch& sumbuf) {
  if (M <= 0) return 0;
  threads = std::max(threads, 1);
  const YView yv{y, ydt, ldy, bias, bdt, d[W_N]};
  switch (d[W_BITS]) {
    case 8: return wint_run<Isa, 8>(d, x, xdt, M, sxm, sxk, yv, threads, xbuf, sumbuf);
    case 4: return wint_run<Isa, 4>(d, x, xdt, M, sxm, sxk, yv, threads, xbuf, sumbuf);
    case 3: return wint_run<Isa, 3>(d, x, xdt, M, sxm, sxk, yv, threads, xbuf, sumbuf);
    default: return wint_run<Isa, 2>(d, x, xdt, M, sxm, sxk, yv, threads, xbuf, sumbuf);
  }
}

}  // namespace qrt
