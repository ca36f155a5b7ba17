// The paged KV cache on x86 CPUs with AVX-512 F/BW/VL: quantize-on-write and decode attention.
//
// Planes (runtime/kv/pages.py): codes [slots, H, D] (fp32/bf16/fp16 for the unquantized cache, int8,
// fp8 e4m3fn or e5m2 bytes); dynamic scales [slots, H, ng] fp32 (token: ng = 1, group: ng = D / gs);
// static scales fp32 [1] (tensor) or [H] (head), beside the planes. TurboQuant (runtime/reference/
// turboquant.py): keys as 3/4-bit codebook indices packed [slots, H, D * bits / 8] with an fp16 norm
// [slots, H] (or e4m3 bytes, unscaled, for k8), values as 3/4-bit uniform codes packed the same way
// with an fp16 scale and zero-point [slots, H].
//
// Write: each kept row [D] of keys or values is read as fp32, its scales are amax / qmax (1 where
// amax is not > 0, as runtime/reference/kv.py), and each element is stored as sat(round(x / s)): an
// IEEE division (never a reciprocal product), int8 by round-half-even clamped to [-128, 127], fp8 by
// an RNE conversion of our own after clamping to +-max (NaN stays NaN), so the bytes equal the
// torch codec's. The unquantized cache stores x rounded once to its dtype (RNE). TurboQuant keys come
// in normalised and rotated by the caller (torch, the reference's own fp32 GEMM, which no other sum
// order reproduces bit for bit); here each element is coded by counting the boundaries <= y (the
// reference's searchsorted, ties to the upper cell) and packed. Values are coded whole here, with the
// reference's operations in its order.
//
// Decode: one query token per sequence; a work item is (sequence, KV head, context split) and holds
// the G = Hq / H query heads of that KV head, so each key and value row is read once for G heads.
// Rows are dequantized in registers, 16 elements at a time: int8 through cvtepi8, e5m2 is the high
// byte of an fp16, e4m3 is rebased into an fp16 (value * 2^-8, the 2^8 folded into the row scale),
// then cvtph. Row scales (tensor, head, token) multiply the dot product and the softmax weight, group
// scales each 16-element chunk. TurboQuant keys are never decoded: with R orthogonal, q . k =
// norm * (q R) . centroid[idx], so the caller rotates q once per call and a key chunk is 16 centroids
// picked from a register by permutexvar (the 3/4-bit codes unpacked by a shuffle and a shift); the
// norm multiplies the logit as a token scale does. Packed values are table[code] * scale + zero, one
// fma per chunk, in the same registers. Tiles of 32 tokens: scores for every head of the item, an online
// softmax in fp32 (exp by range reduction and a degree-6 polynomial, ~1 ulp), then the value rows
// accumulated into fp32 [G, D] per 16-column chunk with every head's weight (the accumulators stay
// in registers over the tile). Splits of a long context (few items for the threads) are merged at the
// end as flash decoding does; sinks join in the final normalisation. An item's rows are H * D elements
// apart and its pages scattered, which the hardware prefetchers do not follow: the rows PREFETCH
// tokens ahead are prefetched into L2 (on Zen 4 this made decode 2-3x faster at 4k-16k tokens).
#include "common.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

namespace {

using qrt::BF16;
using qrt::F16;
using qrt::F32;

// code types of the planes (C_U4 / C_U3: TurboQuant's packed 4- and 3-bit codes, read through a
// 16-entry table: centroids for keys, the code's integer for values)
enum Code : int32_t { C_F32 = 0, C_BF16 = 1, C_F16 = 2, C_I8 = 3, C_E4M3 = 4, C_E5M2 = 5, C_U4 = 6, C_U3 = 7 };
// scale granularity
enum Gran : int32_t { G_NONE = 0, G_TENSOR = 1, G_HEAD = 2, G_TOKEN = 3, G_GROUP = 4 };

inline int64_t code_size(int32_t ct) { return ct == C_F32 ? 4 : (ct == C_BF16 || ct == C_F16) ? 2 : 1; }
// bytes of one row of D codes (packed codes: D * bits / 8, D a multiple of 8 / 8 for 3 / 4 bits)
inline int64_t row_bytes(int32_t ct, int64_t D) {
  return ct == C_U4 ? D / 2 : ct == C_U3 ? D * 3 / 8 : D * code_size(ct);
}

using qrt::bits_of;
using qrt::float_of;

// fp32 -> fp8 (E exponent bits with bias B, M mantissa bits), round to nearest even. The callers
// clamp to the format's largest finite value first, so a finite input is in range; NaN gives the
// all-ones code 0x7F with the sign (what torch stores for NaN in both formats). |x| is scaled by a
// power of two so that one unit is the code's quantum (exact), rounded by nearbyint (RNE), and the
// rounded integer is added to the exponent field: a mantissa that rounds up to 2^(M+1) carries into
// the exponent, and a subnormal that rounds up to 2^M becomes the smallest normal, both by the add.
template <int M, int B>
inline uint8_t fp8_from_f32(float f) {
  const uint8_t sign = static_cast<uint8_t>((bits_of(f) >> 24) & 0x80);
  const float a = std::fabs(f);
  if (a != a) return static_cast<uint8_t>(0x7F | sign);
  if (a == 0.f) return sign;
  const int emin = 1 - B;  // the smallest normal exponent
  const int e = std::max(std::ilogb(a), emin);
  const float q = std::nearbyint(std::ldexp(a, M - e));  // units of 2^(e - M)
  const int field = e == emin && q < float(1 << M) ? 0 : e + B;  // subnormal: exponent field 0
  const int code = (field == 0 ? 0 : (field << M)) + static_cast<int>(q) - (field == 0 ? 0 : (1 << M));
  return static_cast<uint8_t>(code | sign);
}

inline uint8_t e4m3_from_f32(float f) { return fp8_from_f32<3, 7>(f); }
inline uint8_t e5m2_from_f32(float f) { return fp8_from_f32<2, 15>(f); }

inline float clampf(float y, float m) {  // NaN passes through (torch.clamp)
  return y > m ? m : (y < -m ? -m : y);
}

// one group of n elements of x (fp32) stored as codes at dst (code type ct) with scale s
inline void quantize_group(const float* x, int64_t n, float s, int32_t ct, float qmax, void* dst) {
  if (ct == C_I8) {
    int8_t* d = static_cast<int8_t*>(dst);
    for (int64_t i = 0; i < n; ++i) {
      float r = std::nearbyint(x[i] / s);
      r = r < -128.f ? -128.f : (r > 127.f ? 127.f : r);
      d[i] = r == r ? static_cast<int8_t>(r) : int8_t(0);
    }
  } else if (ct == C_E4M3) {
    uint8_t* d = static_cast<uint8_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = e4m3_from_f32(clampf(x[i] / s, qmax));
  } else {
    uint8_t* d = static_cast<uint8_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = e5m2_from_f32(clampf(x[i] / s, qmax));
  }
}

// amax / qmax, 1 where amax is not > 0 (0 or NaN); NaN propagates through the max as torch.amax
inline float dynamic_scale(const float* x, int64_t n, float qmax) {
  float a = 0.f;
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::fabs(x[i]);
    nan |= v != v;
    a = v > a ? v : a;
  }
  if (nan) return 1.f;
  return a > 0.f ? a / qmax : 1.f;
}

