// A cross-compiled driver of csrc/wint_neon.cpp for the NEON tests (tests/cpu/test_neon_qemu.py), run
// under qemu-aarch64: reads one prepared weight and x from argv[1], writes y to argv[2].
//   input:  int64 desc[W_LEN] (WintField order) with each pointer field replaced by its array's byte
//           count (0: none), int64 M; then the arrays q, scales, zeros, perm in that order; x (M x K fp32)
//   output: y (M x N fp32)
#include <cstdint>
#include <cstdio>
#include <vector>

#include "layouts.h"

extern "C" int32_t quantrt_wint_neon_linear(const int64_t* d, const void* x, int32_t xdt, int64_t M, int64_t sxm,
                                            int64_t sxk, const void* bias, int32_t bdt, void* y, int32_t ydt,
                                            int64_t ldy, int32_t threads, int32_t strategy);

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* in = std::fopen(argv[1], "rb");
  if (!in) return 3;
  int64_t d[W_LEN], M;
  if (std::fread(d, 8, W_LEN, in) != size_t(W_LEN) || std::fread(&M, 8, 1, in) != 1 || M < 0) return 4;
  std::vector<std::vector<uint8_t>> arrays;
  for (const int f : {W_Q, W_SCALES, W_ZEROS, W_PERM}) {
    if (d[f] < 0) return 4;
    arrays.emplace_back(static_cast<size_t>(d[f]));
    if (std::fread(arrays.back().data(), 1, arrays.back().size(), in) != arrays.back().size()) return 5;
    d[f] = arrays.back().empty() ? 0 : reinterpret_cast<int64_t>(arrays.back().data());
  }
  const int64_t K = d[W_K], N = d[W_N];
  std::vector<float> x(static_cast<size_t>(M * K)), y(static_cast<size_t>(M * N));
  if (std::fread(x.data(), 4, x.size(), in) != x.size()) return 5;
  std::fclose(in);
  const int32_t rc = quantrt_wint_neon_linear(d, x.data(), 0, M, K, 1, nullptr, 0, y.data(), 0, N, 2, 0);
  if (rc) return 10 + rc;
  FILE* out = std::fopen(argv[2], "wb");
  if (!out) return 6;
  std::fwrite(y.data(), 4, y.size(), out);
  std::fclose(out);
  return 0;
}
