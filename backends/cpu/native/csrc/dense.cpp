// Dense 16-bit linear layers at small batch (GEMV): y[M, N] = x[M, K] @ W[N, K].T + bias, with W in
// bf16 or fp16 read in place (row-major, unit column stride, row stride ldw; no prepared copy) and
// x / y / bias in fp32, bf16 or fp16. For x86 CPUs with AVX-512 F/BW (+ BF16 for bf16 weights).
//
// At M=1 the layer is a stream over the weights: a tile is 8 weight rows read side by side, each
// with 4 accumulator chains (chunks k/32 mod 4) to hide the FMA latency, and the threads take 16-row
// chunks from a shared counter (llama.cpp's split). Measured on Zen 4 (2 threads, the seven linears
// of a llama-3-8B layer, A/B-interleaved in one process): 8 streams per thread kept more weight lines
// in flight than one (fp16 weights 15-40% faster, bf16 weights 15-30%, the median of each run),
// with the fp16 weight halves converted straight from memory; a software prefetch (512-2048 weights
// ahead) ran slower. For M > 1 a tile is 4 weight rows x 4 activation rows, so each weight line
// loaded serves 4 rows of x from registers and a 4-row block of W stays in L1/L2 between passes over
// further rows of x; threads (OpenMP, the caller's count) take contiguous runs of blocks. Every output
// element is the same fp32 arithmetic in K order whatever its block or thread, reduced the same way:
// for a given M the result does not depend on the thread count.
//
// Products by weight and activation dtype (every product exact, sums fp32):
//   bf16 W, bf16 x: _mm512_dpbf16_ps of the weight line against 32 bf16 of x.
//   bf16 W, fp16 x: x split exactly into two bf16 parts hi + lo (11 mantissa bits fit in 2 x 8),
//                   two dpbf16 per line.
//   bf16 W, fp32 x: the weights widened to fp32 (a shift) and FMA with x: exact products rounded
//                   per FMA like torch's fp32 matmul; cheaper than the 3 bf16 parts an exact
//                   split of fp32 needs (2 FMAs + 2 widenings per line against 3 dpbf16 per row).
//   fp16 W, any x: _mm512_cvtph_ps of the weights and FMA with x widened to fp32.
// K is padded to a multiple of 32 in x's prepared copy (zeros) and the weights' last line is
// read with a mask, so nothing past a row is read and no garbage can meet a zero.
#include "common.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>

namespace {

using qrt::BF16;
using qrt::F16;
using qrt::F32;

using qrt::Scratch;
thread_local Scratch tl_x;

inline int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

constexpr int64_t XSLICE = 256 << 10;  // bytes of x per K range at larger M (Zen 4's L2 is 1 MiB)

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define QRT_DENSE 1

inline __m512 bf16x16_to_f32(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// 16 values of a 16-bit or fp32 vector from p (dtype dt), lanes outside the mask 0
inline __m512 load16(const void* p, int32_t dt, int64_t off, __mmask16 m) {
  switch (dt) {
    case BF16: return bf16x16_to_f32(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + off));
    case F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + off));
    default: return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + off);
  }
}

// 16 floats to bf16, round to nearest even, NaN stays NaN (no AVX512-BF16 needed)
inline __m256i f32_to_bf16x16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}

inline void store16(void* y, int32_t dt, int64_t off, __m512 v, __mmask16 m) {
  switch (dt) {
    case BF16: _mm256_mask_storeu_epi16(static_cast<uint16_t*>(y) + off, m, f32_to_bf16x16(v)); break;
    case F16:
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(y) + off, m,
                               _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      break;
    default: _mm512_mask_storeu_ps(static_cast<float*>(y) + off, m, v);
  }
}

inline __mmask16 mask16(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }
inline __mmask32 mask32(int64_t n) { return n >= 32 ? __mmask32(0xFFFFFFFFu) : __mmask32((1u << n) - 1); }

// the weight operand of one 32-wide chunk: one bf16 vector (dpbf16) or two fp32 halves (FMA)
enum Mode : int { DP = 0, F16W = 1, BF16W_F32 = 2 };

// prepared activations: rows of Kp values (NP bf16 parts [NP][M][Kp] for DP, fp32 [M][Kp] otherwise)
struct XP {
  const void* p;
  int64_t Kp;
  int64_t pstride;  // elements between bf16 parts
};