constexpr float FP16_MAX = 65504.f;

// codes [D] (each < 2^bits) packed as runtime/reference/turboquant.py's pack_bits: 4 bits two per
// byte, element 2j in the low nibble of byte j; 3 bits eight per three bytes, element 8g + i at bits
// 3i of the little-endian 24-bit word in bytes 3g..3g+2
inline void pack_codes(const int32_t* c, int64_t D, int32_t bits, uint8_t* dst) {
  if (bits == 4) {
    for (int64_t j = 0; j < D / 2; ++j) dst[j] = static_cast<uint8_t>(c[2 * j] | (c[2 * j + 1] << 4));
    return;
  }
  for (int64_t g = 0; g < D / 8; ++g) {
    uint32_t w = 0;
    for (int i = 0; i < 8; ++i) w |= uint32_t(c[8 * g + i]) << (3 * i);
    dst[3 * g] = static_cast<uint8_t>(w);
    dst[3 * g + 1] = static_cast<uint8_t>(w >> 8);
    dst[3 * g + 2] = static_cast<uint8_t>(w >> 16);
  }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define QRT_KV_DECODE 1
// ---- decode helpers ------------------------------------------------------------------------------

inline __mmask16 mask16(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }

// 16 codes from element i of a row as fp32 (e4m3: value * 2^-8); lanes outside m read nothing (0)
template <int CT>
inline __m512 load_codes(const void* row, int64_t i, __mmask16 m) {
  if constexpr (CT == C_F32) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(row) + i);
  } else if constexpr (CT == C_BF16) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(row) + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else if constexpr (CT == C_F16) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(row) + i));
  } else if constexpr (CT == C_I8) {
    const __m128i b = _mm_maskz_loadu_epi8(m, static_cast<const int8_t*>(row) + i);
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  } else if constexpr (CT == C_E5M2) {
    const __m128i b = _mm_maskz_loadu_epi8(m, static_cast<const uint8_t*>(row) + i);
    return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 8));
  } else {  // e4m3: sign to bit 15, exponent and mantissa to bits 7..13 of an fp16 (bias 15 vs 7)
    const __m128i b = _mm_maskz_loadu_epi8(m, static_cast<const uint8_t*>(row) + i);
    const __m256i w = _mm256_cvtepu8_epi16(b);
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8),
                                      _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7));
    return _mm512_cvtph_ps(h);
  }
}

template <int CT>
constexpr float code_mul() {
  return CT == C_E4M3 ? 256.f : 1.f;
}

template <int CT>
constexpr bool packed() {
  return CT == C_U4 || CT == C_U3;
}

