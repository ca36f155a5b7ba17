// A cross-compiled driver of a weight-only GEMV build for the NEON tests (tests/cpu/test_neon_qemu.py),
// run under qemu-aarch64: reads one prepared weight and x from argv[1], writes y to argv[2]. Built with
// csrc/wint_neon.cpp (-DQRT_HARNESS_WINT) or csrc/lut_neon.cpp (-DQRT_HARNESS_LUT).
//   input:  int64 desc[LEN] (the layout's field order) with each pointer field replaced by its array's
//           byte count (0: none), int64 M; then those arrays in field order; x (M x K fp32)
//   output: y (M x N fp32)
#include <cstdint>
#include <cstdio>
#include <vector>

#include "layouts.h"

extern "C" {
typedef int32_t (*Linear)(const int64_t*, const void*, int32_t, int64_t, int64_t, int64_t, const void*, int32_t,
                          void*, int32_t, int64_t, int32_t, int32_t);
int32_t quantrt_wint_neon_linear(const int64_t*, const void*, int32_t, int64_t, int64_t, int64_t, const void*,
                                 int32_t, void*, int32_t, int64_t, int32_t, int32_t);
int32_t quantrt_lut_neon_linear(const int64_t*, const void*, int32_t, int64_t, int64_t, int64_t, const void*,
                                int32_t, void*, int32_t, int64_t, int32_t, int32_t);
}

#if defined(QRT_HARNESS_WINT)
constexpr int LEN = W_LEN, FK = W_K, FN = W_N;
constexpr int ARRAYS[] = {W_Q, W_SCALES, W_ZEROS, W_PERM};
const Linear linear = quantrt_wint_neon_linear;
#elif defined(QRT_HARNESS_LUT)
constexpr int LEN = L_LEN, FK = L_K, FN = L_N;
constexpr int ARRAYS[] = {L_Q, L_SCALES, L_ROWSCALE, L_TAB, L_TAB32};
const Linear linear = quantrt_lut_neon_linear;
#else
#error "define QRT_HARNESS_WINT or QRT_HARNESS_LUT"
#endif

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* in = std::fopen(argv[1], "rb");
  if (!in) return 3;
  int64_t d[LEN], M;
  if (std::fread(d, 8, LEN, in) != size_t(LEN) || std::fread(&M, 8, 1, in) != 1 || M < 0) return 4;
  std::vector<std::vector<uint8_t>> arrays;
  for (const int f : ARRAYS) {
    if (d[f] < 0) return 4;
    arrays.emplace_back(static_cast<size_t>(d[f]));
    if (std::fread(arrays.back().data(), 1, arrays.back().size(), in) != arrays.back().size()) return 5;
    d[f] = arrays.back().empty() ? 0 : reinterpret_cast<int64_t>(arrays.back().data());
  }
  const int64_t K = d[FK], N = d[FN];
  std::vector<float> x(static_cast<size_t>(M * K)), y(static_cast<size_t>(M * N));
  if (std::fread(x.data(), 4, x.size(), in) != x.size()) return 5;
  std::fclose(in);
  const int32_t rc = linear(d, x.data(), 0, M, K, 1, nullptr, 0, y.data(), 0, N, 2, 0);
  if (rc) return 10 + rc;
  FILE* out = std::fopen(argv[2], "wb");
  if (!out) return 6;
  std::fwrite(y.data(), 4, y.size(), out);
  std::fclose(out);
  return 0;
}