// One output tile: R weight rows x MB activation rows, U accumulators per output (chunks k/32 mod U),
// over the K chunks [k0, k1) (k0 a multiple of 32). Split over K (U = 1 only: rows() splits K only
// then), the accumulators wait in `keep` between ranges: the same arithmetic as one pass, with x's
// slice kept in L2.
template <int MODE, int R, int MB, int NP, int U>
inline void block(const uint16_t* w, int64_t ldw, int64_t K, int64_t k0, int64_t k1, const XP& x, int64_t m0,
                  float (*out)[R], __m512* keep) {
  __m512 acc[MB][R][U];
  for (int m = 0; m < MB; ++m)
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < U; ++u) acc[m][r][u] = k0 > 0 ? keep[(m * R + r) * U + u] : _mm512_setzero_ps();
  auto chunk = [&](int64_t k, int u, __mmask32 km, bool full) {
    if constexpr (MODE == DP) {
#ifdef __AVX512BF16__
      __m512i wv[R];
      for (int r = 0; r < R; ++r)
        wv[r] = full ? _mm512_loadu_si512(w + r * ldw + k) : _mm512_maskz_loadu_epi16(km, w + r * ldw + k);
      const uint16_t* xb = static_cast<const uint16_t*>(x.p);
      for (int m = 0; m < MB; ++m) {
        for (int p = 0; p < NP; ++p) {
          const __m512i xv = _mm512_load_si512(xb + p * x.pstride + (m0 + m) * x.Kp + k);
          for (int r = 0; r < R; ++r)
            acc[m][r][u] = _mm512_dpbf16_ps(acc[m][r][u], (__m512bh)wv[r], (__m512bh)xv);
        }
      }
#endif
    } else {
      __m512 w0[R], w1[R];
      for (int r = 0; r < R; ++r) {
        // a full line as two 256-bit halves straight from memory (no 512-bit load + extract)
        const uint16_t* p = w + r * ldw + k;
        const __m256i* q = reinterpret_cast<const __m256i*>(p);
        const __m512i raw = full ? _mm512_setzero_si512() : _mm512_maskz_loadu_epi16(km, p);
        const __m256i lo = full ? _mm256_loadu_si256(q) : _mm512_castsi512_si256(raw);
        const __m256i hi = full ? _mm256_loadu_si256(q + 1) : _mm512_extracti64x4_epi64(raw, 1);
        if constexpr (MODE == F16W) {
          w0[r] = _mm512_cvtph_ps(lo);
          w1[r] = _mm512_cvtph_ps(hi);
        } else {
          w0[r] = bf16x16_to_f32(lo);
          w1[r] = bf16x16_to_f32(hi);
        }
      }
      const float* xf = static_cast<const float*>(x.p);
      for (int m = 0; m < MB; ++m) {
        const __m512 x0 = _mm512_load_ps(xf + (m0 + m) * x.Kp + k);
        const __m512 x1 = _mm512_load_ps(xf + (m0 + m) * x.Kp + k + 16);
        for (int r = 0; r < R; ++r) {
          acc[m][r][u] = _mm512_fmadd_ps(w0[r], x0, acc[m][r][u]);
          acc[m][r][u] = _mm512_fmadd_ps(w1[r], x1, acc[m][r][u]);
        }
      }
    }
  };
  const int64_t Kfull = std::min(k1, K / 32 * 32);
  int64_t k = k0;
  for (; k + 32 * U <= Kfull; k += 32 * U)
    for (int u = 0; u < U; ++u) chunk(k + 32 * u, u, 0, true);
  for (int u = 0; u < U; ++u)  // u stays a constant: the accumulators stay in registers
    if (k < Kfull) {
      chunk(k, u, 0, true);
      k += 32;
    }
  if (k1 < K) {
    for (int m = 0; m < MB; ++m)
      for (int r = 0; r < R; ++r)
        for (int u = 0; u < U; ++u) keep[(m * R + r) * U + u] = acc[m][r][u];
    return;
  }
  if (k < K) chunk(k, 0, mask32(K - k), false);
  for (int m = 0; m < MB; ++m)
    for (int r = 0; r < R; ++r) {
      __m512 a = acc[m][r][0];
      for (int u = 1; u < U; ++u) a = _mm512_add_ps(a, acc[m][r][u]);
      out[m][r] = _mm512_reduce_add_ps(a);
    }
}