// 16 packed codes from element i (a multiple of 16) of a row holding n more elements (n >= 16: all)
// as tab[code]. The chunk's bytes are loaded masked (never past the row), each lane's code is brought
// to its low bits by one variable shift (4 bits: every byte twice, odd lanes shifted by 4; 3 bits: the
// 24-bit word of the lane's group of 8 placed by a byte shuffle, shifted by 3 * lane), and
// permutexvar picks the table entry. It reads only an index's low 4 bits, so the next code above a
// code needs no mask: a 3-bit table holds its 8 entries twice.
template <int CT>
inline __m512 load_packed(const void* row, int64_t i, int64_t n, __m512 tab) {
  constexpr int BITS = CT == C_U4 ? 4 : 3;
  const uint8_t* p = static_cast<const uint8_t*>(row) + i * BITS / 8;
  const __m128i b = _mm_maskz_loadu_epi8(mask16((n >= 16 ? 16 : n) * BITS / 8), p);
  __m512i w;
  if constexpr (CT == C_U4) {
    w = _mm512_srlv_epi32(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, b)),
                          _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0));
  } else {
    const int g0 = int(0x80020100u), g1 = int(0x80050403u);  // bytes 0-2 / 3-5 and a zero byte
    const __m512i pick = _mm512_set_epi32(g1, g1, g1, g1, g1, g1, g1, g1, g0, g0, g0, g0, g0, g0, g0, g0);
    w = _mm512_srlv_epi32(_mm512_shuffle_epi8(_mm512_broadcast_i32x4(b), pick),
                          _mm512_set_epi32(21, 18, 15, 12, 9, 6, 3, 0, 21, 18, 15, 12, 9, 6, 3, 0));
  }
  return _mm512_permutexvar_ps(w, tab);
}

// e^x for 16 lanes: x = n ln2 + r, |r| <= ln2 / 2, Cephes' degree-6 polynomial, 2^n by scalef
// (exact, with underflow to 0); -inf gives 0
inline __m512 vexp(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.7f)), _mm512_set1_ps(-104.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500E-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

inline float sexp(float x) {
  alignas(64) float v[16];
  _mm512_store_ps(v, vexp(_mm512_set1_ps(x)));
  return v[0];
}

constexpr int TILE = 32;  // tokens per tile
#ifndef QRT_KV_PREFETCH
#define QRT_KV_PREFETCH 32
#endif
constexpr int64_t PREFETCH = QRT_KV_PREFETCH;  // tokens ahead whose rows are prefetched
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// group scales of one row: gather indices (chunk c, lane j) -> (16 c + j) / gs, clamped to ng - 1
struct Groups {
  int32_t mode = 0;  // 0: no group scales; 1: one group per 16-chunk (gs % 16 == 0); 2: gather
  int64_t gs = 0, ng = 0;
  std::vector<int32_t> idx;  // [chunk][16]
  void init(int32_t gran, int64_t gs_, int64_t ng_, int64_t nch) {
    gs = gs_;
    ng = ng_;
    mode = gran != G_GROUP ? 0 : (gs % 16 == 0 ? 1 : 2);
    if (mode != 2) return;
    idx.resize(size_t(16 * nch));
    for (int64_t i = 0; i < 16 * nch; ++i) idx[i] = int32_t(std::min<int64_t>(i / gs, ng - 1));
  }
  inline __m512 scale(const float* s, int64_t c) const {
    if (mode == 1) return _mm512_set1_ps(s[(16 * c) / gs]);
    return _mm512_i32gather_ps(_mm512_loadu_si512(idx.data() + 16 * c), s, 4);
  }
};

// q . row for NG query heads (q rows Dp apart, zero-padded), dots[j * TILE]
// (packed keys: tab holds the centroids, q is the rotated query)
template <int CT, int NG>
inline void dots(const float* q, int64_t Dp, int64_t D, const void* row, const float* gsc, const Groups& gr,
                 __m512 tab, float* out) {
  __m512 acc[NG];
  for (int j = 0; j < NG; ++j) acc[j] = _mm512_setzero_ps();
  const int64_t nch = Dp / 16;
  for (int64_t c = 0; c < nch; ++c) {
    __m512 k;
    if constexpr (packed<CT>()) {
      k = load_packed<CT>(row, 16 * c, D - 16 * c, tab);
    } else {
      k = load_codes<CT>(row, 16 * c, mask16(D - 16 * c));
      if (gr.mode) k = _mm512_mul_ps(k, gr.scale(gsc, c));
    }
    for (int j = 0; j < NG; ++j) acc[j] = _mm512_fmadd_ps(k, _mm512_load_ps(q + j * Dp + 16 * c), acc[j]);
  }
  for (int j = 0; j < NG; ++j) out[j * TILE] = _mm512_reduce_add_ps(acc[j]);
}

// acc[j] (rows Dp apart) += sum over the tile's n rows of w[j * TILE + t] * row t (packed values: row
// t is tab[code] * vsc[t] + vzr[t], tab holding the codes' integers)
template <int CT, int NG>
inline void accumulate(float* acc, int64_t Dp, int64_t D, const void* const* rows, const float* const* gsc,
                       const Groups& gr, __m512 tab, const float* vsc, const float* vzr, int n, const float* w) {
  const int64_t nch = Dp / 16;
  for (int64_t c = 0; c < nch; ++c) {
    const __mmask16 m = mask16(D - 16 * c);
    __m512 a[NG];
    for (int j = 0; j < NG; ++j) a[j] = _mm512_load_ps(acc + j * Dp + 16 * c);
    for (int t = 0; t < n; ++t) {
      __m512 v;
      if constexpr (packed<CT>()) {
        v = _mm512_fmadd_ps(load_packed<CT>(rows[t], 16 * c, D - 16 * c, tab), _mm512_set1_ps(vsc[t]),
                            _mm512_set1_ps(vzr[t]));
      } else {
        v = load_codes<CT>(rows[t], 16 * c, m);
        if (gr.mode) v = _mm512_mul_ps(v, gr.scale(gsc[t], c));
      }
      for (int j = 0; j < NG; ++j) a[j] = _mm512_fmadd_ps(v, _mm512_set1_ps(w[j * TILE + t]), a[j]);
    }
    for (int j = 0; j < NG; ++j) _mm512_store_ps(acc + j * Dp + 16 * c, a[j]);
  }
}

template <int CT>
inline void dots_g(int ng, const float* q, int64_t Dp, int64_t D, const void* row, const float* gsc,
                   const Groups& gr, __m512 tab, float* out) {
  switch (ng) {
    case 8: dots<CT, 8>(q, Dp, D, row, gsc, gr, tab, out); break;
    case 4: dots<CT, 4>(q, Dp, D, row, gsc, gr, tab, out); break;
    case 2: dots<CT, 2>(q, Dp, D, row, gsc, gr, tab, out); break;
    default: dots<CT, 1>(q, Dp, D, row, gsc, gr, tab, out);
  }
}

template <int CT>
inline void accumulate_g(int ng, float* acc, int64_t Dp, int64_t D, const void* const* rows,
                         const float* const* gsc, const Groups& gr, __m512 tab, const float* vsc,
                         const float* vzr, int n, const float* w) {
  switch (ng) {
    case 8: accumulate<CT, 8>(acc, Dp, D, rows, gsc, gr, tab, vsc, vzr, n, w); break;
    case 4: accumulate<CT, 4>(acc, Dp, D, rows, gsc, gr, tab, vsc, vzr, n, w); break;
    case 2: accumulate<CT, 2>(acc, Dp, D, rows, gsc, gr, tab, vsc, vzr, n, w); break;
    default: accumulate<CT, 1>(acc, Dp, D, rows, gsc, gr, tab, vsc, vzr, n, w);
  }
}

inline int block_of(int64_t r) { return r >= 8 ? 8 : r >= 4 ? 4 : r >= 2 ? 2 : 1; }

struct Args {
  const void* q;
  int32_t qdt;
  int64_t B, Hq, H, G, D, Dp, sqB, sqH;
  const uint8_t *kc, *vc;
  int32_t kct, vct;
  const float *ks, *vs;
  const uint16_t *kn, *vsc, *vzr;  // TurboQuant fp16 planes [nslots, H]: key norms, value scales, zeros
  const float *ktab, *vtab;        // 16-entry tables of packed keys (centroids) and values (integers)
  int32_t gran;
  int64_t ng, bs, nslots;
  const int32_t* bt;
  int64_t bt_stride;
  const int32_t* lens;
  int64_t max_len, window;
  float scale, softcap;
  const float* sinks;
  const uint8_t* mask;
  int64_t mask_stride;
  void* out;
  int32_t odt;
  int64_t soB, soH;
  int64_t splits;
};

// the context [lo, hi) sequence b attends (lengths past max_len cut, the window's start)
inline void context(const Args& a, int64_t b, int64_t& lo, int64_t& hi) {
  const int64_t len = a.lens[b];
  hi = std::min<int64_t>(std::max<int64_t>(len, 0), a.max_len);
  lo = a.window != 0 ? std::max<int64_t>(0, len - a.window) : 0;
  if (lo > hi) lo = hi;
}

// per-thread scratch of one work item
struct Work {
  std::vector<float> buf;
  float *q, *acc, *s, *w, *m, *l;
  void init(int64_t G, int64_t Dp) {
    const size_t n = size_t(2 * G * Dp + 2 * G * TILE + 2 * G + 32);
    buf.assign(n, 0.f);
    float* p = buf.data();
    p = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t(63));
    q = p;
    acc = q + G * Dp;
    s = acc + G * Dp;
    w = s + G * TILE;
    m = w + G * TILE;
    l = m + G;
  }
};

