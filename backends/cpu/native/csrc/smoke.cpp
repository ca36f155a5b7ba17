// The build check: one function per feature the kernels rely on (OpenMP threads, the ISA the
// build targeted), so a failing toolchain shows up in one small test.
#include "common.h"

extern "C" {

// y[i] = x[i] * a, over n elements on `threads` OpenMP threads; returns the threads that ran
int32_t quantrt_smoke_scale(const float* x, float* y, int64_t n, float a, int32_t threads) {
  int32_t ran = 1;
#pragma omp parallel num_threads(threads)
  {
#pragma omp single
    ran = omp_get_num_threads();
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * a;
  }
  return ran;
}

// bit 0: AVX2, bit 1: AVX-512F, bit 2: AVX-512 VNNI, bit 3: AVX-512 BF16 (as compiled)
int32_t quantrt_smoke_isa() {
  int32_t r = 0;
#ifdef __AVX2__
  r |= 1;
#endif
#ifdef __AVX512F__
  r |= 2;
#endif
#ifdef __AVX512VNNI__
  r |= 4;
#endif
#ifdef __AVX512BF16__
  r |= 8;
#endif
  return r;
}
}