struct Problem {
  const uint16_t* w;
  int64_t ldw, N, K, M;
  XP x;
  const void* bias;
  int32_t bdt;
  void* y;
  int32_t ydt;
  int64_t ldy;
};

// rows [n0, n0 + R) of y for every row of x: passes of MB activation rows over the R weight rows
// (after the first pass they come from L1/L2), over K ranges whose slice of x fits in L2
template <int MODE, int R, int MB, int NP, int U>
void rows(const Problem& pb, int64_t n0) {
  float out[MB][R];
  float bias[R];
  for (int r = 0; r < R; ++r) bias[r] = pb.bias ? qrt::load_act(pb.bias, n0 + r, pb.bdt) : 0.0f;
  const uint16_t* w = pb.w + n0 * pb.ldw;
  auto emit = [&](int64_t m0, int mb) {
    for (int m = 0; m < mb; ++m)
      for (int r = 0; r < R; ++r) qrt::store_out(pb.y, (m0 + m) * pb.ldy + n0 + r, out[m][r] + bias[r], pb.ydt);
  };
  const int64_t xbytes = pb.M * (MODE == DP ? 2 * NP : 4);  // bytes of x per k
  const int64_t kc = U == 1 && pb.M > MB ? std::max<int64_t>(256, XSLICE / xbytes / 32 * 32) : pb.K;
  const int64_t nm = (pb.M + MB - 1) / MB;
  alignas(64) __m512 keep[16 * MB * R * U];  // accumulators of up to 16 m-blocks between K ranges
  for (int64_t g0 = 0; g0 < nm; g0 += 16) {
    const int64_t g1 = std::min(nm, g0 + 16);
    for (int64_t k0 = 0; k0 < pb.K; k0 += kc) {
      const int64_t k1 = std::min(pb.K, k0 + kc);
      for (int64_t g = g0; g < g1; ++g) {
        const int64_t m0 = g * MB;
        __m512* kp = keep + (g - g0) * MB * R * U;
        switch (std::min<int64_t>(MB, pb.M - m0)) {
          case 1: block<MODE, R, 1, NP, U>(w, pb.ldw, pb.K, k0, k1, pb.x, m0, out, kp); break;
          case 2: block<MODE, R, (MB > 1 ? 2 : 1), NP, U>(w, pb.ldw, pb.K, k0, k1, pb.x, m0, out, kp); break;
          case 3: block<MODE, R, (MB > 2 ? 3 : 1), NP, U>(w, pb.ldw, pb.K, k0, k1, pb.x, m0, out, kp); break;
          default: block<MODE, R, MB, NP, U>(w, pb.ldw, pb.K, k0, k1, pb.x, m0, out, kp); break;
        }
        if (k1 == pb.K) emit(m0, int(std::min<int64_t>(MB, pb.M - m0)));
      }
    }
  }
}

// Threads take contiguous runs of R-row blocks; the last N % R rows go one by one to the last thread
// (with the same per-output arithmetic as in a block).
template <int MODE, int R, int MB, int NP, int U>
void run_tiles(const Problem& pb, int threads) {
  const int64_t nb = pb.N / R;
  const int64_t work = pb.N * pb.K * pb.M;
  const int nt = int(std::max<int64_t>(1, std::min<int64_t>(threads, work < (int64_t(1) << 16) ? 1 : pb.N)));
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t b0 = nb * t / T, b1 = nb * (t + 1) / T;
    for (int64_t b = b0; b < b1; ++b) rows<MODE, R, MB, NP, U>(pb, b * R);
    if (t == T - 1)
      for (int64_t n = nb * R; n < pb.N; ++n) rows<MODE, 1, MB, NP, U>(pb, n);
  }
}

// M=1: threads take CH-row chunks from a shared counter, R-row tiles within a chunk, the rows past
// the last full tile one by one (with the same per-output arithmetic as in a tile)
template <int MODE, int R, int NP, int U>
void run_chunks(const Problem& pb, int threads) {
  constexpr int64_t CH = 2 * R;
  const int64_t work = pb.N * pb.K;
  const int nt = int(std::max<int64_t>(1, std::min<int64_t>(threads, work < (int64_t(1) << 16) ? 1 : pb.N)));
  std::atomic<int64_t> next{0};
#pragma omp parallel num_threads(nt)
  {
    for (;;) {
      const int64_t c = next.fetch_add(CH, std::memory_order_relaxed);
      if (c >= pb.N) break;
      const int64_t e = std::min(pb.N, c + CH);
      int64_t n = c;
      for (; n + R <= e; n += R) rows<MODE, R, 1, NP, U>(pb, n);
      for (; n < e; ++n) rows<MODE, 1, 1, NP, U>(pb, n);
    }
  }
}