// one (sequence b, KV head h) over tokens [t0, t1): m, l, acc of its G heads in wk
template <int KC, int VC>
void attend(const Args& a, const Groups& gr, int64_t b, int64_t h, int64_t t0, int64_t t1, Work& wk) {
  const int64_t G = a.G, D = a.D, Dp = a.Dp, H = a.H;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t hq = h * G + g;
    float* qg = wk.q + g * Dp;
    const char* src = static_cast<const char*>(a.q);
    const int64_t off = b * a.sqB + hq * a.sqH;
    for (int64_t d = 0; d < D; ++d) qg[d] = qrt::load_act(src, off + d, a.qdt);
    for (int64_t d = D; d < Dp; ++d) qg[d] = 0.f;
    wk.m[g] = NEG_INF;
    wk.l[g] = 0.f;
  }
  std::fill(wk.acc, wk.acc + G * Dp, 0.f);
  const int64_t kbytes = row_bytes(KC, D), vbytes = row_bytes(VC, D);
  const bool dyn = a.gran == G_TOKEN || a.gran == G_GROUP;
  const float kconst = code_mul<KC>() * a.scale *
                       (a.gran == G_TENSOR ? a.ks[0] : a.gran == G_HEAD ? a.ks[h] : 1.f);
  const float vconst = code_mul<VC>() * (a.gran == G_TENSOR ? a.vs[0] : a.gran == G_HEAD ? a.vs[h] : 1.f);
  const __m512 ktab = packed<KC>() ? _mm512_loadu_ps(a.ktab) : _mm512_setzero_ps();
  const __m512 vtab = packed<VC>() ? _mm512_loadu_ps(a.vtab) : _mm512_setzero_ps();
  const int32_t* btrow = a.bt + b * a.bt_stride;
  const uint8_t* mrow = a.mask ? a.mask + b * a.mask_stride : nullptr;
  const void* krow[TILE];
  const void* vrow[TILE];
  const float* kg[TILE];
  const float* vg[TILE];
  float krs[TILE], vrs[TILE], vsc[TILE], vzr[TILE];
  bool ok[TILE];
  for (int64_t base = t0; base < t1; base += TILE) {
    const int n = int(std::min<int64_t>(TILE, t1 - base));
    for (int t = 0; t < n; ++t) {
      const int64_t tok = base + t;
      int64_t slot = int64_t(btrow[tok / a.bs]) * a.bs + tok % a.bs;
      slot = std::min<int64_t>(std::max<int64_t>(slot, 0), a.nslots - 1);  // as the torch path clamps
      const int64_t row = slot * H + h;
      krow[t] = a.kc + row * kbytes;
      vrow[t] = a.vc + row * vbytes;
      if (dyn) {
        kg[t] = a.ks + row * a.ng;
        vg[t] = a.vs + row * a.ng;
      }
      krs[t] = packed<KC>() ? qrt::f16_to_f32(a.kn[row]) : a.gran == G_TOKEN ? kg[t][0] : 1.f;
      vrs[t] = a.gran == G_TOKEN ? vg[t][0] : 1.f;
      if constexpr (packed<VC>()) {
        vsc[t] = qrt::f16_to_f32(a.vsc[row]);
        vzr[t] = qrt::f16_to_f32(a.vzr[row]);
      }
      ok[t] = mrow ? mrow[tok] != 0 : true;
      const int64_t ahead = tok + PREFETCH;  // the rows of a later tile, into L2 (scattered pages
      if (ahead < t1) {                     // defeat the hardware prefetchers)
        int64_t ps = int64_t(btrow[ahead / a.bs]) * a.bs + ahead % a.bs;
        ps = std::min<int64_t>(std::max<int64_t>(ps, 0), a.nslots - 1);
        const char* kp = reinterpret_cast<const char*>(a.kc + (ps * H + h) * kbytes);
        const char* vp = reinterpret_cast<const char*>(a.vc + (ps * H + h) * vbytes);
        for (int64_t off = 0; off < kbytes; off += 64) _mm_prefetch(kp + off, _MM_HINT_T1);
        for (int64_t off = 0; off < vbytes; off += 64) _mm_prefetch(vp + off, _MM_HINT_T1);
      }
    }
    for (int64_t g0 = 0; g0 < G;) {
      const int ngb = block_of(G - g0);
      for (int t = 0; t < n; ++t)
        dots_g<KC>(ngb, wk.q + g0 * Dp, Dp, D, krow[t], dyn ? kg[t] : nullptr, gr, ktab, wk.s + g0 * TILE + t);
      g0 += ngb;
    }
    bool any = false;
    for (int64_t g = 0; g < G; ++g) {
      float* s = wk.s + g * TILE;
      float* w = wk.w + g * TILE;
      float mt = NEG_INF;
      for (int t = 0; t < n; ++t) {
        float x = s[t] * krs[t] * kconst;
        if (a.softcap != 0.f) x = a.softcap * std::tanh(x / a.softcap);
        x = ok[t] ? x : NEG_INF;
        s[t] = x;
        mt = x > mt ? x : mt;
      }
      const float mo = wk.m[g];
      const float mn = mo > mt ? mo : mt;
      if (mn == NEG_INF) {  // nothing attended yet in this head
        for (int t = 0; t < TILE; ++t) w[t] = 0.f;
        continue;
      }
      any = true;
      const float corr = mo == NEG_INF ? 0.f : sexp(mo - mn);
      float sum = 0.f;
      for (int t0v = 0; t0v < n; t0v += 16) {
        const __mmask16 mk = mask16(n - t0v);
        const __m512 x = _mm512_mask_loadu_ps(_mm512_set1_ps(NEG_INF), mk, s + t0v);
        const __m512 p = vexp(_mm512_sub_ps(x, _mm512_set1_ps(mn)));
        sum += _mm512_reduce_add_ps(p);
        _mm512_mask_storeu_ps(w + t0v, mk, p);
      }
      for (int t = 0; t < n; ++t) w[t] *= vrs[t] * vconst;
      wk.l[g] = wk.l[g] * corr + sum;
      wk.m[g] = mn;
      if (corr != 1.f) {
        float* ag = wk.acc + g * Dp;
        const __m512 cv = _mm512_set1_ps(corr);
        for (int64_t d = 0; d < Dp; d += 16) _mm512_store_ps(ag + d, _mm512_mul_ps(_mm512_load_ps(ag + d), cv));
      }
    }
    if (!any) continue;
    for (int64_t g0 = 0; g0 < G;) {
      const int ngb = block_of(G - g0);
      accumulate_g<VC>(ngb, wk.acc + g0 * Dp, Dp, D, vrow, vg, gr, vtab, vsc, vzr, n, wk.w + g0 * TILE);
      g0 += ngb;
    }
  }
}

