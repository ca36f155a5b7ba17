// A cross-compiled driver of csrc/gguf.cpp's C ABI for the NEON tests (tests/cpu/test_neon_qemu.py),
// run under qemu-aarch64: reads one problem from argv[1], writes the result to argv[2].
//   input:  int32 type, int64 N, K, M, wbytes; the canonical blocks (wbytes); x (M x K fp32)
//   output: int32 group rows of this build for the type; y (M x N fp32)
#include <cstdint>
#include <cstdio>
#include <vector>

extern "C" {
int32_t quantrt_gguf_group_rows_of(int32_t type);
int64_t quantrt_gguf_ws_row(int32_t type, int64_t K);
int32_t quantrt_gguf_linear(int32_t type, const uint8_t* w, int64_t N, int64_t K, int64_t ngroups, const void* x,
                            int64_t M, int64_t sxm, int64_t sxk, int32_t xdt, const void* bias, int32_t bdt, void* out,
                            int64_t som, int32_t odt, uint8_t* ws, int32_t threads);
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* in = std::fopen(argv[1], "rb");
  if (!in) return 3;
  int32_t type;
  int64_t N, K, M, wbytes;
  if (std::fread(&type, 4, 1, in) != 1 || std::fread(&N, 8, 1, in) != 1 || std::fread(&K, 8, 1, in) != 1 ||
      std::fread(&M, 8, 1, in) != 1 || std::fread(&wbytes, 8, 1, in) != 1 || N < 0 || K < 0 || M < 0 || wbytes < 0)
    return 4;
  std::vector<uint8_t> w(static_cast<size_t>(wbytes));
  std::vector<float> x(static_cast<size_t>(M * K));
  if (std::fread(w.data(), 1, w.size(), in) != w.size() || std::fread(x.data(), 4, x.size(), in) != x.size()) return 5;
  std::fclose(in);
  std::vector<float> y(static_cast<size_t>(M * N));
  std::vector<uint8_t> ws(static_cast<size_t>(M * quantrt_gguf_ws_row(type, K)));
  const int32_t rc = quantrt_gguf_linear(type, w.data(), N, K, 0, x.data(), M, K, 1, 0, nullptr, 0, y.data(), N, 0,
                                         ws.data(), 2);
  if (rc) return 10 - rc;
  FILE* out = std::fopen(argv[2], "wb");
  if (!out) return 6;
  const int32_t g = quantrt_gguf_group_rows_of(type);
  std::fwrite(&g, 4, 1, out);
  std::fwrite(y.data(), 4, y.size(), out);
  std::fclose(out);
  return 0;
}