// M=1: 8 rows side by side with 4 accumulator chains each (see the header); larger M: 4 weight rows x
// 4 activation rows per tile, each weight line used 4 (x 4) times from registers.
template <int MODE, int NP>
void run(const Problem& pb, int threads) {
  if (pb.M == 1)
    run_chunks<MODE, 8, NP, 4>(pb, threads);
  else
    run_tiles<MODE, 4, 4, NP, 1>(pb, threads);
}

#endif

}  // namespace

extern "C" {

// bit 0: the fp16-weight kernels are compiled (AVX-512 F/BW), bit 1: the bf16-weight ones (+ BF16)
int32_t quantrt_dense_isa() {
  int32_t r = 0;
#ifdef QRT_DENSE
  r |= 1;
#ifdef __AVX512BF16__
  r |= 2;
#endif
#endif
  return r;
}

// y[M, N] = x[M, K] @ W[N, K].T + bias. W: dtype wdt (BF16 or F16), row stride ldw, unit column stride;
// x: dtype xdt, element strides sxm/sxk; bias: dtype bdt or null; y: dtype ydt, row stride ldy (unit
// column stride). Returns 0, 1 when the kernel for wdt is not compiled, 2 when out of memory.
int32_t quantrt_dense_linear(const void* w, int32_t wdt, int64_t N, int64_t K, int64_t ldw, const void* x,
                             int32_t xdt, int64_t M, int64_t sxm, int64_t sxk, const void* bias, int32_t bdt,
                             void* y, int32_t ydt, int64_t ldy, int32_t threads) {
#ifdef QRT_DENSE
  if (wdt == BF16 && !(quantrt_dense_isa() & 2)) return 1;
  if (M <= 0 || N <= 0) return 0;
  threads = std::max(threads, 1);
  const int64_t Kp = round_up(std::max<int64_t>(K, 1), 32);
  const int mode = wdt == F16 ? F16W : (xdt == F32 ? BF16W_F32 : DP);
  const int NP = mode != DP ? 1 : (xdt == BF16 ? 1 : 2);
  const size_t bytes = mode == DP ? sizeof(uint16_t) * NP * M * Kp : sizeof(float) * M * Kp;
  void* buf = tl_x.get(bytes);
  if (!buf) return 2;
  // the prepared activations: zero from K to Kp
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < Kp; k += 16) {
      const int64_t n = std::min<int64_t>(16, K - k);
      __m512 v;
      if (n <= 0) {
        v = _mm512_setzero_ps();
      } else if (sxk == 1) {
        v = load16(x, xdt, m * sxm + k, mask16(n));
      } else {
        alignas(64) float t[16] = {};
        for (int64_t i = 0; i < n; ++i) t[i] = qrt::load_act(x, m * sxm + (k + i) * sxk, xdt);
        v = _mm512_load_ps(t);
      }
      if (mode != DP) {
        _mm512_store_ps(static_cast<float*>(buf) + m * Kp + k, v);
      } else {
        uint16_t* xb = static_cast<uint16_t*>(buf);
        const __m256i h = f32_to_bf16x16(v);
        _mm256_store_si256(reinterpret_cast<__m256i*>(xb + m * Kp + k), h);
        if (NP == 2) {
          const __m256i l = f32_to_bf16x16(_mm512_sub_ps(v, bf16x16_to_f32(h)));
          _mm256_store_si256(reinterpret_cast<__m256i*>(xb + (M + m) * Kp + k), l);
        }
      }
    }
  }
  const Problem pb{static_cast<const uint16_t*>(w), ldw, N, K, M, XP{buf, Kp, M * Kp}, bias, bdt, y, ydt, ldy};
#ifdef __AVX512BF16__
  if (mode == DP) {
    if (NP == 1)
      run<DP, 1>(pb, threads);
    else
      run<DP, 2>(pb, threads);
    return 0;
  }
#endif
  if (mode == F16W)
    run<F16W, 1>(pb, threads);
  else
    run<BF16W_F32, 1>(pb, threads);
  return 0;
#else
  return 1;
#endif
}

}  // extern "C"