// out[b, h * G + g] from m, l, acc (sinks join as one more logit without a value)
void finish(const Args& a, int64_t b, int64_t h, const float* m, const float* l, const float* acc) {
  for (int64_t g = 0; g < a.G; ++g) {
    const int64_t hq = h * a.G + g;
    float mg = m[g], lg = l[g], corr = 1.f;
    if (a.sinks) {
      const float sk = a.sinks[hq];
      const float mn = mg > sk ? mg : sk;
      corr = mg == NEG_INF ? 0.f : sexp(mg - mn);
      lg = lg * corr + sexp(sk - mn);
    }
    const __m512 cv = _mm512_set1_ps(corr), dv = _mm512_set1_ps(std::max(lg, std::numeric_limits<float>::min()));
    const float* ag = acc + g * a.Dp;
    const int64_t off = b * a.soB + hq * a.soH;
    for (int64_t d = 0; d < a.D; d += 16) {
      const __mmask16 mk = mask16(a.D - d);
      const __m512 v = _mm512_div_ps(_mm512_mul_ps(_mm512_load_ps(ag + d), cv), dv);
      qrt::store16_rounded(a.out, a.odt, off + d, v, mk);
    }
  }
}

template <int KC, int VC>
int32_t run(const Args& a, int32_t nt) {
  const int64_t nch = a.Dp / 16;
  Groups gr;
  gr.init(a.gran, a.gran == G_GROUP ? a.D / a.ng : 0, a.ng, nch);
  const int64_t S = a.splits, BH = a.B * a.H, items = BH * S;
  const int64_t part = a.G * a.Dp + (2 * a.G + 15) / 16 * 16;  // acc[G][Dp], m[G], l[G] of one split (64-byte aligned)
  float* ws = nullptr;
  if (S > 1) {
    ws = static_cast<float*>(std::aligned_alloc(64, size_t((items * part * 4 + 63) / 64 * 64)));
    if (!ws) return 2;
  }
#pragma omp parallel num_threads(nt)
  {
    Work wk;
    wk.init(a.G, a.Dp);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t bh = it / S, sp = it % S, b = bh / a.H, h = bh % a.H;
      int64_t lo, hi;
      context(a, b, lo, hi);
      const int64_t len = hi - lo;
      const int64_t t0 = lo + len * sp / S, t1 = lo + len * (sp + 1) / S;
      attend<KC, VC>(a, gr, b, h, t0, t1, wk);
      if (S == 1) {
        finish(a, b, h, wk.m, wk.l, wk.acc);
      } else {
        float* p = ws + it * part;
        std::memcpy(p, wk.acc, a.G * a.Dp * 4);
        std::memcpy(p + a.G * a.Dp, wk.m, a.G * 4);
        std::memcpy(p + a.G * a.Dp + a.G, wk.l, a.G * 4);
      }
    }
    if (S > 1) {
#pragma omp for schedule(static)
      for (int64_t bh = 0; bh < BH; ++bh) {
        std::fill(wk.acc, wk.acc + a.G * a.Dp, 0.f);
        for (int64_t g = 0; g < a.G; ++g) {
          float mx = NEG_INF;
          for (int64_t sp = 0; sp < S; ++sp) mx = std::max(mx, ws[(bh * S + sp) * part + a.G * a.Dp + g]);
          wk.m[g] = mx;
          wk.l[g] = 0.f;
          if (mx == NEG_INF) continue;
          float* ag = wk.acc + g * a.Dp;
          for (int64_t sp = 0; sp < S; ++sp) {
            const float* p = ws + (bh * S + sp) * part;
            const float* pm = p + a.G * a.Dp;
            if (pm[g] == NEG_INF) continue;
            const float c = sexp(pm[g] - mx);
            wk.l[g] += pm[a.G + g] * c;
            const float* pa = p + g * a.Dp;
            const __m512 cv = _mm512_set1_ps(c);
            for (int64_t d = 0; d < a.Dp; d += 16)
              _mm512_store_ps(ag + d, _mm512_fmadd_ps(_mm512_load_ps(pa + d), cv, _mm512_load_ps(ag + d)));
          }
        }
        finish(a, bh / a.H, bh % a.H, wk.m, wk.l, wk.acc);
      }
    }
  }
  std::free(ws);
  return 0;
}

#endif  // AVX-512

}  // namespace

// Walks the rows of x [N, H, D] (fp32/bf16/fp16, strides sN, sH in elements) whose slot is kept
// (>= 0): each read into a per-thread fp32 buffer and handed to f(slot, h, row, scratch) (scratch: D
// int32 per thread), on nt threads when the write is large enough to pay for them.
template <class F>
void each_kept_row(const void* x, int32_t xdt, int64_t N, int64_t H, int64_t D, int64_t sN, int64_t sH,
                   const int64_t* slots, int32_t nt, F&& f) {
  const int64_t rows = N * H;
  const bool big = rows * D >= (int64_t(1) << 15);
#pragma omp parallel num_threads(nt) if (big && nt > 1)
  {
    std::vector<float> buf(static_cast<size_t>(D));
    std::vector<int32_t> scratch(static_cast<size_t>(D));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = r / H, h = r % H;
      if (slots[n] < 0) continue;
      qrt::row_to_f32(static_cast<const char*>(x) + (n * sN + h * sH) * (xdt == F32 ? 4 : 2), D, xdt,
                      buf.data());
      f(slots[n], h, buf.data(), scratch.data());
    }
  }
}

extern "C" {

// 1 when the library was built with the instructions the kernels need (AVX-512 F/BW/VL)
int32_t quantrt_kv_isa() {
#ifdef QRT_KV_DECODE
  return 1;
#else
  return 0;
#endif
}

// Quantize keys or values x [N, H, D] (dtype xdt, strides sN, sH in elements, unit stride in D)
// into the code plane `codes` [slots, H, D] (code type ct) at slots[n] (negative: skipped; every
// other < nslots, checked by the caller); gran: G_NONE stores x rounded to the cache dtype, G_TENSOR
// / G_HEAD divide by sscale[0] / sscale[h], G_TOKEN / G_GROUP compute ng scales per row into the
// plane `scales` [slots, H, ng]. 0 on success.
int32_t quantrt_kv_write(const void* x, int32_t xdt, int64_t N, int64_t H, int64_t D, int64_t sN, int64_t sH,
                         const int64_t* slots, void* codes, int32_t ct, int32_t gran, int64_t ng,
                         const float* sscale, float* scales, float qmax, int32_t nt) {
  const int64_t esz = code_size(ct);
  const int64_t gsz = gran == G_GROUP ? D / ng : D;
  const int64_t ngr = gran == G_GROUP ? ng : 1;
  each_kept_row(x, xdt, N, H, D, sN, sH, slots, nt, [&](int64_t slot, int64_t h, const float* row, int32_t*) {
    char* dst = static_cast<char*>(codes) + (slot * H + h) * D * esz;
    if (gran == G_NONE) {
      for (int64_t i = 0; i < D; ++i) qrt::store_out(dst, i, row[i], ct);
      return;
    }
    for (int64_t gi = 0; gi < ngr; ++gi) {
      const float* xg = row + gi * gsz;
      float s;
      if (gran == G_TENSOR) s = sscale[0];
      else if (gran == G_HEAD) s = sscale[h];
      else {
        s = dynamic_scale(xg, gsz, qmax);
        scales[(slot * H + h) * ngr + gi] = s;
      }
      quantize_group(xg, gsz, s, ct, qmax, dst + gi * gsz);
    }
  });
  return 0;
}

// TurboQuant rotated keys: y [N, H, D] fp32 (the unit keys times the rotation, computed by the caller
// exactly as the reference) coded per element to the number of bounds b (nb of them, ascending) with
// !(b > y), which is torch.searchsorted(bounds, y, right=True) (a NaN counts every bound), packed at
// `bits` (3 or 4) into codes [slots, H, D * bits / 8] at slots[n] (negative: skipped); cvals (or null)
// [N, H, D] receives centroids[code], the caller's norm correction. 0 on success, 1 without AVX-512.
int32_t quantrt_kv_tq_keys(const float* y, int64_t N, int64_t H, int64_t D, const int64_t* slots, uint8_t* codes,
                           int32_t bits, const float* bounds, int32_t nb, const float* centroids, float* cvals,
                           int32_t nt) {
#ifndef QRT_KV_DECODE
  return 1;
#else
  const int64_t rows = N * H, rb = D * bits / 8;
  const bool big = rows * D >= (int64_t(1) << 15);
#pragma omp parallel num_threads(nt) if (big && nt > 1)
  {
    std::vector<int32_t> idx(static_cast<size_t>(D));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = r / H, h = r % H;
      if (slots[n] < 0) continue;
      const float* yr = y + r * D;
      for (int64_t d = 0; d < D; d += 16) {
        const __mmask16 m = mask16(D - d);
        const __m512 yv = _mm512_maskz_loadu_ps(m, yr + d);
        __m512i c = _mm512_setzero_si512();
        for (int32_t j = 0; j < nb; ++j) {
          const __mmask16 gt = _mm512_cmp_ps_mask(_mm512_set1_ps(bounds[j]), yv, _CMP_GT_OQ);
          c = _mm512_mask_add_epi32(c, _knot_mask16(gt), c, _mm512_set1_epi32(1));
        }
        _mm512_mask_storeu_epi32(idx.data() + d, m, c);
      }
      if (cvals)
        for (int64_t d = 0; d < D; ++d) cvals[r * D + d] = centroids[idx[d]];
      pack_codes(idx.data(), D, bits, codes + (slots[n] * H + h) * rb);
    }
  }
  return 0;
#endif
}

// TurboQuant values x [N, H, D] (dtype xdt, strides sN, sH, unit stride in D) at slots[n] (negative:
// skipped), as runtime/reference/turboquant.py: lo / hi the row's min / max (NaN if any is NaN),
// scale = fp16(clamp((hi - lo) / top)) and zero = fp16(clamp(lo)) (saturating at +-65504) into
// vscale / vzero [slots, H], codes clamp(floor((x - zero) / scale + 0.5), 0, top) (0 where the scale is
// not > 0) packed at `bits` into codes [slots, H, D * bits / 8]. Same IEEE operations in the same
// order, so the same bytes. 0 on success.
int32_t quantrt_kv_tq_values(const void* x, int32_t xdt, int64_t N, int64_t H, int64_t D, int64_t sN, int64_t sH,
                             const int64_t* slots, uint8_t* codes, uint16_t* vscale, uint16_t* vzero, int32_t bits,
                             int32_t nt) {
  const int64_t rb = D * bits / 8;
  const float top = float((1 << bits) - 1);
  each_kept_row(x, xdt, N, H, D, sN, sH, slots, nt, [&](int64_t slot, int64_t h, const float* row, int32_t* q) {
    float lo = row[0], hi = row[0];
    bool nan = false;
    for (int64_t i = 0; i < D; ++i) {
      const float v = row[i];
      nan |= v != v;
      lo = v < lo ? v : lo;
      hi = v > hi ? v : hi;
    }
    if (nan) lo = hi = std::numeric_limits<float>::quiet_NaN();
    const uint16_t s16 = qrt::f32_to_f16(clampf((hi - lo) / top, FP16_MAX));
    const uint16_t z16 = qrt::f32_to_f16(clampf(lo, FP16_MAX));
    const float s = qrt::f16_to_f32(s16), z = qrt::f16_to_f32(z16);
    const float div = s > 0.f ? s : 1.f;
    for (int64_t i = 0; i < D; ++i) {
      float c = s > 0.f ? std::floor((row[i] - z) / div + 0.5f) : 0.f;
      c = c < 0.f ? 0.f : (c > top ? top : c);
      q[i] = c == c ? static_cast<int32_t>(c) : 0;
    }
    vscale[slot * H + h] = s16;
    vzero[slot * H + h] = z16;
    pack_codes(q, D, bits, codes + (slot * H + h) * rb);
  });
  return 0;
}

// Decode attention, one query per sequence: q [B, Hq, D] (dtype qdt, strides sqB, sqH) over the
// planes kc / vc [nslots, H, row] (code types kct / vct) with scales ks / vs (static [1] / [H], or
// dynamic planes [nslots, H, ng]) through block_table [B, bt_stride] (block size bs), lengths lens [B]
// (read up to max_len), window (0: none), softcap (0: none), sinks [Hq] fp32 (or null), mask
// [B, >= max_len] bytes with row stride mask_stride (or null); out [B, Hq, D] (dtype odt, strides
// soB, soH). splits: context splits per (sequence, KV head). TurboQuant: packed keys (kct C_U4 / C_U3)
// are scored against ktab (the centroids, twice over for 3 bits) with the key norms kn [nslots, H]
// fp16, q being the rotated query; packed values (vct C_U4 / C_U3) read vtab (the codes' integers) *
// vsc + vzr (fp16 [nslots, H]); fp8 (k8) keys are e4m3 with gran 0. 0 on success, 2 out of memory,
// 3 an unknown pair of code types.
int32_t quantrt_kv_decode(const void* q, int32_t qdt, int64_t B, int64_t Hq, int64_t D, int64_t sqB, int64_t sqH,
                          const void* kc, const void* vc, int32_t kct, int32_t vct, const float* ks, const float* vs,
                          int32_t gran, int64_t ng, const uint16_t* kn, const uint16_t* vsc, const uint16_t* vzr,
                          const float* ktab, const float* vtab, int64_t H, int64_t bs, int64_t nslots,
                          const int32_t* bt, int64_t bt_stride, const int32_t* lens, int64_t max_len,
                          int64_t window, float scale, float softcap, const float* sinks, const uint8_t* mask,
                          int64_t mask_stride, void* out, int32_t odt, int64_t soB, int64_t soH, int64_t splits,
                          int32_t nt) {
#ifndef QRT_KV_DECODE
  return 1;
#else
  Args a{};
  a.q = q;
  a.qdt = qdt;
  a.B = B;
  a.Hq = Hq;
  a.H = H;
  a.G = Hq / H;
  a.D = D;
  a.Dp = (D + 15) / 16 * 16;
  a.sqB = sqB;
  a.sqH = sqH;
  a.kc = static_cast<const uint8_t*>(kc);
  a.vc = static_cast<const uint8_t*>(vc);
  a.kct = kct;
  a.vct = vct;
  a.ks = ks;
  a.vs = vs;
  a.kn = kn;
  a.vsc = vsc;
  a.vzr = vzr;
  a.ktab = ktab;
  a.vtab = vtab;
  a.gran = gran;
  a.ng = ng;
  a.bs = bs;
  a.nslots = nslots;
  a.bt = bt;
  a.bt_stride = bt_stride;
  a.lens = lens;
  a.max_len = max_len;
  a.window = window;
  a.scale = scale;
  a.softcap = softcap;
  a.sinks = sinks;
  a.mask = mask;
  a.mask_stride = mask_stride;
  a.out = out;
  a.odt = odt;
  a.soB = soB;
  a.soH = soH;
  a.splits = std::max<int64_t>(splits, 1);
  if (vct == C_U4 || vct == C_U3) {
    const bool v4 = vct == C_U4;
    switch (kct) {
      case C_E4M3: return v4 ? run<C_E4M3, C_U4>(a, nt) : run<C_E4M3, C_U3>(a, nt);
      case C_U4: return v4 ? run<C_U4, C_U4>(a, nt) : run<C_U4, C_U3>(a, nt);
      case C_U3: return v4 ? run<C_U3, C_U4>(a, nt) : run<C_U3, C_U3>(a, nt);
      default: return 3;
    }
  }
  if (kct != vct) return 3;
  switch (kct) {
    case C_F32: return run<C_F32, C_F32>(a, nt);
    case C_BF16: return run<C_BF16, C_BF16>(a, nt);
    case C_F16: return run<C_F16, C_F16>(a, nt);
    case C_I8: return run<C_I8, C_I8>(a, nt);
    case C_E4M3: return run<C_E4M3, C_E4M3>(a, nt);
    case C_E5M2: return run<C_E5M2, C_E5M2>(a, nt);
    default: return 3;
  }
#endif
}

}  // extern "C"
