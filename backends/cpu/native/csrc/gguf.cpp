// GGUF linear layers on x86 CPUs: y = x @ W^T + bias with W in one of llama.cpp's block types (Q4_0,
// Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), computed the way llama.cpp computes it: every
// activation row is first quantized to 8-bit blocks, then each weight block meets them in integer dot
// products that are scaled per block in fp32.
//
// Activation blocks (the workspace, see XLayout):
//   legacy types  Q8_0-style blocks of 32: d = max|x| / 127, q = round_half_even(x * (1/d)), fp32 d
//   K-quants      Q8_K-style blocks of 256: max = the first element of largest |x|, iscale = -127 / max,
//                 q = min(127, round_half_even(iscale * x)), d = 1 / iscale (llama.cpp's
//                 quantize_row_q8_K_ref), fp32 d
//   both also keep the integer sum of every 16 and every 32 codes (llama.cpp's bsums): they turn a
//   weight code offset (Q4_0's -8) or a sub-block min (Q4_K's dmin * m) into one product per block.
//   A block holding a NaN or Inf gets a NaN scale (llama.cpp would make codes of it): its row's
//   outputs are then NaN, and a row with Inf but no NaN gets the signed infinities (or NaN) the fp32
//   reference gives it, from its infinite terms (inf_row). The check is one compare per 16 inputs.
//
// Weight layout (prepared once by backends/cpu/gguf_native.py): rows [0, 16*G) form G groups of 16
// rows. Every field of a group block is transposed so that the 16 rows' values sit side by side:
//   code bytes                    64-byte "planes": plane w holds word w (bytes 4w..4w+3 of the
//                                 canonical field) of rows 0..15, row r in 32-bit lane r
//   f16 fields (d, m, dmin)       16 consecutive f16, row r at index r
//   byte fields (sub-block scales) [byte][row]: byte t of the 16 rows is 16 consecutive bytes
// A plane thus holds 4 consecutive K elements (or a bit field of them) of each of 16 rows, one row per
// 32-bit lane: one VPDPBUSD against those 4 activation bytes, broadcast, gives 16 rows' partial sums
// with no horizontal reduction. The buffer holds, in order: the planes of every group (group after
// group, block after block: one dense stream, every plane 64-byte aligned), the fields of every group
// (same order: a second, small stream), then rows [16*G, N) in llama.cpp's canonical blocks, which run
// the scalar code, as every row does when this library was built without AVX-512 VNNI (then G = 0).
// The 6-bit packed scales of Q3_K, Q4_K and Q5_K are unpacked to one byte each (4 more bytes per row
// and super-block: at most 1.036x the canonical size).
#include "avx2.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define QRT_GGUF_SIMD 1
#else
#define QRT_GGUF_SIMD 0
#endif
#if !QRT_GGUF_SIMD && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QRT_GGUF_AVX2 1
#else
#define QRT_GGUF_AVX2 0
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#define QRT_GGUF_NEON 1
#else
#define QRT_GGUF_NEON 0
#endif
#if QRT_GGUF_NEON && defined(__ARM_FEATURE_MATMUL_INT8)
#define QRT_GGUF_I8MM 1
#else
#define QRT_GGUF_I8MM 0
#endif
#if QRT_GGUF_NEON && defined(__ARM_FEATURE_SVE)
#define QRT_GGUF_SVE 1
#include <arm_sve.h>
#else
#define QRT_GGUF_SVE 0
#endif

namespace {

enum GType : int32_t { Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, NTYPES };

// f(std::integral_constant<int, T>{}) for type t: the one dispatch of the per-type row kernels
template <class F>
inline void with_type(int32_t t, F&& f) {
  switch (t) {
    case Q4_0: return f(std::integral_constant<int, Q4_0>{});
    case Q4_1: return f(std::integral_constant<int, Q4_1>{});
    case Q5_0: return f(std::integral_constant<int, Q5_0>{});
    case Q5_1: return f(std::integral_constant<int, Q5_1>{});
    case Q8_0: return f(std::integral_constant<int, Q8_0>{});
    case Q2_K: return f(std::integral_constant<int, Q2_K>{});
    case Q3_K: return f(std::integral_constant<int, Q3_K>{});
    case Q4_K: return f(std::integral_constant<int, Q4_K>{});
    case Q5_K: return f(std::integral_constant<int, Q5_K>{});
    default: return f(std::integral_constant<int, Q6_K>{});
  }
}

// elements per block, canonical bytes per block; per row and block in a 16-row group: code (plane)
// bytes and field bytes (more than T - P where 6-bit scales are unpacked)
struct TypeInfo {
  int32_t B, T, P, F;
};
constexpr TypeInfo kInfo[NTYPES] = {
    {32, 18, 16, 2},     {32, 20, 16, 4},     {32, 22, 20, 2},     {32, 24, 20, 4},    {32, 34, 32, 2},
    {256, 84, 64, 20},   {256, 110, 96, 18},  {256, 144, 128, 20}, {256, 176, 160, 20}, {256, 210, 192, 18},
};
constexpr int64_t kGroup = 16;

inline bool is_k(int32_t t) { return t >= Q2_K; }
inline int64_t align64(int64_t n) { return (n + 63) & ~int64_t(63); }

// one block of row r of a 16-row group into llama.cpp's canonical bytes (defined below)
void gather_block(int32_t t, const uint8_t* p, const uint8_t* f, int64_t r, uint8_t* blk, uint8_t* us);

// Where a prepared weight's parts lie: per 16-row group its code planes (pbytes) then its fields
// (fbytes), the groups' fields after all groups' planes, then the rows past the last whole group in
// llama.cpp's own blocks (rbytes each). One description for the GEMM, the exact dequantization and
// the infinite-input rows.
struct Layout {
  TypeInfo ti;
  int64_t nb, pbytes, fbytes, rbytes, ngroups;
  const uint8_t* w;
  const uint8_t* fields;
  const uint8_t* tail;
  bool unpacked;
  Layout(int32_t t, const uint8_t* w_, int64_t K, int64_t ngroups_)
      : ti(kInfo[t]), nb(K / kInfo[t].B), pbytes(nb * kGroup * ti.P), fbytes(nb * kGroup * ti.F),
        rbytes(nb * ti.T), ngroups(ngroups_), w(w_), fields(w_ + ngroups_ * pbytes),
        tail(fields + ngroups_ * fbytes), unpacked(t == Q3_K || t == Q4_K || t == Q5_K) {}
  // block b of row n in canonical bytes: gathered into blk (scales unpacked into us, returned in
  // *scl) for a grouped row, or pointed at in place for a tail row
  const uint8_t* block(int32_t t, int64_t n, int64_t b, uint8_t* blk, uint8_t* us, const uint8_t** scl) const {
    const int64_t g = n / kGroup;
    *scl = nullptr;
    if (g >= ngroups) return tail + (n - ngroups * kGroup) * rbytes + b * ti.T;
    gather_block(t, w + g * pbytes + b * kGroup * ti.P, fields + g * fbytes + b * kGroup * ti.F, n % kGroup, blk, us);
    if (unpacked) *scl = us;
    return blk;
  }
};

inline float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return qrt::f16_to_f32(h);
}
inline uint32_t u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// ---- activation workspace ------------------------------------------------------------------------

// One quantized activation row: K codes, a scale per activation block, sums of every 16 and 32 codes.
struct XRow {
  const int8_t* q;
  const float* d;
  const int32_t* s16;
  const int32_t* s32;
};

// Byte offsets inside one row's workspace (each part 64-byte aligned), and the row's size.
struct XLayout {
  int64_t d, s16, s32, row;
};

inline XLayout x_layout(int32_t t, int64_t K) {
  const int64_t ab = is_k(t) ? 256 : 32;
  XLayout l;
  l.d = align64(K);
  l.s16 = l.d + align64(4 * (K / ab));
  l.s32 = l.s16 + align64(4 * (K / 16));
  l.row = l.s32 + align64(4 * (K / 32));
  return l;
}

inline XRow x_row(uint8_t* ws, const XLayout& l, int64_t m) {
  uint8_t* r = ws + m * l.row;
  return {reinterpret_cast<const int8_t*>(r), reinterpret_cast<const float*>(r + l.d),
          reinterpret_cast<const int32_t*>(r + l.s16), reinterpret_cast<const int32_t*>(r + l.s32)};
}

// n activations starting at element k0 of one row (element stride sk) as fp32
inline void load_block(const void* row, int64_t sk, int32_t dt, int64_t k0, int n, float* buf) {
  if (sk == 1 && dt == qrt::F32) {
    std::memcpy(buf, static_cast<const float*>(row) + k0, sizeof(float) * n);
    return;
  }
#if QRT_GGUF_SIMD
  if (sk == 1) {
    const uint16_t* h = static_cast<const uint16_t*>(row) + k0;
    for (int i = 0; i < n; i += 16) {
      __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i));
      __m512 f = dt == qrt::F16 ? _mm512_cvtph_ps(v)
                                : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
      _mm512_storeu_ps(buf + i, f);
    }
    return;
  }
#elif QRT_GGUF_AVX2
  if (sk == 1) {
    const uint16_t* h = static_cast<const uint16_t*>(row) + k0;
    for (int i = 0; i < n; i += 8) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i));
      _mm256_storeu_ps(buf + i, dt == qrt::F16 ? _mm256_cvtph_ps(v)
                                               : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16)));
    }
    return;
  }
#endif
  for (int i = 0; i < n; ++i) buf[i] = qrt::load_act(row, (k0 + i) * sk, dt);
}

// llama.cpp's nearest_int: round half to even (the default rounding mode); finite codes lie in
// [-127, 127], and the clamp keeps NaN/Inf inputs from undefined float-to-int conversions
inline int32_t rne(float v) {
  return static_cast<int32_t>(std::nearbyint(std::fmax(std::fmin(v, 127.f), -128.f)));
}

// codes (x * mul rounded, at most 127) and the sum of every 16 codes of one block
inline void store_codes(const float* x, int n, float mul, int8_t* q, int32_t* s16) {
#if QRT_GGUF_SIMD
  const __m512 vm = _mm512_set1_ps(mul);
  const __m512i top = _mm512_set1_epi32(127);
  for (int i = 0; i < n; i += 16) {
    __m512i c = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), vm)), top);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(c));
    s16[i / 16] = _mm512_reduce_add_epi32(c);
  }
#elif QRT_GGUF_AVX2
  // cvtps rounds half to even (the default rounding mode), as rne does; NaN/Inf never reach here
  const __m256 vm = _mm256_set1_ps(mul);
  const __m256i top = _mm256_set1_epi32(127);
  for (int i = 0; i < n; i += 16) {
    const __m256i a = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vm)), top);
    const __m256i b = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), vm)), top);
    const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);  // 16 int16 in order
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i),
                     _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
    __m256i t = _mm256_add_epi32(a, b);
    __m128i u = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0x4E));
    u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0xB1));
    s16[i / 16] = _mm_cvtsi128_si32(u);
  }
#else
  for (int i = 0; i < n; i += 16) {
    int32_t s = 0;
    for (int j = i; j < i + 16; ++j) {
      int32_t c = std::min(rne(x[j] * mul), 127);
      q[j] = static_cast<int8_t>(c);
      s += c;
    }
    s16[i / 16] = s;
  }
#endif
}

// max |x| over the block, and whether every element is finite (a NaN is lost by the max, so the
// flag is kept beside it: one compare per 16 elements)
inline float abs_max(const float* x, int n, bool& finite) {
#if QRT_GGUF_SIMD
  const __m512 inf = _mm512_set1_ps(INFINITY);
  __m512 a = _mm512_setzero_ps();
  __mmask16 bad = 0;
  for (int i = 0; i < n; i += 16) {
    const __m512 v = _mm512_abs_ps(_mm512_loadu_ps(x + i));
    a = _mm512_max_ps(a, v);
    bad |= _mm512_cmp_ps_mask(v, inf, _CMP_NLT_UQ);
  }
  finite = bad == 0;
  return _mm512_reduce_max_ps(a);
#elif QRT_GGUF_AVX2
  const __m256 sign = _mm256_set1_ps(-0.f), inf = _mm256_set1_ps(INFINITY);
  __m256 a = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 8) {
    const __m256 v = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i));
    a = _mm256_max_ps(a, v);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, inf, _CMP_NLT_UQ));
  }
  finite = _mm256_movemask_ps(bad) == 0;
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
#else
  float a = 0.f;
  finite = true;
  for (int i = 0; i < n; ++i) {
    const float v = std::fabs(x[i]);
    if (!(v < INFINITY)) finite = false;
    a = std::max(a, v);
  }
  return a;
#endif
}

// A block holding a NaN or an Inf: scale NaN, codes and sums 0, so that every output of its row is
// NaN, as the reference's fp32 sum is for a NaN input; rows with Inf but no NaN are then given the
// reference's signed infinities by inf_row (after the dot products).
inline void poison_block(int n, int8_t* q, float* d, int32_t* s16) {
  *d = std::numeric_limits<float>::quiet_NaN();
  std::memset(q, 0, size_t(n));
  std::memset(s16, 0, sizeof(int32_t) * size_t(n / 16));
}

// the first index whose |x| equals amax (0 when none does: NaN inputs)
inline int first_abs(const float* x, int n, float amax) {
#if QRT_GGUF_SIMD
  const __m512 a = _mm512_set1_ps(amax);
  for (int i = 0; i < n; i += 16) {
    const __mmask16 k = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + i)), a, _CMP_EQ_OQ);
    if (k) return i + __builtin_ctz(k);
  }
#elif QRT_GGUF_AVX2
  const __m256 sign = _mm256_set1_ps(-0.f), a = _mm256_set1_ps(amax);
  for (int i = 0; i < n; i += 8) {
    const int k = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), a, _CMP_EQ_OQ));
    if (k) return i + __builtin_ctz(k);
  }
#else
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) == amax) return i;
#endif
  return 0;
}

// Q8_0-style: d = max|x| / 127, q = round(x * (1/d))
inline void quant_block32(const float* x, int8_t* q, float* d, int32_t* s16) {
  bool finite;
  const float dd = abs_max(x, 32, finite) / 127.f;
  if (!finite) return poison_block(32, q, d, s16);
  *d = dd;
  store_codes(x, 32, dd != 0.f ? 1.f / dd : 0.f, q, s16);
}

// Q8_K-style (quantize_row_q8_K_ref): the scale is set by the first element of largest magnitude
inline void quant_block256(const float* x, int8_t* q, float* d, int32_t* s16) {
  bool finite;
  const float amax = abs_max(x, 256, finite);
  if (!finite) return poison_block(256, q, d, s16);
  if (amax == 0.f) {
    *d = 0.f;
    std::memset(q, 0, 256);
    std::memset(s16, 0, 16 * sizeof(int32_t));
    return;
  }
  const float iscale = -127.f / x[first_abs(x, 256, amax)];
  *d = 1.f / iscale;
  store_codes(x, 256, iscale, q, s16);
}

// quantizes activation block i of row m (ab = 32 or 256 elements)
inline void quantize_x_block(const void* x, int64_t sxm, int64_t sk, int32_t dt, int32_t t, uint8_t* ws,
                             const XLayout& l, int64_t m, int64_t i) {
  const int ab = is_k(t) ? 256 : 32;
  const int64_t esz = dt == qrt::F32 ? 4 : 2;
  const void* row = static_cast<const uint8_t*>(x) + m * sxm * esz;
  alignas(64) float buf[256];
  load_block(row, sk, dt, i * ab, ab, buf);
  uint8_t* r = ws + m * l.row;
  int8_t* q = reinterpret_cast<int8_t*>(r) + i * ab;
  float* d = reinterpret_cast<float*>(r + l.d) + i;
  int32_t* s16 = reinterpret_cast<int32_t*>(r + l.s16) + i * (ab / 16);
  if (ab == 32)
    quant_block32(buf, q, d, s16);
  else
    quant_block256(buf, q, d, s16);
  int32_t* s32 = reinterpret_cast<int32_t*>(r + l.s32) + i * (ab / 32);
  for (int j = 0; j < ab / 32; ++j) s32[j] = s16[2 * j] + s16[2 * j + 1];
}

// ---- scalar path: canonical blocks, one row at a time -----------------------------------------------

// A legacy block decoded: 32 signed codes (offset applied), w = d * q + m.
struct Legacy {
  int32_t q[32];
  float d, m;
};

// Canonical legacy blocks (llama.cpp's block_q4_0 ... block_q8_0):
//   Q4_0 {f16 d; u8 qs[16]}                 q = nibble - 8, element j in qs[j] low, j + 16 high
//   Q4_1 {f16 d, m; u8 qs[16]}              q = nibble, w = d * q + m
//   Q5_0 {f16 d; u32 qh; u8 qs[16]}         q = (nibble | bit j of qh << 4) - 16
//   Q5_1 {f16 d, m; u32 qh; u8 qs[16]}      q = nibble | bit j of qh << 4, w = d * q + m
//   Q8_0 {f16 d; i8 qs[32]}
inline void decode_legacy(int32_t t, const uint8_t* b, Legacy& o) {
  o.d = f16(b);
  o.m = 0.f;
  if (t == Q8_0) {
    for (int j = 0; j < 32; ++j) o.q[j] = static_cast<int8_t>(b[2 + j]);
    return;
  }
  const bool asym = t == Q4_1 || t == Q5_1;
  if (asym) o.m = f16(b + 2);
  const bool five = t == Q5_0 || t == Q5_1;
  const int off = (asym ? 4 : 2) + (five ? 4 : 0);
  const uint32_t qh = five ? u32(b + (asym ? 4 : 2)) : 0;
  const int32_t zero = asym ? 0 : (five ? 16 : 8);
  for (int j = 0; j < 16; ++j) {
    o.q[j] = int32_t(b[off + j] & 15) + int32_t(((qh >> j) & 1) << 4) - zero;
    o.q[j + 16] = int32_t(b[off + j] >> 4) + int32_t(((qh >> (j + 16)) & 1) << 4) - zero;
  }
}

// A K-quant super-block decoded: 256 codes (signed where the type has an offset), a scale and a min
// per sub-block (16 sub-blocks of 16, or 8 of 32), w = d * sc * q - dmin * mn.
struct KQuant {
  int32_t q[256];
  int32_t sc[16], mn[16];
  int32_t nsub;
  float d, dmin;
};

// Q4_K/Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins (llama.cpp's get_scale_min_k4)
inline void k4_scales(const uint8_t* s, int32_t* sc, int32_t* mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    mn[j] = s[j + 4] & 63;
    sc[j + 4] = (s[j + 8] & 15) | ((s[j] >> 6) << 4);
    mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
  }
}

// Q3_K: 12 bytes -> 16 six-bit scales minus 32
inline void k3_scales(const uint8_t* s, int32_t* sc) {
  for (int i = 0; i < 16; ++i) {
    const int32_t low = i < 8 ? (s[i] & 15) : (s[i - 8] >> 4);
    const int32_t high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    sc[i] = (low | (high << 4)) - 32;
  }
}

// Canonical K-quant super-blocks (llama.cpp's block_q2_K ... block_q6_K), element e = 128n + 32s + l:
//   Q2_K {u8 scales[16] (sc | mn << 4); u8 qs[64]; f16 d, dmin}
//        q = qs[32n + l] >> 2s & 3
//   Q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}
//        q = (qs[32n + l] >> 2s & 3) - 4 * !(hmask[l] >> (4n + s) & 1)
//   Q4_K {f16 d, dmin; u8 scales[12]; u8 qs[128]}
//        element 64j + 32f + l: q = qs[32j + l] >> 4f & 15
//   Q5_K {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}
//        as Q4_K, plus bit (2j + f) of qh[l] as bit 4
//   Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}
//        low 4 bits of element 128n + 64f + i: ql[64n + i] >> 4f & 15,
//        high 2 bits of element 128n + 32s + l: qh[32n + l] >> 2s & 3; minus 32
inline void decode_k(int32_t t, const uint8_t* b, KQuant& o) {
  o.dmin = 0.f;
  o.nsub = 16;
  for (int i = 0; i < 16; ++i) o.mn[i] = 0;
  switch (t) {
    case Q2_K:
      o.d = f16(b + 80);
      o.dmin = f16(b + 82);
      for (int i = 0; i < 16; ++i) {
        o.sc[i] = b[i] & 15;
        o.mn[i] = b[i] >> 4;
      }
      for (int e = 0; e < 256; ++e) o.q[e] = (b[16 + 32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3;
      break;
    case Q3_K:
      o.d = f16(b + 108);
      k3_scales(b + 96, o.sc);
      for (int e = 0; e < 256; ++e) {
        const int n = e / 128, s = e % 128 / 32, l = e % 32;
        const int32_t low = (b[32 + 32 * n + l] >> (2 * s)) & 3;
        o.q[e] = low - (((b[l] >> (4 * n + s)) & 1) ? 0 : 4);
      }
      break;
    case Q4_K:
    case Q5_K: {
      o.d = f16(b);
      o.dmin = f16(b + 2);
      o.nsub = 8;
      k4_scales(b + 4, o.sc, o.mn);
      const bool five = t == Q5_K;
      const uint8_t* qs = b + (five ? 48 : 16);
      for (int e = 0; e < 256; ++e) {
        const int j = e / 64, f = e % 64 / 32, l = e % 32;
        int32_t q = (qs[32 * j + l] >> (4 * f)) & 15;
        if (five) q |= ((b[16 + l] >> (2 * j + f)) & 1) << 4;
        o.q[e] = q;
      }
      break;
    }
    default: {  // Q6_K
      o.d = f16(b + 208);
      for (int i = 0; i < 16; ++i) o.sc[i] = static_cast<int8_t>(b[192 + i]);
      for (int e = 0; e < 256; ++e) {
        const int n = e / 128, f = e % 128 / 64, i = e % 64, s = e % 128 / 32, l = e % 32;
        const int32_t low = (b[64 * n + i] >> (4 * f)) & 15;
        const int32_t high = (b[128 + 32 * n + l] >> (2 * s)) & 3;
        o.q[e] = (low | (high << 4)) - 32;
      }
    }
  }
}

// One canonical row (nb blocks) against one quantized activation row.
float row_dot_scalar(int32_t t, const uint8_t* row, int64_t nb, const XRow& x) {
  const int B = kInfo[t].B, T = kInfo[t].T;
  float acc = 0.f;
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* b = row + i * T;
    const int8_t* xq = x.q + i * B;
    if (!is_k(t)) {
      Legacy o;
      decode_legacy(t, b, o);
      int32_t s = 0;
      for (int j = 0; j < 32; ++j) s += o.q[j] * xq[j];
      acc += o.d * x.d[i] * float(s) + o.m * x.d[i] * float(x.s32[i]);
      continue;
    }
    KQuant o;
    decode_k(t, b, o);
    const int len = 256 / o.nsub;
    int32_t sumi = 0, summ = 0;
    for (int u = 0; u < o.nsub; ++u) {
      int32_t s = 0;
      for (int j = u * len; j < (u + 1) * len; ++j) s += o.q[j] * xq[j];
      sumi += o.sc[u] * s;
      summ += o.mn[u] * (len == 16 ? x.s16[i * 16 + u] : x.s32[i * 8 + u]);
    }
    acc += o.d * x.d[i] * float(sumi) - o.dmin * x.d[i] * float(summ);
  }
  return acc;
}

// ---- NEON path (aarch64): canonical rows, 16 codes per 128-bit vector ----------------------------
// Every type's block is decoded 32 codes at a time into two int8x16 vectors of signed codes (the
// type's offset applied), once for up to 4 activation rows, and met by each row's activation codes
// in signed 4-byte dot products: SDOT where the CPU has the dot-product extension
// (__ARM_FEATURE_DOTPROD), else widening multiplies and pairwise accumulation. With the int8 matrix
// multiply extension (__ARM_FEATURE_MATMUL_INT8) two weight rows are decoded together and each pair
// of activation rows meets them in SMMLA (one instruction: 2 activation rows x 2 weight rows x 8
// codes); an odd activation row takes SDOT. Sub-block sums are scaled in int32 vectors and reduced
// once per block, so each block's sum is the exact integer of the scalar path, and every path adds
// it to the row's accumulator by the same fp32 expression (neon_legacy_term, neon_k_term): the
// builds agree bit for bit.
#if QRT_GGUF_NEON
// the helpers must inline: the type and chunk index they switch on are constants only there
#define QRT_NEON_INLINE inline __attribute__((always_inline))

QRT_NEON_INLINE int32x4_t sdot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(acc, a, b);
#else
  return vpadalq_s16(vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b))), vmull_high_s8(a, b));
#endif
}
inline int8x16_t s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }
// bits 0-15 of `bits` -> bytes 0-15: 16 where set
inline uint8x16_t fifth16(uint32_t bits) {
  static const uint8_t sel[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t b = vcombine_u8(vdup_n_u8(uint8_t(bits)), vdup_n_u8(uint8_t(bits >> 8)));
  return vandq_u8(vtstq_u8(b, vld1q_u8(sel)), vdupq_n_u8(16));
}

// A legacy block decoded: 32 signed codes (q[0]: elements 0-15, q[1]: 16-31), w = d * q + m.
struct NeonLegacy {
  int8x16_t q[2];
  float d, m;
};
QRT_NEON_INLINE NeonLegacy neon_legacy(int32_t t, const uint8_t* b) {
  NeonLegacy o;
  o.d = f16(b);
  o.m = 0.f;
  if (t == Q8_0) {
    o.q[0] = vld1q_s8(reinterpret_cast<const int8_t*>(b + 2));
    o.q[1] = vld1q_s8(reinterpret_cast<const int8_t*>(b + 18));
    return o;
  }
  const bool asym = t == Q4_1 || t == Q5_1, five = t == Q5_0 || t == Q5_1;
  if (asym) o.m = f16(b + 2);
  const uint8x16_t v = vld1q_u8(b + (asym ? 4 : 2) + (five ? 4 : 0));
  uint8x16_t ul = vandq_u8(v, vdupq_n_u8(15)), uh = vshrq_n_u8(v, 4);
  if (five) {
    const uint32_t qh = u32(b + (asym ? 4 : 2));
    ul = vorrq_u8(ul, fifth16(qh));
    uh = vorrq_u8(uh, fifth16(qh >> 16));
  }
  const uint8x16_t zero = vdupq_n_u8(uint8_t(asym ? 0 : (five ? 16 : 8)));
  o.q[0] = s8(vsubq_u8(ul, zero));
  o.q[1] = s8(vsubq_u8(uh, zero));
  return o;
}

// A K-quant super-block's scales: d, dmin, a scale and a min per sub-block (16 of 16 codes for
// Q2_K, Q3_K, Q6_K; 8 of 32 for Q4_K, Q5_K), w = d * sc * q - dmin * mn.
struct NeonKHead {
  int32_t sc[16], mn[16];
  float d, dmin;
};
constexpr bool sub16(int32_t t) { return t == Q2_K || t == Q3_K || t == Q6_K; }
constexpr bool has_mins(int32_t t) { return t == Q2_K || t == Q4_K || t == Q5_K; }
QRT_NEON_INLINE void neon_k_head(int32_t t, const uint8_t* b, NeonKHead& h) {
  h.dmin = 0.f;
  for (int u = 0; u < 16; ++u) h.mn[u] = 0;
  if (t == Q2_K) {
    h.d = f16(b + 80), h.dmin = f16(b + 82);
    for (int u = 0; u < 16; ++u) h.sc[u] = b[u] & 15, h.mn[u] = b[u] >> 4;
  } else if (t == Q3_K) {
    h.d = f16(b + 108);
    k3_scales(b + 96, h.sc);
  } else if (t == Q4_K || t == Q5_K) {
    h.d = f16(b), h.dmin = f16(b + 2);
    k4_scales(b + 4, h.sc, h.mn);
  } else {
    h.d = f16(b + 208);
    for (int u = 0; u < 16; ++u) h.sc[u] = static_cast<int8_t>(b[192 + u]);
  }
}

// chunk k (elements 32k .. 32k + 31) of a K-quant super-block as signed codes, in two halves of 16
QRT_NEON_INLINE void neon_k_chunk(int32_t t, const uint8_t* b, int k, int8x16_t* q) {
  const uint8x16_t m4 = vdupq_n_u8(15), m3 = vdupq_n_u8(3);
  const int n = k / 4, s = k % 4;
  for (int h = 0; h < 2; ++h) {
    const int l = 16 * h;  // element 32k + l + j, j < 16
    uint8x16_t u;
    switch (t) {
      case Q2_K: u = vandq_u8(vshlq_u8(vld1q_u8(b + 16 + 32 * n + l), vdupq_n_s8(int8_t(-2 * s))), m3); break;
      case Q3_K: {
        const uint8x16_t low = vandq_u8(vshlq_u8(vld1q_u8(b + 32 + 32 * n + l), vdupq_n_s8(int8_t(-2 * s))), m3);
        const uint8x16_t hb = vandq_u8(vshlq_u8(vld1q_u8(b + l), vdupq_n_s8(int8_t(-k))), vdupq_n_u8(1));
        u = vsubq_u8(vorrq_u8(low, vshlq_n_u8(hb, 2)), vdupq_n_u8(4));
        break;
      }
      case Q4_K:
      case Q5_K: {
        const uint8x16_t v = vld1q_u8(b + (t == Q5_K ? 48 : 16) + 32 * (k / 2) + l);
        u = k % 2 ? vshrq_n_u8(v, 4) : vandq_u8(v, m4);
        if (t == Q5_K) {
          const uint8x16_t hb = vandq_u8(vshlq_u8(vld1q_u8(b + 16 + l), vdupq_n_s8(int8_t(-k))), vdupq_n_u8(1));
          u = vorrq_u8(u, vshlq_n_u8(hb, 4));
        }
        break;
      }
      default: {  // Q6_K
        const uint8x16_t lv = vld1q_u8(b + 64 * n + 32 * (s % 2) + l);
        const uint8x16_t low = s >= 2 ? vshrq_n_u8(lv, 4) : vandq_u8(lv, m4);
        const uint8x16_t high = vandq_u8(vshlq_u8(vld1q_u8(b + 128 + 32 * n + l), vdupq_n_s8(int8_t(-2 * s))), m3);
        u = vsubq_u8(vorrq_u8(low, vshlq_n_u8(high, 4)), vdupq_n_u8(32));
      }
    }
    q[h] = s8(u);
  }
}

// a legacy block's 32 codes against 32 activation codes: the exact int32 dot
QRT_NEON_INLINE int32_t legacy_sdot(const int8x16_t* q, const int8_t* xq) {
  return vaddvq_s32(sdot16(sdot16(vdupq_n_s32(0), q[0], vld1q_s8(xq)), q[1], vld1q_s8(xq + 16)));
}

// chunk k's codes q against its 32 activation codes xk, scaled per sub-block into sumi
QRT_NEON_INLINE int32x4_t k_chunk_sdot(int32_t t, int32x4_t sumi, const int8x16_t* q, const int8_t* xk,
                                       const int32_t* sc, int k) {
  const int32x4_t d0 = sdot16(vdupq_n_s32(0), q[0], vld1q_s8(xk));
  const int32x4_t d1 = sdot16(vdupq_n_s32(0), q[1], vld1q_s8(xk + 16));
  if (sub16(t)) return vmlaq_n_s32(vmlaq_n_s32(sumi, d0, sc[2 * k]), d1, sc[2 * k + 1]);
  return vmlaq_n_s32(sumi, vaddq_s32(d0, d1), sc[k]);
}

// block i's fp32 term added to the accumulator of activation row x: the one expression of every path
QRT_NEON_INLINE void neon_legacy_term(float& acc, const NeonLegacy& o, const XRow& x, int64_t i, int32_t s) {
  acc += o.d * x.d[i] * float(s) + o.m * x.d[i] * float(x.s32[i]);
}
QRT_NEON_INLINE void neon_k_term(float& acc, int32_t t, const NeonKHead& h, const XRow& x, int64_t i, int32_t sumi) {
  int32_t summ = 0;  // stays the exact 0 of all-zero mins for the types without them
  if (has_mins(t)) {
    if (sub16(t))
      for (int u = 0; u < 16; ++u) summ += h.mn[u] * x.s16[i * 16 + u];
    else
      for (int u = 0; u < 8; ++u) summ += h.mn[u] * x.s32[i * 8 + u];
  }
  acc += h.d * x.d[i] * float(sumi) - h.dmin * x.d[i] * float(summ);
}

// out[r] = row . x[r] for r < MR, one canonical row of nb blocks of type T
template <int T, int MR>
void rows_dot_neon_t(const uint8_t* row, int64_t nb, const XRow* x, float* out) {
  constexpr int B = kInfo[T].B, TB = kInfo[T].T;
  float acc[MR] = {};
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* b = row + i * TB;
    if constexpr (B == 32) {
      const NeonLegacy o = neon_legacy(T, b);
      for (int r = 0; r < MR; ++r) neon_legacy_term(acc[r], o, x[r], i, legacy_sdot(o.q, x[r].q + i * 32));
    } else {
      NeonKHead h;
      neon_k_head(T, b, h);
      int32x4_t sumi[MR];
      for (int r = 0; r < MR; ++r) sumi[r] = vdupq_n_s32(0);
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        int8x16_t q[2];
        neon_k_chunk(T, b, k, q);
        for (int r = 0; r < MR; ++r) sumi[r] = k_chunk_sdot(T, sumi[r], q, x[r].q + i * 256 + 32 * k, h.sc, k);
      }
      for (int r = 0; r < MR; ++r) neon_k_term(acc[r], T, h, x[r], i, vaddvq_s32(sumi[r]));
    }
  }
  for (int r = 0; r < MR; ++r) out[r] = acc[r];
}

#if QRT_GGUF_SVE
// ---- SVE path (aarch64 with SVE, vectors of 256 bits or more): 32 codes per vector ---------------
// The NEON path's computation with one block's 32 codes (a legacy block, or a K-quant chunk) in byte
// lanes 0-31 of one svint8_t (the lanes beyond 0: zeroing loads under svwhilelt_b8(0, 32)), met by
// each activation row's 32 codes in one SDOT: int32 lanes 0-3 hold codes 0-15's sums, lanes 4-7 codes
// 16-31's (those beyond: 0). A block's sum is reduced once (svaddv) to the same exact int32 and added
// by the same fp32 expression (neon_legacy_term, neon_k_term): bit for bit the NEON builds' results.
// rows_dot takes it only where svcntb() >= 32; a 128-bit SVE machine runs the NEON kernel.

// a legacy block's 32 signed codes (the type's offset applied) in byte lanes 0-31, 0 beyond
QRT_NEON_INLINE svint8_t sve_legacy(int32_t t, const uint8_t* b, svbool_t p32) {
  if (t == Q8_0) return svld1_s8(p32, reinterpret_cast<const int8_t*>(b + 2));
  const bool asym = t == Q4_1 || t == Q5_1, five = t == Q5_0 || t == Q5_1;
  const svbool_t all = svptrue_b8();
  // the 16 nibble bytes in every quadword: low nibbles to lanes 0-15, high ones to lanes 16-31
  const svuint8_t v = svld1rq_u8(all, b + (asym ? 4 : 2) + (five ? 4 : 0));
  svuint8_t u = svsel_u8(svwhilelt_b8(0, 16), svand_n_u8_x(all, v, 15), svlsr_n_u8_x(all, v, 4));
  if (five) {  // lane j's fifth bit: bit j % 8 of qh's byte j / 8
    const svuint8_t j = svindex_u8(0, 1);
    const svuint8_t qh = svtbl_u8(svreinterpret_u8_u32(svdup_n_u32(u32(b + (asym ? 4 : 2)))), svlsr_n_u8_x(all, j, 3));
    const svuint8_t bit = svlsl_u8_x(all, svdup_n_u8(1), svand_n_u8_x(all, j, 7));
    u = svorr_n_u8_m(svcmpne_n_u8(all, svand_u8_x(all, qh, bit), 0), u, 16);
  }
  return svreinterpret_s8_u8(svsub_n_u8_z(p32, u, uint8_t(asym ? 0 : (five ? 16 : 8))));
}

// chunk k (elements 32k .. 32k + 31) of a K-quant super-block as signed codes in byte lanes 0-31, 0
// beyond: neon_k_chunk's two 16-byte halves are 32 contiguous bytes in every type, one load
QRT_NEON_INLINE svint8_t sve_k_chunk(int32_t t, const uint8_t* b, int k, svbool_t p32) {
  const svbool_t all = svptrue_b8();
  const int n = k / 4, s = k % 4;
  svuint8_t u;
  switch (t) {
    case Q2_K: u = svand_n_u8_x(all, svlsr_n_u8_x(all, svld1_u8(p32, b + 16 + 32 * n), uint8_t(2 * s)), 3); break;
    case Q3_K: {
      const svuint8_t low = svand_n_u8_x(all, svlsr_n_u8_x(all, svld1_u8(p32, b + 32 + 32 * n), uint8_t(2 * s)), 3);
      const svuint8_t hb = svand_n_u8_x(all, svlsr_n_u8_x(all, svld1_u8(p32, b), uint8_t(k)), 1);
      u = svsub_n_u8_z(p32, svorr_u8_x(all, low, svlsl_n_u8_x(all, hb, 2)), 4);
      break;
    }
    case Q4_K:
    case Q5_K: {
      const svuint8_t v = svld1_u8(p32, b + (t == Q5_K ? 48 : 16) + 32 * (k / 2));
      u = k % 2 ? svlsr_n_u8_x(all, v, 4) : svand_n_u8_x(all, v, 15);
      if (t == Q5_K) {
        const svuint8_t hb = svand_n_u8_x(all, svlsr_n_u8_x(all, svld1_u8(p32, b + 16), uint8_t(k)), 1);
        u = svorr_u8_x(all, u, svlsl_n_u8_x(all, hb, 4));
      }
      break;
    }
    default: {  // Q6_K
      const svuint8_t lv = svld1_u8(p32, b + 64 * n + 32 * (s % 2));
      const svuint8_t low = s >= 2 ? svlsr_n_u8_x(all, lv, 4) : svand_n_u8_x(all, lv, 15);
      const svuint8_t high = svand_n_u8_x(all, svlsr_n_u8_x(all, svld1_u8(p32, b + 128 + 32 * n), uint8_t(2 * s)), 3);
      u = svsub_n_u8_z(p32, svorr_u8_x(all, low, svlsl_n_u8_x(all, high, 4)), 32);
    }
  }
  return svreinterpret_s8_u8(u);
}

// chunk k's codes q against its 32 activation codes xk, scaled per sub-block into sumi: 16-element
// sub-blocks scale int32 lanes 0-3 by sc[2k] and lanes 4-7 by sc[2k + 1], 32-element ones all by sc[k]
QRT_NEON_INLINE svint32_t sve_k_chunk_sdot(int32_t t, svint32_t sumi, svint8_t q, const int8_t* xk,
                                           const int32_t* sc, int k, svbool_t p32) {
  const svint32_t d = svdot_s32(svdup_n_s32(0), q, svld1_s8(p32, xk));
  if (sub16(t))
    return svmla_s32_x(svptrue_b32(), sumi, d,
                       svsel_s32(svwhilelt_b32(0, 4), svdup_n_s32(sc[2 * k]), svdup_n_s32(sc[2 * k + 1])));
  return svmla_n_s32_x(svptrue_b32(), sumi, d, sc[k]);
}

// the exact int32 sum of an SVE block accumulator
QRT_NEON_INLINE int32_t sve_sum(svint32_t v) { return int32_t(svaddv_s32(svptrue_b32(), v)); }

// out[r] = row . x[r] for r < MR, one canonical row of nb blocks of type T (svcntb() >= 32)
template <int T, int MR>
void rows_dot_sve_t(const uint8_t* row, int64_t nb, const XRow* x, float* out) {
  constexpr int B = kInfo[T].B, TB = kInfo[T].T;
  const svbool_t p32 = svwhilelt_b8(0, 32);
  float acc[MR] = {};
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* b = row + i * TB;
    if constexpr (B == 32) {
      NeonLegacy o;  // its d and m only: the codes are q
      o.d = f16(b);
      o.m = T == Q4_1 || T == Q5_1 ? f16(b + 2) : 0.f;
      const svint8_t q = sve_legacy(T, b, p32);
      for (int r = 0; r < MR; ++r)
        neon_legacy_term(acc[r], o, x[r], i, sve_sum(svdot_s32(svdup_n_s32(0), q, svld1_s8(p32, x[r].q + i * 32))));
    } else {
      NeonKHead h;
      neon_k_head(T, b, h);
      // one accumulator per activation row (SVE vectors cannot form an array)
      svint32_t s0 = svdup_n_s32(0), s1 = s0, s2 = s0, s3 = s0;
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        const svint8_t q = sve_k_chunk(T, b, k, p32);
        s0 = sve_k_chunk_sdot(T, s0, q, x[0].q + i * 256 + 32 * k, h.sc, k, p32);
        if constexpr (MR > 1) s1 = sve_k_chunk_sdot(T, s1, q, x[1].q + i * 256 + 32 * k, h.sc, k, p32);
        if constexpr (MR > 2) s2 = sve_k_chunk_sdot(T, s2, q, x[2].q + i * 256 + 32 * k, h.sc, k, p32);
        if constexpr (MR > 3) s3 = sve_k_chunk_sdot(T, s3, q, x[3].q + i * 256 + 32 * k, h.sc, k, p32);
      }
      neon_k_term(acc[0], T, h, x[0], i, sve_sum(s0));
      if constexpr (MR > 1) neon_k_term(acc[1], T, h, x[1], i, sve_sum(s1));
      if constexpr (MR > 2) neon_k_term(acc[2], T, h, x[2], i, sve_sum(s2));
      if constexpr (MR > 3) neon_k_term(acc[3], T, h, x[3], i, sve_sum(s3));
    }
  }
  for (int r = 0; r < MR; ++r) out[r] = acc[r];
}
#endif  // QRT_GGUF_SVE

// out[r] = row . x[r] for r < mr <= 4: the SVE kernel where vectors hold 32 bytes or more, else NEON
void rows_dot(int32_t t, const uint8_t* row, int64_t nb, const XRow* x, int mr, float* out) {
#if QRT_GGUF_SVE
  if (svcntb() >= 32) {
    with_type(t, [&](auto T) {
      qrt::with_rows4(mr, [&](auto r) { rows_dot_sve_t<decltype(T)::value, decltype(r)::value>(row, nb, x, out); });
    });
    return;
  }
#endif
  with_type(t, [&](auto T) {
    qrt::with_rows4(mr, [&](auto r) { rows_dot_neon_t<decltype(T)::value, decltype(r)::value>(row, nb, x, out); });
  });
}

#if QRT_GGUF_I8MM
// SMMLA takes each operand as two rows of 8 codes: [a low 8 | b low 8] and [a high 8 | b high 8]
QRT_NEON_INLINE int8x16_t zip_lo(int8x16_t a, int8x16_t b) {
  return vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b)));
}
QRT_NEON_INLINE int8x16_t zip_hi(int8x16_t a, int8x16_t b) {
  return vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b)));
}

// 16 codes of two weight rows, zipped (w[0] = zip_lo, w[1] = zip_hi), against 16 activation codes
// of two rows at xa, xb: int32 lanes [xa.w0, xa.w1, xb.w0, xb.w1]
QRT_NEON_INLINE int32x4_t mm16(int32x4_t acc, const int8x16_t* w, const int8_t* xa, const int8_t* xb) {
  const int8x16_t a = vld1q_s8(xa), b = vld1q_s8(xb);
  return vmmlaq_s32(vmmlaq_s32(acc, zip_lo(a, b), w[0]), zip_hi(a, b), w[1]);
}

// [a, b, a, b]: the two weight rows' sub-block scales in the lanes of mm16's result
QRT_NEON_INLINE int32x4_t scale_pair(int32_t a, int32_t b) { return vzip1q_s32(vdupq_n_s32(a), vdupq_n_s32(b)); }

// out0[r] = row0 . x[r] and out1[r] = row1 . x[r] for r < MR: activation rows in pairs through SMMLA,
// an odd last one through SDOT, every block of both weight rows decoded once
template <int T, int MR>
void rows_dot_neon_mm_t(const uint8_t* row0, const uint8_t* row1, int64_t nb, const XRow* x, float* out0,
                        float* out1) {
  constexpr int B = kInfo[T].B, TB = kInfo[T].T, NP = MR / 2;
  float acc0[MR] = {}, acc1[MR] = {};
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* b0 = row0 + i * TB;
    const uint8_t* b1 = row1 + i * TB;
    if constexpr (B == 32) {
      const NeonLegacy o0 = neon_legacy(T, b0), o1 = neon_legacy(T, b1);
      const int8x16_t w[4] = {zip_lo(o0.q[0], o1.q[0]), zip_hi(o0.q[0], o1.q[0]), zip_lo(o0.q[1], o1.q[1]),
                              zip_hi(o0.q[1], o1.q[1])};
      for (int p = 0; p < NP; ++p) {
        const XRow &xa = x[2 * p], &xb = x[2 * p + 1];
        const int8_t* qa = xa.q + i * 32;
        const int8_t* qb = xb.q + i * 32;
        const int32x4_t s = mm16(mm16(vdupq_n_s32(0), w, qa, qb), w + 2, qa + 16, qb + 16);
        neon_legacy_term(acc0[2 * p], o0, xa, i, vgetq_lane_s32(s, 0));
        neon_legacy_term(acc1[2 * p], o1, xa, i, vgetq_lane_s32(s, 1));
        neon_legacy_term(acc0[2 * p + 1], o0, xb, i, vgetq_lane_s32(s, 2));
        neon_legacy_term(acc1[2 * p + 1], o1, xb, i, vgetq_lane_s32(s, 3));
      }
      if constexpr (MR % 2) {
        const XRow& xl = x[MR - 1];
        neon_legacy_term(acc0[MR - 1], o0, xl, i, legacy_sdot(o0.q, xl.q + i * 32));
        neon_legacy_term(acc1[MR - 1], o1, xl, i, legacy_sdot(o1.q, xl.q + i * 32));
      }
    } else {
      NeonKHead h0, h1;
      neon_k_head(T, b0, h0);
      neon_k_head(T, b1, h1);
      int32x4_t sumi[NP + 1], last0 = vdupq_n_s32(0), last1 = vdupq_n_s32(0);
      for (int p = 0; p < NP; ++p) sumi[p] = vdupq_n_s32(0);
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        int8x16_t q0[2], q1[2];
        neon_k_chunk(T, b0, k, q0);
        neon_k_chunk(T, b1, k, q1);
        const int8x16_t w[4] = {zip_lo(q0[0], q1[0]), zip_hi(q0[0], q1[0]), zip_lo(q0[1], q1[1]),
                                zip_hi(q0[1], q1[1])};
        for (int p = 0; p < NP; ++p) {
          const int8_t* qa = x[2 * p].q + i * 256 + 32 * k;
          const int8_t* qb = x[2 * p + 1].q + i * 256 + 32 * k;
          if constexpr (sub16(T)) {
            const int32x4_t d0 = mm16(vdupq_n_s32(0), w, qa, qb), d1 = mm16(vdupq_n_s32(0), w + 2, qa + 16, qb + 16);
            sumi[p] = vmlaq_s32(vmlaq_s32(sumi[p], d0, scale_pair(h0.sc[2 * k], h1.sc[2 * k])), d1,
                                scale_pair(h0.sc[2 * k + 1], h1.sc[2 * k + 1]));
          } else {
            const int32x4_t d = mm16(mm16(vdupq_n_s32(0), w, qa, qb), w + 2, qa + 16, qb + 16);
            sumi[p] = vmlaq_s32(sumi[p], d, scale_pair(h0.sc[k], h1.sc[k]));
          }
        }
        if constexpr (MR % 2) {
          const int8_t* ql = x[MR - 1].q + i * 256 + 32 * k;
          last0 = k_chunk_sdot(T, last0, q0, ql, h0.sc, k);
          last1 = k_chunk_sdot(T, last1, q1, ql, h1.sc, k);
        }
      }
      for (int p = 0; p < NP; ++p) {
        neon_k_term(acc0[2 * p], T, h0, x[2 * p], i, vgetq_lane_s32(sumi[p], 0));
        neon_k_term(acc1[2 * p], T, h1, x[2 * p], i, vgetq_lane_s32(sumi[p], 1));
        neon_k_term(acc0[2 * p + 1], T, h0, x[2 * p + 1], i, vgetq_lane_s32(sumi[p], 2));
        neon_k_term(acc1[2 * p + 1], T, h1, x[2 * p + 1], i, vgetq_lane_s32(sumi[p], 3));
      }
      if constexpr (MR % 2) {
        neon_k_term(acc0[MR - 1], T, h0, x[MR - 1], i, vaddvq_s32(last0));
        neon_k_term(acc1[MR - 1], T, h1, x[MR - 1], i, vaddvq_s32(last1));
      }
    }
  }
  for (int r = 0; r < MR; ++r) out0[r] = acc0[r], out1[r] = acc1[r];
}

// out0[r] = row0 . x[r], out1[r] = row1 . x[r] for r < mr <= 4
void rows_dot_neon_mm(int32_t t, const uint8_t* row0, const uint8_t* row1, int64_t nb, const XRow* x, int mr,
                      float* out0, float* out1) {
  with_type(t, [&](auto T) {
    qrt::with_rows4(mr, [&](auto r) {
      rows_dot_neon_mm_t<decltype(T)::value, decltype(r)::value>(row0, row1, nb, x, out0, out1);
    });
  });
}
#endif  // QRT_GGUF_I8MM
#endif  // QRT_GGUF_NEON

// ---- AVX2 path: canonical rows, 32 codes per 256-bit vector ---------------------------------------
// Built without AVX-512 VNNI but with AVX2 + FMA + F16C (x86-64-v3), every row stays in llama.cpp's
// canonical blocks (no 16-row groups) and one row meets up to 4 activation rows at a time, decoding
// each block once. A block is decoded 32 codes at a time into one vector: unsigned codes (Q4_1, Q5_1,
// Q2_K, Q4_K, Q5_K: _mm256_maddubs_epi16's unsigned operand as they are) or signed ones (every type
// with a code offset, the offset applied), which take the sign trick: |q| unsigned against x carrying
// q's sign. The pair sums are then scaled per sub-block by _mm256_madd_epi16 (16-element sub-blocks
// take their two scales in the two 128-bit halves), so every block's sum is an exact int32 as in the
// scalar path; mins use the activation sums (x.s16 / x.s32) as there. No int16 sum saturates: two
// products of at most 128 * 127.
//
// With VPDPBUSD on ymm registers (QRT_GGUF_DPBUSD: AVX-VNNI, or its EVEX twin for testing) the groups
// of 4 byte products go straight into int32 lanes: one instruction per maddubs + madd pair (or per
// chain of maddubs summed in int16 and widened once). Every lane then holds the same exact int32 as
// the maddubs build, and the fp32 code is shared, so the two builds give identical bits.
#if QRT_GGUF_AVX2
#if defined(__AVXVNNI__) || defined(QRT_VNNI_EVEX_TWIN)
#define QRT_GGUF_DPBUSD 1
#else
#define QRT_GGUF_DPBUSD 0
#endif
#if QRT_GGUF_DPBUSD
// acc + the dot of each 4 unsigned bytes of u with the 4 signed bytes of s in its int32 lane
inline __attribute__((always_inline)) __m256i dpbusd(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
  // QRT_VNNI_EVEX_TWIN: the AVX-512 VNNI encoding of the same instruction, so that an AVX-512 CPU
  // runs (and tests) the code an AVX-VNNI CPU compiles; the flags stay x86-64-v3 (ymm0-15 only)
  asm("%{evex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
  return acc;
#endif
}
#endif
inline __m256i ld32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// 16 bytes of nibbles -> 32 codes: the low nibbles (elements 0-15), then the high ones (16-31)
inline __m256i nibbles(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i m = _mm_set1_epi8(15);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

// bit e of `bits` -> byte e: 16 where set, else 0 (Q5_0/Q5_1's fifth code bit)
inline __m256i fifth_bits(uint32_t bits) {
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i sel = _mm256_set1_epi64x(0x8040201008040201LL);
  const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(int32_t(bits)), spread), sel);
  return _mm256_and_si256(_mm256_cmpeq_epi8(v, sel), _mm256_set1_epi8(16));
}

// bits 2s, 2s+1 of each byte of v (s < 4) as 0..3, and bit k of each byte (k < 8) as 0 / 1
inline __m256i crumb(__m256i v, int s) {
  return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * s)), _mm256_set1_epi8(3));
}
inline __m256i bit_of(__m256i v, int k) {
  return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(k)), _mm256_set1_epi8(1));
}

// 16 int16 pair sums of codes q (signed: the sign trick) times activation codes x
template <bool SIGNED>
inline __m256i pairs(__m256i q, __m256i x) {
  if constexpr (SIGNED) return _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q));
  return _mm256_maddubs_epi16(q, x);
}

// 8 int32 sums of 4 products of codes q (signed: the sign trick) times activation codes x
template <bool SIGNED>
inline __m256i quads(__m256i q, __m256i x) {
#if QRT_GGUF_DPBUSD
  if constexpr (SIGNED) return dpbusd(_mm256_setzero_si256(), _mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q));
  return dpbusd(_mm256_setzero_si256(), q, x);
#else
  return _mm256_madd_epi16(pairs<SIGNED>(q, x), _mm256_set1_epi16(1));
#endif
}

// the same, each lane times its int16 sub-block scale (scv: from word_pick, or word_pick_lo with
// dpbusd, whose 4-product sums fit int16: at most 4 x 32 x 127, so VPMADDWD against the scale in the
// low word and 0 in the high one multiplies exactly)
template <bool SIGNED>
inline __m256i quads_scaled(__m256i q, __m256i x, __m256i scv) {
#if QRT_GGUF_DPBUSD
  return _mm256_madd_epi16(quads<SIGNED>(q, x), scv);
#else
  return _mm256_madd_epi16(pairs<SIGNED>(q, x), scv);
#endif
}

// a byte shuffle that fills the low lane with its word a and the high lane with its word b
inline __m256i word_pick(int a, int b) {
  const char a0 = char(2 * a), a1 = char(2 * a + 1), b0 = char(2 * b), b1 = char(2 * b + 1);
  return _mm256_setr_epi8(a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1,  //
                          b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1);
}
// the same with the high word of every 32-bit lane zeroed (the scale of quads_scaled's dpbusd sums)
inline __m256i word_pick_lo(int a, int b) {
  const char a0 = char(2 * a), a1 = char(2 * a + 1), b0 = char(2 * b), b1 = char(2 * b + 1), z = char(0x80);
  return _mm256_setr_epi8(a0, a1, z, z, a0, a1, z, z, a0, a1, z, z, a0, a1, z, z,  //
                          b0, b1, z, z, b0, b1, z, z, b0, b1, z, z, b0, b1, z, z);
}
// quads_scaled's scale vector for the words a, b of a lane of scales
inline __m256i scale_pick(int a, int b) { return QRT_GGUF_DPBUSD ? word_pick_lo(a, b) : word_pick(a, b); }

// Q4_K/Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins, a byte each (k4_scales, 32 bits at a time)
inline void k4_unpack(const uint8_t* s, uint64_t& sc, uint64_t& mn) {
  uint32_t u0, u1, u2;
  std::memcpy(&u0, s, 4);
  std::memcpy(&u1, s + 4, 4);
  std::memcpy(&u2, s + 8, 4);
  const uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, top2 = 0x30303030;
  sc = (u0 & low6) | uint64_t((u2 & low4) | ((u0 >> 2) & top2)) << 32;
  mn = (u1 & low6) | uint64_t(((u2 >> 4) & low4) | ((u1 >> 2) & top2)) << 32;
}

using qrt::hsum8;

// out[r] = row . x[r] for r < MR, one canonical row of nb blocks of type T
template <int T, int MR>
void rows_dot_avx2(const uint8_t* row, int64_t nb, const XRow* x, float* out) {
  constexpr int B = kInfo[T].B, TB = kInfo[T].T;
  constexpr int NA = MR <= 2 ? 2 : 1;  // accumulators per row, blocks alternating: two FMA chains
  __m256 acc[MR][NA], accm[MR];       // the scaled sums, and the Q4_K/Q5_K mins
  float accs[MR];                     // the Q4_1/Q5_1 mins and the Q2_K ones
  for (int r = 0; r < MR; ++r) {
    for (int a = 0; a < NA; ++a) acc[r][a] = _mm256_setzero_ps();
    accm[r] = _mm256_setzero_ps();
    accs[r] = 0.f;
  }
  // block i into accumulator A of each row
  auto block = [&](int64_t i, auto slot) __attribute__((always_inline)) {
    constexpr int A = decltype(slot)::value;
    const uint8_t* b = row + i * TB;
    if constexpr (B == 32) {
      __m256i q;
      float m = 0.f;
      const float d = f16(b);
      if constexpr (T == Q4_0) q = _mm256_sub_epi8(nibbles(b + 2), _mm256_set1_epi8(8));
      if constexpr (T == Q4_1) q = nibbles(b + 4), m = f16(b + 2);
      if constexpr (T == Q5_0) q = _mm256_sub_epi8(_mm256_or_si256(nibbles(b + 6), fifth_bits(u32(b + 2))), _mm256_set1_epi8(16));
      if constexpr (T == Q5_1) q = _mm256_or_si256(nibbles(b + 8), fifth_bits(u32(b + 4))), m = f16(b + 2);
      if constexpr (T == Q8_0) q = ld32(b + 2);
      constexpr bool sgn = T == Q4_0 || T == Q5_0 || T == Q8_0;
      for (int r = 0; r < MR; ++r) {
        const __m256i p = quads<sgn>(q, ld32(reinterpret_cast<const uint8_t*>(x[r].q) + i * 32));
        acc[r][A] = _mm256_fmadd_ps(_mm256_set1_ps(d * x[r].d[i]), _mm256_cvtepi32_ps(p), acc[r][A]);
        if constexpr (T == Q4_1 || T == Q5_1) accs[r] += m * x[r].d[i] * float(x[r].s32[i]);
      }
      return;
    }
    // K-quants: 8 chunks of 32 codes, sub-block scales sc (16 of 16 codes, or 8 of 32) and mins mn
    // sub-block scales as int16: 16 sub-blocks in words 0-7 of the low lane and 8-15 of the high one,
    // or 8 sub-blocks in words 0-7 of both lanes; mins as bytes
    __m256i sc16;
    alignas(16) uint8_t mn[16];
    float d, dmin = 0.f;
    if constexpr (T == Q2_K) {
      d = f16(b + 80), dmin = f16(b + 82);
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
      sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(v, _mm_set1_epi8(15)));
      _mm_store_si128(reinterpret_cast<__m128i*>(mn), _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(15)));
    } else if constexpr (T == Q3_K) {
      d = f16(b + 108);
      int32_t sc[16];
      alignas(32) int16_t w[16];
      k3_scales(b + 96, sc);
      for (int u = 0; u < 16; ++u) w[u] = int16_t(sc[u]);
      sc16 = _mm256_load_si256(reinterpret_cast<const __m256i*>(w));
    } else if constexpr (T == Q4_K || T == Q5_K) {
      d = f16(b), dmin = f16(b + 2);
      uint64_t s8, m8;
      k4_unpack(b + 4, s8, m8);
      sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(s8))));
      std::memcpy(mn, &m8, 8);
    } else {
      d = f16(b + 208);
      sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
    }
    __m256i sc_lo = sc16, sc_hi = sc16;  // 16 sub-blocks: one lane's words in both lanes
    if constexpr (T == Q2_K || T == Q3_K || T == Q6_K) {
      sc_lo = _mm256_permute2x128_si256(sc16, sc16, 0x00);
      sc_hi = _mm256_permute2x128_si256(sc16, sc16, 0x11);
    }
    constexpr bool sgn = T == Q3_K || T == Q6_K, sub16 = T == Q2_K || T == Q3_K || T == Q6_K;
    __m256i sumi[MR];
    for (int r = 0; r < MR; ++r) sumi[r] = _mm256_setzero_si256();
    __m256i hv = _mm256_setzero_si256();
    if constexpr (T == Q3_K) hv = ld32(b);
    if constexpr (T == Q5_K) hv = ld32(b + 16);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {  // chunk k: elements 32k .. 32k + 31
      const int n = k / 4, s = k % 4;
      __m256i q;
      if constexpr (T == Q2_K) q = crumb(ld32(b + 16 + 32 * n), s);
      if constexpr (T == Q3_K)
        q = _mm256_sub_epi8(_mm256_or_si256(crumb(ld32(b + 32 + 32 * n), s), _mm256_slli_epi16(bit_of(hv, k), 2)),
                            _mm256_set1_epi8(4));
      if constexpr (T == Q4_K || T == Q5_K) {
        const __m256i v = ld32(b + (T == Q5_K ? 48 : 16) + 32 * (k / 2));
        q = _mm256_and_si256(k % 2 ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(15));
        if constexpr (T == Q5_K) q = _mm256_or_si256(q, _mm256_slli_epi16(bit_of(hv, k), 4));
      }
      if constexpr (T == Q6_K) {
        const __m256i lv = ld32(b + 64 * n + 32 * (s % 2));
        const __m256i lo = _mm256_and_si256(s >= 2 ? _mm256_srli_epi16(lv, 4) : lv, _mm256_set1_epi8(15));
        q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(crumb(ld32(b + 128 + 32 * n), s), 4)),
                            _mm256_set1_epi8(32));
      }
      const __m256i scv = sub16 ? _mm256_shuffle_epi8(k < 4 ? sc_lo : sc_hi, scale_pick((2 * k) % 8, (2 * k + 1) % 8))
                                : _mm256_shuffle_epi8(sc16, scale_pick(k, k));
      for (int r = 0; r < MR; ++r)
        sumi[r] = _mm256_add_epi32(
            sumi[r], quads_scaled<sgn>(q, ld32(reinterpret_cast<const uint8_t*>(x[r].q) + i * 256 + 32 * k), scv));
    }
    __m256i mn32 = _mm256_setzero_si256();
    if constexpr (T == Q4_K || T == Q5_K) mn32 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mn)));
    for (int r = 0; r < MR; ++r) {
      acc[r][A] = _mm256_fmadd_ps(_mm256_set1_ps(d * x[r].d[i]), _mm256_cvtepi32_ps(sumi[r]), acc[r][A]);
      if constexpr (T == Q4_K || T == Q5_K) {  // 8 mins times the sums of their 32 activation codes
        const __m256i s32 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r].s32 + i * 8));
        accm[r] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * x[r].d[i]), _mm256_cvtepi32_ps(_mm256_mullo_epi32(mn32, s32)),
                                  accm[r]);
      }
      if constexpr (T == Q2_K) {
        int32_t summ = 0;
        for (int u = 0; u < 16; ++u) summ += mn[u] * x[r].s16[i * 16 + u];
        accs[r] -= dmin * x[r].d[i] * float(summ);
      }
    }
  };
  int64_t i = 0;
  if constexpr (NA == 2)
    for (; i + 2 <= nb; i += 2) {
      block(i, std::integral_constant<int, 0>{});
      block(i + 1, std::integral_constant<int, 1>{});
    }
  for (; i < nb; ++i) block(i, std::integral_constant<int, 0>{});
  for (int r = 0; r < MR; ++r) {
    __m256 a = acc[r][0];
    for (int j = 1; j < NA; ++j) a = _mm256_add_ps(a, acc[r][j]);
    out[r] = hsum8(_mm256_sub_ps(a, accm[r])) + accs[r];
  }
}

// out[r] = row . x[r] for r < mr <= 4
void rows_dot(int32_t t, const uint8_t* row, int64_t nb, const XRow* x, int mr, float* out) {
  with_type(t, [&](auto T) {
    qrt::with_rows4(mr, [&](auto r) { rows_dot_avx2<decltype(T)::value, decltype(r)::value>(row, nb, x, out); });
  });
}
#endif  // QRT_GGUF_AVX2

#if QRT_GGUF_SIMD || QRT_GGUF_AVX2
// the fixed-count loops below must unroll: their indices pick shifts, masks and registers
#define QRT_UNROLL _Pragma("GCC unroll 16")
// and the helpers must inline: a call inside a block loop costs more than the block
#define QRT_INLINE inline __attribute__((always_inline))

// Each block asks for the code planes kPrefetch bytes ahead of it, into L2. The K-quant blocks are
// 1-3 KB and several hundred instructions long, so the out-of-order window alone holds too few cache
// misses to keep DRAM busy (Q6_K streamed at half the speed without this); past the end it is harmless.
#ifndef QRT_GGUF_PREFETCH  // overridable for tuning builds, as is the hint
#define QRT_GGUF_PREFETCH 8192
#endif
#ifndef QRT_GGUF_PREFETCH_HINT
#define QRT_GGUF_PREFETCH_HINT _MM_HINT_T1
#endif
constexpr int64_t kPrefetch = QRT_GGUF_PREFETCH;
QRT_INLINE void prefetch(const uint8_t* p, int64_t bytes) {
  for (int64_t off = 0; off < bytes; off += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch + off), QRT_GGUF_PREFETCH_HINT);
}

#endif

// ---- AVX2 path, 16-row groups (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) -------------------------------
// The AVX-512 build's group layout (below), read as two halves of 8 rows: a plane's 32 bytes of one
// half hold 4 codes of each of its 8 rows, one 32-bit lane per row. VPDPBUSD's 4-byte dot becomes
// _mm256_maddubs_epi16 (pairs, int16) then _mm256_madd_epi16 against ones (int32): for codes below
// 32 the pair sums of 4 planes are added in int16 first (4 x 2 x 31 x 127 < 2^15), so one widening
// serves 16 activation codes; Q6_K's codes (below 64) add two planes, Q8_0's signed ones take the
// sign trick per plane. High nibbles are shifted down (16x the code would saturate the int16 pairs).
// Sums, sub-block scales and fp32 scaling are the AVX-512 kernels', per half. With QRT_GGUF_DPBUSD
// every plane takes one VPDPBUSD, as there, and Q4_K's sub-block sums are scaled in int32 (VPMULLD)
// as Q5_K's are: no int16 sum is left to bound.
#if QRT_GGUF_AVX2
QRT_INLINE __m256i ldh(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
QRT_INLINE __m256 f16x8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
QRT_INLINE __m256i bytes_u32x8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
QRT_INLINE __m256i bytes_i32x8(const uint8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
QRT_INLINE __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}
#if QRT_GGUF_DPBUSD
// acc + n planes of unsigned codes (one half) against 4n activation codes at p: an int32 per row
template <int n>
QRT_INLINE __m256i dot_planes(__m256i acc, const __m256i* u, const int8_t* p) {
  QRT_UNROLL
  for (int c = 0; c < n; ++c) acc = dpbusd(acc, u[c], bcast4(p + 4 * c));
  return acc;
}
// no int16 sums to keep below saturation: any codes below 256
QRT_INLINE __m256i dot4_small(const __m256i* u, const int8_t* p) { return dot_planes<4>(_mm256_setzero_si256(), u, p); }
QRT_INLINE __m256i dot4_mid(const __m256i* u, const int8_t* p) { return dot_planes<4>(_mm256_setzero_si256(), u, p); }
#else
QRT_INLINE __m256i widen(__m256i pairs16) { return _mm256_madd_epi16(pairs16, _mm256_set1_epi16(1)); }
// 4 planes of codes below 32 (one half) against 16 activation codes at p: an int32 per row
QRT_INLINE __m256i dot4_small(const __m256i* u, const int8_t* p) {
  __m256i s = _mm256_maddubs_epi16(u[0], bcast4(p));
  QRT_UNROLL
  for (int c = 1; c < 4; ++c) s = _mm256_add_epi16(s, _mm256_maddubs_epi16(u[c], bcast4(p + 4 * c)));
  return widen(s);
}
// the same for codes below 64: two planes per int16 sum
QRT_INLINE __m256i dot4_mid(const __m256i* u, const int8_t* p) {
  const __m256i a = _mm256_add_epi16(_mm256_maddubs_epi16(u[0], bcast4(p)), _mm256_maddubs_epi16(u[1], bcast4(p + 4)));
  const __m256i b = _mm256_add_epi16(_mm256_maddubs_epi16(u[2], bcast4(p + 8)), _mm256_maddubs_epi16(u[3], bcast4(p + 12)));
  return _mm256_add_epi32(widen(a), widen(b));
}
#endif
// bytes of v holding bit `bit` -> 16, else 0
QRT_INLINE __m256i bit16(__m256i v, int bit) {
  const __m256i b = _mm256_set1_epi8(static_cast<char>(bit));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, b), b), _mm256_set1_epi8(16));
}

template <int MR, bool asym>
void grp2_q4(const uint8_t* p, const uint8_t* f, int64_t nb, const XRow* x, __m256 (*acc)[2]) {
  const __m256i m4 = _mm256_set1_epi8(15);
  for (int64_t b = 0; b < nb; ++b, p += 256, f += asym ? 64 : 32) {
    prefetch(p, 256);
    QRT_UNROLL
    for (int h = 0; h < 2; ++h) {
      __m256i lo[4], hi[4];
      QRT_UNROLL
      for (int c = 0; c < 4; ++c) {
        const __m256i v = ldh(p + 64 * c + 32 * h);
        lo[c] = _mm256_and_si256(v, m4);
        hi[c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      }
      const __m256 dw = f16x8(f + 16 * h);
      QRT_UNROLL
      for (int m = 0; m < MR; ++m) {
        const int8_t* q = x[m].q + 32 * b;
        const int32_t sx = x[m].s32[b];
        __m256i a = _mm256_add_epi32(dot4_small(lo, q), dot4_small(hi, q + 16));
        if constexpr (!asym) a = _mm256_sub_epi32(a, _mm256_set1_epi32(8 * sx));
        const float dx = x[m].d[b];
        acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), _mm256_mul_ps(dw, _mm256_set1_ps(dx)), acc[m][h]);
        if constexpr (asym) acc[m][h] = _mm256_fmadd_ps(f16x8(f + 32 + 16 * h), _mm256_set1_ps(dx * float(sx)), acc[m][h]);
      }
    }
  }
}

template <int MR>
void grp2_q8_0(const uint8_t* p, const uint8_t* f, int64_t nb, const XRow* x, __m256 (*acc)[2]) {
  for (int64_t b = 0; b < nb; ++b, p += 512, f += 32) {
    prefetch(p, 512);
    QRT_UNROLL
    for (int h = 0; h < 2; ++h) {
      __m256i u[8], a8[8];
      QRT_UNROLL
      for (int c = 0; c < 8; ++c) {
        u[c] = ldh(p + 64 * c + 32 * h);
        a8[c] = _mm256_sign_epi8(u[c], u[c]);  // |q| (-128 stays 0x80: 128 as the unsigned operand)
      }
      const __m256 dw = f16x8(f + 16 * h);
      QRT_UNROLL
      for (int m = 0; m < MR; ++m) {
        const int8_t* q = x[m].q + 32 * b;
        __m256i a = _mm256_setzero_si256();
        QRT_UNROLL
        for (int c = 0; c < 8; ++c) {
          const __m256i xs = _mm256_sign_epi8(bcast4(q + 4 * c), u[c]);
#if QRT_GGUF_DPBUSD
          a = dpbusd(a, a8[c], xs);
#else
          a = _mm256_add_epi32(a, widen(_mm256_maddubs_epi16(a8[c], xs)));
#endif
        }
        acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), _mm256_mul_ps(dw, _mm256_set1_ps(x[m].d[b])), acc[m][h]);
      }
    }
  }
}

template <int MR, bool five>
void grp2_q45_k(const uint8_t* p, const uint8_t* f, int64_t nb, const XRow* x, __m256 (*acc)[2]) {
  const __m256i m4 = _mm256_set1_epi8(15);
  const int qs = five ? 512 : 0;
  for (int64_t b = 0; b < nb; ++b, p += five ? 2560 : 2048, f += 320) {
    prefetch(p, five ? 2560 : 2048);
    for (int h = 0; h < 2; ++h) {  // not unrolled: the halves differ in offsets only (and GCC's compile
                                   // time grows steeply with the unrolled block)
      __m256i sum[MR], mins[MR];
      QRT_UNROLL
      for (int m = 0; m < MR; ++m) sum[m] = mins[m] = _mm256_setzero_si256();
      for (int j = 0; j < 4; ++j) {
        __m256i lo[8], hi[8];
        QRT_UNROLL
        for (int c = 0; c < 8; ++c) {
          const __m256i v = ldh(p + qs + 64 * (8 * j + c) + 32 * h);
          lo[c] = _mm256_and_si256(v, m4);
          hi[c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
          if constexpr (five) {
            const __m256i qh = ldh(p + 64 * c + 32 * h);
            lo[c] = _mm256_or_si256(lo[c], bit16(qh, 1 << (2 * j)));
            hi[c] = _mm256_or_si256(hi[c], bit16(qh, 2 << (2 * j)));
          }
        }
        const __m256i sa = bytes_u32x8(f + 64 + 16 * (2 * j) + 8 * h);
        const __m256i sb = bytes_u32x8(f + 64 + 16 * (2 * j + 1) + 8 * h);
        if constexpr (five) {
          QRT_UNROLL
          for (int m = 0; m < MR; ++m) {
            const int8_t* q = x[m].q + 256 * b + 64 * j;
            const __m256i da = _mm256_add_epi32(dot4_small(lo, q), dot4_small(lo + 4, q + 16));
            const __m256i db = _mm256_add_epi32(dot4_small(hi, q + 32), dot4_small(hi + 4, q + 48));
            sum[m] = _mm256_add_epi32(sum[m], _mm256_add_epi32(_mm256_mullo_epi32(da, sa), _mm256_mullo_epi32(db, sb)));
          }
          continue;
        }
#if QRT_GGUF_DPBUSD
        // Q4_K: one int32 sum per row and sub-block (8 planes), times its scale
        QRT_UNROLL
        for (int m = 0; m < MR; ++m) {
          const int8_t* q = x[m].q + 256 * b + 64 * j;
          const __m256i da = dot_planes<8>(_mm256_setzero_si256(), lo, q);
          const __m256i db = dot_planes<8>(_mm256_setzero_si256(), hi, q + 32);
          sum[m] = _mm256_add_epi32(sum[m], _mm256_add_epi32(_mm256_mullo_epi32(da, sa), _mm256_mullo_epi32(db, sb)));
        }
#else
        // Q4_K: each row's sub-block scale in both int16 halves of its lane, so that VPMADDWD scales
        // the int16 pair sums of all 8 planes (8 x 2 x 15 x 127 < 2^15) while it widens them
        const __m256i sa2 = _mm256_or_si256(sa, _mm256_slli_epi32(sa, 16));
        const __m256i sb2 = _mm256_or_si256(sb, _mm256_slli_epi32(sb, 16));
        QRT_UNROLL
        for (int m = 0; m < MR; ++m) {
          const int8_t* q = x[m].q + 256 * b + 64 * j;
          __m256i pa = _mm256_maddubs_epi16(lo[0], bcast4(q)), pb = _mm256_maddubs_epi16(hi[0], bcast4(q + 32));
          QRT_UNROLL
          for (int c = 1; c < 8; ++c) {
            pa = _mm256_add_epi16(pa, _mm256_maddubs_epi16(lo[c], bcast4(q + 4 * c)));
            pb = _mm256_add_epi16(pb, _mm256_maddubs_epi16(hi[c], bcast4(q + 32 + 4 * c)));
          }
          sum[m] = _mm256_add_epi32(sum[m], _mm256_add_epi32(_mm256_madd_epi16(pa, sa2), _mm256_madd_epi16(pb, sb2)));
        }
#endif
      }
      QRT_UNROLL
      for (int t = 0; t < 8; ++t) {  // mins below 64, activation sums in int16: one VPMADDWD each
        const __m256i mt = bytes_u32x8(f + 192 + 16 * t + 8 * h);
        QRT_UNROLL
        for (int m = 0; m < MR; ++m)
          mins[m] = _mm256_add_epi32(mins[m], _mm256_madd_epi16(mt, _mm256_set1_epi32(x[m].s32[8 * b + t])));
      }
      const __m256 dw = f16x8(f + 16 * h), dm = f16x8(f + 32 + 16 * h);
      QRT_UNROLL
      for (int m = 0; m < MR; ++m) {
        const __m256 dx = _mm256_set1_ps(x[m].d[b]);
        acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[m]), _mm256_mul_ps(dw, dx), acc[m][h]);
        acc[m][h] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins[m]), _mm256_mul_ps(dm, dx), acc[m][h]);
      }
    }
  }
}

template <int MR>
void grp2_q6_k(const uint8_t* p, const uint8_t* f, int64_t nb, const XRow* x, __m256 (*acc)[2]) {
  const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
  for (int64_t b = 0; b < nb; ++b, p += 3072, f += 288) {
    prefetch(p, 3072);
    for (int h = 0; h < 2; ++h) {  // not unrolled, as in grp2_q45_k
      __m256i sumi[MR];
      QRT_UNROLL
      for (int m = 0; m < MR; ++m) sumi[m] = _mm256_setzero_si256();
      for (int n = 0; n < 2; ++n) {
        for (int g = 0; g < 2; ++g) {
          const uint8_t* run = p + 768 * (2 * n + g);  // the 12 planes this (n, g) reads
          __m256i w1[4], w2[4], qh[4];
          QRT_UNROLL
          for (int c = 0; c < 4; ++c) {
            w1[c] = ldh(run + 64 * c + 32 * h);
            w2[c] = ldh(run + 256 + 64 * c + 32 * h);
            qh[c] = ldh(run + 512 + 64 * c + 32 * h);
          }
          QRT_UNROLL
          for (int s = 0; s < 4; ++s) {
            const int t = 8 * n + 2 * s + g;
            __m256i u[4];
            QRT_UNROLL
            for (int c = 0; c < 4; ++c) {
              const __m256i src = s & 1 ? w2[c] : w1[c];
              const __m256i nib = _mm256_and_si256(s < 2 ? src : _mm256_srli_epi16(src, 4), m4);
              const __m256i hb = s == 0   ? _mm256_slli_epi16(qh[c], 4)
                                 : s == 1 ? _mm256_slli_epi16(qh[c], 2)
                                 : s == 2 ? qh[c]
                                          : _mm256_srli_epi16(qh[c], 2);
              u[c] = _mm256_or_si256(nib, _mm256_and_si256(hb, m30));
            }
            const __m256i sct = bytes_i32x8(f + 32 + 16 * t + 8 * h);
            QRT_UNROLL
            for (int m = 0; m < MR; ++m) {
              const __m256i dot = _mm256_sub_epi32(dot4_mid(u, x[m].q + 256 * b + 16 * t),
                                                   _mm256_set1_epi32(32 * x[m].s16[16 * b + t]));
              sumi[m] = _mm256_add_epi32(sumi[m], _mm256_mullo_epi32(dot, sct));
            }
          }
        }
      }
      const __m256 dw = f16x8(f + 16 * h);
      QRT_UNROLL
      for (int m = 0; m < MR; ++m)
        acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[m]), _mm256_mul_ps(dw, _mm256_set1_ps(x[m].d[b])), acc[m][h]);
    }
  }
}

// the types this build runs in 16-row groups (the others stay canonical: the row path above)
constexpr bool grouped(int32_t t) { return t == Q4_0 || t == Q4_1 || t == Q8_0 || t == Q4_K || t == Q5_K || t == Q6_K; }

template <int MR>
void group_dot(int32_t t, const uint8_t* p, const uint8_t* f, int64_t nb, const XRow* x, float* res) {
  __m256 acc[MR][2];
  QRT_UNROLL
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  switch (t) {
    case Q4_0: grp2_q4<MR, false>(p, f, nb, x, acc); break;
    case Q4_1: grp2_q4<MR, true>(p, f, nb, x, acc); break;
    case Q8_0: grp2_q8_0<MR>(p, f, nb, x, acc); break;
    case Q4_K: grp2_q45_k<MR, false>(p, f, nb, x, acc); break;
    case Q5_K: grp2_q45_k<MR, true>(p, f, nb, x, acc); break;
    default: grp2_q6_k<MR>(p, f, nb, x, acc);
  }
  QRT_UNROLL
  for (int m = 0; m < MR; ++m) {
    _mm256_storeu_ps(res + 16 * m, acc[m][0]);
    _mm256_storeu_ps(res + 16 * m + 8, acc[m][1]);
  }
}

void group_dot_any(int32_t t, const uint8_t* p, const uint8_t* f, int64_t nb, const XRow* x, int mr, float* res) {
  qrt::with_rows4(mr, [&](auto r) { group_dot<decltype(r)::value>(t, p, f, nb, x, res); });
}
#endif  // QRT_GGUF_AVX2

// ---- AVX-512 VNNI path: 16-row groups ------------------------------------------------------------
#if QRT_GGUF_SIMD

QRT_INLINE __m512i ld(const uint8_t* p) { return _mm512_loadu_si512(p); }
QRT_INLINE __m512 f16x16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
QRT_INLINE __m512i bytes_u32(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
QRT_INLINE __m512i bytes_i32(const uint8_t* p) {
  return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// acc += 4 codes of each row (u8 lanes of u) times the 4 activation codes at p, broadcast. Written out
// because GCC emits _mm512_dpbusd_epi32(acc, u, _mm512_set1_epi32(v)) as a separate broadcast: the
// embedded {1to16} memory operand makes it one instruction.
QRT_INLINE __m512i dp(__m512i acc, __m512i u, const int8_t* p) {
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}
// acc += the 16 rows' 4 codes of each of 4 planes against 16 consecutive activation codes at p
QRT_INLINE __m512i dp4(__m512i acc, const __m512i* u, const int8_t* p) {
  QRT_UNROLL
  for (int c = 0; c < 4; ++c) acc = dp(acc, u[c], p + 4 * c);
  return acc;
}
QRT_INLINE __m512i mask4() { return _mm512_set1_epi8(0x0F); }

// Q5_0/Q5_1 high bits: the qh plane holds each row's u32; bit e0 + i of row r goes to byte 4r + i
QRT_INLINE __mmask64 qh_bits(__m512i qh, int e0) {
  const int k = e0 >> 3, s = e0 & 7;
  const __m512i idx = _mm512_set4_epi32((12 + k) * 0x01010101, (8 + k) * 0x01010101, (4 + k) * 0x01010101,
                                        k * 0x01010101);
  const uint32_t bits = (1u << s) | (2u << (s + 8)) | (4u << (s + 16)) | (8u << (s + 24));
  const __m512i pat = _mm512_set1_epi32(int32_t(bits));
  return _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, idx), pat);
}
QRT_INLINE __m512i add16(__m512i u, __mmask64 k) {
  return _mm512_mask_add_epi8(u, k, u, _mm512_set1_epi8(16));
}

// Group block layouts (16 rows; byte offsets into the block's planes p and fields f):
//   Q4_0 p: 4 planes, plane c = qs[4c..4c+3]: low nibbles k = 4c.., high nibbles k = 16 + 4c..
//        f: d[16] f16 @0
//   Q4_1 p: as Q4_0                      f: d @0, m @32
//   Q5_0 p: qh plane @0 (each row's u32: bit k = high bit of element k), 4 qs planes @64
//        f: d @0
//   Q5_1 p: as Q5_0                      f: d @0, m @32
//   Q8_0 p: 8 planes, plane c = qs[4c..4c+3] (k = 4c..)
//        f: d @0
// High nibbles are used in place (16x the code, AND 0xF0) where no fifth bit joins them: their sums are
// exact multiples of 16 and shifted back once per block.
template <int MR, bool asym>
void grp_q4(const uint8_t* p, const uint8_t* f, int64_t nb, const XRow* x, __m512* acc) {
  const __m512i m4 = mask4(), mf0 = _mm512_set1_epi8(static_cast<char>(0xF0));
  for (int64_t b = 0; b < nb; ++b, p += 256, f += asym ? 64 : 32) {
    prefetch(p, 256);
    __m512i lo[4], hi[4];
    QRT_UNROLL
    for (int c = 0; c < 4; ++c) {
      const __m512i v = ld(p + 64 * c);
      lo[c] = _mm512_and_si512(v, m4);
      hi[c] = _mm512_and_si512(v, mf0);
    }
    const __m512 dw = f16x16(f);
    QRT_UNROLL
    for (int m = 0; m < MR; ++m) {
      const int8_t* q = x[m].q + 32 * b;
      const int32_t sx = x[m].s32[b];
      __m512i a = _mm512_set1_epi32(asym ? 0 : -8 * sx);
      __m512i h = dp4(_mm512_setzero_si512(), hi, q + 16);
      a = _mm512_add_epi32(dp4(a, lo, q), _mm512_srai_epi32(h, 4));
      const float dx = x[m].d[b];
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc[m]);
      if constexpr (asym) acc[m] = _mm512_fmadd_ps(f16x16(f + 32), _mm512_set1_ps(dx * float(sx)), acc[m]);
    }
  }
}

template <int MR, bool asym>
void grp_q5(const uint8_t* p, const uint8_t* f, int64_t nb, const XRow* x, __m512* acc) {
  const __m512i m4 = mask4();
  for (int64_t b = 0; b < nb; ++b, p += 320, f += asym ? 64 : 32) {
    prefetch(p, 320);
    const __m512i qh = ld(p);
    __m512i lo[4], hi[4];
    QRT_UNROLL
    for (int c = 0; c < 4; ++c) {
      const __m512i v = ld(p + 64 + 64 * c);
      lo[c] = add16(_mm512_and_si512(v, m4), qh_bits(qh, 4 * c));
      hi[c] = add16(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), qh_bits(qh, 16 + 4 * c));
    }
    const __m512 dw = f16x16(f);
    QRT_UNROLL
    for (int m = 0; m < MR; ++m) {
      const int8_t* q = x[m].q + 32 * b;
      const int32_t sx = x[m].s32[b];
      __m512i a = dp4(dp4(_mm512_set1_epi32(asym ? 0 : -16 * sx), lo, q), hi, q + 16);
      const float dx = x[m].d[b];
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc[m]);
      if constexpr (asym) acc[m] = _mm512_fmadd_ps(f16x16(f + 32), _mm512_set1_ps(dx * float(sx)), acc[m]);
    }
  }
}

// Q8_0: codes are signed; XOR 0x80 makes them unsigned (q + 128) for VPDPBUSD, -128 * sum(x) undoes it
template <int MR>
void grp_q8_0(const uint8_t* p, const uint8_t* f, int64_t nb, const XRow* x, __m512* acc) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < nb; ++b, p += 512, f += 32) {
    prefetch(p, 512);
    __m512i u[8];
    QRT_UNROLL
    for (int c = 0; c < 8; ++c) u[c] = _mm512_xor_si512(ld(p + 64 * c), flip);
    const __m512 dw = f16x16(f);
    QRT_UNROLL
    for (int m = 0; m < MR; ++m) {
      const int8_t* q = x[m].q + 32 * b;
      __m512i a = dp4(_mm512_set1_epi32(-128 * x[m].s32[b]), u, q);
      a = dp4(a, u + 4, q + 16);
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_mul_ps(dw, _mm512_set1_ps(x[m].d[b])), acc[m]);
    }
  }
}

// K-quant group block layouts (16 rows; byte offsets into planes p and fields f), e = 128n + 32s + l:
//   Q2_K p: 16 qs planes; plane 8n + l / 4 holds qs[32n + l], bits 2s give element e
//        f: d @0, dmin @32, scales @64 [16][16] (sc | mn << 4)
//   Q3_K p: 8 hmask planes @0 (plane l / 4, bit 4n + s: the high bit, set: +0, clear: -4),
//           16 qs planes @512 as Q2_K
//        f: d @0, sc @32 [16][16] int8 (minus 32 applied)
//   Q4_K p: 32 qs planes; plane 8j + c holds qs[32j + 4c..]: low nibbles k = 64j + 4c..,
//           high nibbles k = 64j + 32 + 4c..
//        f: d @0, dmin @32, sc @64 [8][16], mn @192 [8][16]
//   Q5_K p: 8 qh planes @0 (plane c, bit 2j, +1 for high nibbles), 32 qs planes @512 as Q4_K
//        f: as Q4_K
//   Q6_K p: 48 planes in the order they are read (a purely sequential stream is 20 % faster here
//           than the canonical order): for (n, h) in (0,0), (0,1), (1,0), (1,1), 12 planes @768(2n + h):
//           ql words 16n + 4h + c, ql words 16n + 8 + 4h + c, qh words 8n + 4h + c (c = 0..3),
//           where ql word w' = ql[4w'..4w'+3] and qh word v = qh[4v..4v+3] = qh[32n + l] for l / 4 = v - 8n
//           (ql low nibbles: s = 0, 1 from the two ql runs; high nibbles: s = 2, 3; qh bits 2s)
//        f: d @0, sc @32 [16][16] int8
// Per sub-block, 16 rows' integer sums are multiplied by their sub-block scales in integers
// (VPDPWSSD where both fit 16 bits, VPMULLD otherwise) and summed over the super-block; the fp32
// scales d * dx and dmin * dx are applied once per super-block.
template <int MR>
void grp_q2_k(const uint8_t* p, const uint8_t* f, int64_t nb, const XRow* x, __m512* acc) {
  const __m512i three = _mm512_set1_epi8(3), m4 = _mm512_set1_epi32(15);
  for (int64_t b = 0; b < nb; ++b, p += 1024, f += 320) {
    prefetch(p, 1024);
    const uint8_t* sc = f + 64;
    __m512i sumi[MR], mins[MR];
    QRT_UNROLL
    for (int m = 0; m < MR; ++m) sumi[m] = mins[m] = _mm512_setzero_si512();
    QRT_UNROLL
    for (int n = 0; n < 2; ++n) {
      QRT_UNROLL
      for (int h = 0; h < 2; ++h) {
        __m512i w[4];
        QRT_UNROLL
        for (int c = 0; c < 4; ++c) w[c] = ld(p + 64 * (8 * n + 4 * h + c));
        QRT_UNROLL
        for (int s = 0; s < 4; ++s) {
          const int t = 8 * n + 2 * s + h;
          __m512i u[4];
          QRT_UNROLL
          for (int c = 0; c < 4; ++c) u[c] = _mm512_and_si512(_mm512_srli_epi16(w[c], 2 * s), three);
          const __m512i sct = _mm512_and_si512(bytes_u32(sc + 16 * t), m4);
          QRT_UNROLL
          for (int m = 0; m < MR; ++m) {
            const __m512i dot = dp4(_mm512_setzero_si512(), u, x[m].q + 256 * b + 16 * t);
            sumi[m] = _mm512_dpwssd_epi32(sumi[m], dot, sct);
          }
        }
      }
    }
    QRT_UNROLL
    for (int t = 0; t < 16; ++t) {
      const __m512i mt = _mm512_srli_epi32(bytes_u32(sc + 16 * t), 4);
      QRT_UNROLL
      for (int m = 0; m < MR; ++m)
        mins[m] = _mm512_dpwssd_epi32(mins[m], mt, _mm512_set1_epi32(x[m].s16[16 * b + t]));
    }
    const __m512 dw = f16x16(f), dm = f16x16(f + 32);
    QRT_UNROLL
    for (int m = 0; m < MR; ++m) {
      const __m512 dx = _mm512_set1_ps(x[m].d[b]);
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[m]), _mm512_mul_ps(dw, dx), acc[m]);
      acc[m] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins[m]), _mm512_mul_ps(dm, dx), acc[m]);
    }
  }
}

template <int MR>
void grp_q3_k(const uint8_t* p, const uint8_t* f, int64_t nb, const XRow* x, __m512* acc) {
  const __m512i three = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4), lo16 = _mm512_set1_epi32(0xFFFF);
  for (int64_t b = 0; b < nb; ++b, p += 1536, f += 288) {
    prefetch(p, 1536);
    __m512i sumi[MR];
    QRT_UNROLL
    for (int m = 0; m < MR; ++m) sumi[m] = _mm512_setzero_si512();
    QRT_UNROLL
    for (int n = 0; n < 2; ++n) {
      QRT_UNROLL
      for (int h = 0; h < 2; ++h) {
        __m512i w[4], hm[4];
        QRT_UNROLL
        for (int c = 0; c < 4; ++c) {
          w[c] = ld(p + 512 + 64 * (8 * n + 4 * h + c));
          hm[c] = ld(p + 64 * (4 * h + c));
        }
        QRT_UNROLL
        for (int s = 0; s < 4; ++s) {
          const int t = 8 * n + 2 * s + h;
          const __m512i bit = _mm512_set1_epi8(static_cast<char>(1 << (4 * n + s)));
          __m512i u[4];
          QRT_UNROLL
          for (int c = 0; c < 4; ++c) {
            u[c] = _mm512_and_si512(_mm512_srli_epi16(w[c], 2 * s), three);
            u[c] = _mm512_mask_add_epi8(u[c], _mm512_test_epi8_mask(hm[c], bit), u[c], four);
          }
          // signed scales, low 16 bits only: VPDPWSSD then multiplies sum by scale and adds 0 * 0
          const __m512i sct = _mm512_and_si512(bytes_i32(f + 32 + 16 * t), lo16);
          QRT_UNROLL
          for (int m = 0; m < MR; ++m) {
            const __m512i init = _mm512_set1_epi32(-4 * x[m].s16[16 * b + t]);
            const __m512i dot = dp4(init, u, x[m].q + 256 * b + 16 * t);
            sumi[m] = _mm512_dpwssd_epi32(sumi[m], dot, sct);
          }
        }
      }
    }
    const __m512 dw = f16x16(f);
    QRT_UNROLL
    for (int m = 0; m < MR; ++m)
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[m]), _mm512_mul_ps(dw, _mm512_set1_ps(x[m].d[b])),
                               acc[m]);
  }
}

// Q4_K and Q5_K share the scale/min handling; `five` adds the qh planes
template <int MR, bool five>
void grp_q45_k(const uint8_t* p, const uint8_t* f, int64_t nb, const XRow* x, __m512* acc) {
  const __m512i m4 = mask4(), mf0 = _mm512_set1_epi8(static_cast<char>(0xF0));
  const int qs = five ? 512 : 0;
  for (int64_t b = 0; b < nb; ++b, p += five ? 2560 : 2048, f += 320) {
    prefetch(p, five ? 2560 : 2048);
    __m512i sum_lo[MR], sum_hi[MR], mins[MR];
    QRT_UNROLL
    for (int m = 0; m < MR; ++m) sum_lo[m] = sum_hi[m] = mins[m] = _mm512_setzero_si512();
    QRT_UNROLL
    for (int j = 0; j < 4; ++j) {
      __m512i lo[8], hi[8];
      QRT_UNROLL
      for (int c = 0; c < 8; ++c) {
        const __m512i v = ld(p + qs + 64 * (8 * j + c));
        if constexpr (five) {
          const __m512i qh = ld(p + 64 * c);
          lo[c] = add16(_mm512_and_si512(v, m4),
                        _mm512_test_epi8_mask(qh, _mm512_set1_epi8(static_cast<char>(1 << (2 * j)))));
          hi[c] = add16(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4),
                        _mm512_test_epi8_mask(qh, _mm512_set1_epi8(static_cast<char>(2 << (2 * j)))));
        } else {
          lo[c] = _mm512_and_si512(v, m4);
          hi[c] = _mm512_and_si512(v, mf0);  // 16x the high nibble
        }
      }
      const __m512i sa = bytes_u32(f + 64 + 16 * (2 * j)), sb = bytes_u32(f + 64 + 16 * (2 * j + 1));
      QRT_UNROLL
      for (int m = 0; m < MR; ++m) {
        const int8_t* q = x[m].q + 256 * b + 64 * j;
        const __m512i da = dp4(dp4(_mm512_setzero_si512(), lo, q), lo + 4, q + 16);
        const __m512i db = dp4(dp4(_mm512_setzero_si512(), hi, q + 32), hi + 4, q + 48);
        sum_lo[m] = _mm512_add_epi32(sum_lo[m], _mm512_mullo_epi32(da, sa));
        sum_hi[m] = _mm512_add_epi32(sum_hi[m], _mm512_mullo_epi32(db, sb));
      }
    }
    QRT_UNROLL
    for (int t = 0; t < 8; ++t) {
      const __m512i mt = bytes_u32(f + 192 + 16 * t);
      QRT_UNROLL
      for (int m = 0; m < MR; ++m)
        mins[m] = _mm512_dpwssd_epi32(mins[m], mt, _mm512_set1_epi32(x[m].s32[8 * b + t]));
    }
    const __m512 dw = f16x16(f), dm = f16x16(f + 32);
    QRT_UNROLL
    for (int m = 0; m < MR; ++m) {
      const __m512i hi_sum = five ? sum_hi[m] : _mm512_srai_epi32(sum_hi[m], 4);
      const __m512i sumi = _mm512_add_epi32(sum_lo[m], hi_sum);
      const __m512 dx = _mm512_set1_ps(x[m].d[b]);
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_mul_ps(dw, dx), acc[m]);
      acc[m] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins[m]), _mm512_mul_ps(dm, dx), acc[m]);
    }
  }
}

template <int MR>
void grp_q6_k(const uint8_t* p, const uint8_t* f, int64_t nb, const XRow* x, __m512* acc) {
  const __m512i m4 = mask4(), m30 = _mm512_set1_epi8(0x30);
  for (int64_t b = 0; b < nb; ++b, p += 3072, f += 288) {
    prefetch(p, 3072);
    __m512i sumi[MR];
    QRT_UNROLL
    for (int m = 0; m < MR; ++m) sumi[m] = _mm512_setzero_si512();
    QRT_UNROLL
    for (int n = 0; n < 2; ++n) {
      QRT_UNROLL
      for (int h = 0; h < 2; ++h) {
        __m512i w1[4], w2[4], qh[4];
        QRT_UNROLL
        for (int c = 0; c < 4; ++c) {
          const uint8_t* run = p + 768 * (2 * n + h);  // the 12 planes this (n, h) reads
          w1[c] = ld(run + 64 * c);
          w2[c] = ld(run + 256 + 64 * c);
          qh[c] = ld(run + 512 + 64 * c);
        }
        QRT_UNROLL
        for (int s = 0; s < 4; ++s) {
          const int t = 8 * n + 2 * s + h;
          __m512i u[4];
          QRT_UNROLL
          for (int c = 0; c < 4; ++c) {
            const __m512i src = s & 1 ? w2[c] : w1[c];
            const __m512i nib = _mm512_and_si512(s < 2 ? src : _mm512_srli_epi16(src, 4), m4);
            // the 2 high bits (bits 2s of qh) moved to bits 4..5
            const __m512i hb = s == 0 ? _mm512_slli_epi16(qh[c], 4)
                               : s == 1 ? _mm512_slli_epi16(qh[c], 2)
                               : s == 2 ? qh[c]
                                        : _mm512_srli_epi16(qh[c], 2);
            u[c] = _mm512_ternarylogic_epi32(nib, hb, m30, 0xF8);  // nib | (hb & 0x30)
          }
          const __m512i sct = bytes_i32(f + 32 + 16 * t);
          QRT_UNROLL
          for (int m = 0; m < MR; ++m) {
            const __m512i init = _mm512_set1_epi32(-32 * x[m].s16[16 * b + t]);
            const __m512i dot = dp4(init, u, x[m].q + 256 * b + 16 * t);
            sumi[m] = _mm512_add_epi32(sumi[m], _mm512_mullo_epi32(dot, sct));
          }
        }
      }
    }
    const __m512 dw = f16x16(f);
    QRT_UNROLL
    for (int m = 0; m < MR; ++m)
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[m]), _mm512_mul_ps(dw, _mm512_set1_ps(x[m].d[b])),
                               acc[m]);
  }
}

// 16 rows of one group (planes p, fields f) against MR activation rows: res[m * 16 + r]
template <int MR>
void group_dot(int32_t t, const uint8_t* p, const uint8_t* f, int64_t nb, const XRow* x, float* res) {
  __m512 acc[MR];
  QRT_UNROLL
  for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_ps();
  switch (t) {
    case Q4_0: grp_q4<MR, false>(p, f, nb, x, acc); break;
    case Q4_1: grp_q4<MR, true>(p, f, nb, x, acc); break;
    case Q5_0: grp_q5<MR, false>(p, f, nb, x, acc); break;
    case Q5_1: grp_q5<MR, true>(p, f, nb, x, acc); break;
    case Q8_0: grp_q8_0<MR>(p, f, nb, x, acc); break;
    case Q2_K: grp_q2_k<MR>(p, f, nb, x, acc); break;
    case Q3_K: grp_q3_k<MR>(p, f, nb, x, acc); break;
    case Q4_K: grp_q45_k<MR, false>(p, f, nb, x, acc); break;
    case Q5_K: grp_q45_k<MR, true>(p, f, nb, x, acc); break;
    default: grp_q6_k<MR>(p, f, nb, x, acc);
  }
  QRT_UNROLL
  for (int m = 0; m < MR; ++m) _mm512_storeu_ps(res + 16 * m, acc[m]);
}

void group_dot_any(int32_t t, const uint8_t* p, const uint8_t* f, int64_t nb, const XRow* x, int mr, float* res) {
  qrt::with_rows4(mr, [&](auto r) { group_dot<decltype(r)::value>(t, p, f, nb, x, res); });
}
#endif  // QRT_GGUF_SIMD

// y[m, n] = v + bias[n], stored in the output dtype
inline void store(void* out, int64_t som, int32_t odt, const void* bias, int32_t bdt, int64_t m, int64_t n,
                  float v) {
  if (bias) v += qrt::load_act(bias, n, bdt);
  qrt::store_out(out, m * som + n, v, odt);
}

// activation rows per pass over a weight group: they stay in L2 while the group's blocks are re-read
inline int64_t m_tile(int64_t K) {
  return std::max<int64_t>(4, (int64_t(256) << 10) / std::max<int64_t>(K, 1) / 4 * 4);
}

// whether row m's activation blocks hold a NaN or Inf (poison_block marked them)
inline bool poisoned(uint8_t* ws, const XLayout& l, int64_t m, int64_t nab) {
  const float* d = x_row(ws, l, m).d;
  for (int64_t i = 0; i < nab; ++i)
    if (std::isnan(d[i])) return true;
  return false;
}

void inf_row(int32_t t, const uint8_t* w, int64_t N, int64_t K, int64_t ngroups, const void* xrow, int64_t sk,
             int32_t xdt, const void* bias, int32_t bdt, void* out, int64_t som, int32_t odt, int64_t m,
             int32_t threads);

}  // namespace

extern "C" {

// Rows per interleaved group in the layout this build runs for `type`: 16 with AVX-512 VNNI, and with
// AVX2 for the types it groups; else 0 (every row canonical: the AVX2 or scalar row code); -1 for an
// unknown type.
int32_t quantrt_gguf_group_rows_of(int32_t type) {
  if (type < 0 || type >= NTYPES) return -1;
#if QRT_GGUF_SIMD
  return int32_t(kGroup);
#elif QRT_GGUF_AVX2
  return grouped(type) ? int32_t(kGroup) : 0;
#else
  return 0;
#endif
}

// Workspace bytes per activation row for weight type `type` and K inputs (-1: unknown type).
int64_t quantrt_gguf_ws_row(int32_t type, int64_t K) {
  if (type < 0 || type >= NTYPES) return -1;
  return x_layout(type, K).row;
}

// y = x @ W^T (+ bias). w: the prepared layout (ngroups groups of 16 rows, then N - 16 * ngroups
// canonical rows); x: M rows of K activations (row stride sxm, element stride sxk, dtype code xdt);
// bias: N values (dtype bdt) or null; out: M rows (row stride som, dtype odt); ws: M *
// quantrt_gguf_ws_row(type, K) bytes. Returns 0, or -1 for bad arguments.
int32_t quantrt_gguf_linear(int32_t type, const uint8_t* w, int64_t N, int64_t K, int64_t ngroups,
                            const void* x, int64_t M, int64_t sxm, int64_t sxk, int32_t xdt,
                            const void* bias, int32_t bdt, void* out, int64_t som, int32_t odt,
                            uint8_t* ws, int32_t threads) {
  if (type < 0 || type >= NTYPES || K % kInfo[type].B || ngroups * kGroup > N || M < 0) return -1;
  if (ngroups && quantrt_gguf_group_rows_of(type) == 0) return -1;
  const Layout L(type, w, K, ngroups);
  const int64_t nb = L.nb, nab = K / (is_k(type) ? 256 : 32);
  const int64_t pbytes = L.pbytes, fbytes = L.fbytes, rbytes = L.rbytes;
  const uint8_t* fields = L.fields;
  const uint8_t* tail = L.tail;
  const int64_t ntail = N - ngroups * kGroup;
  const XLayout xl = x_layout(type, K);
  const int64_t mt = m_tile(K);
  threads = std::max<int32_t>(threads, 1);
  const int64_t chunk = std::max<int64_t>(1, ngroups / (8 * int64_t(threads)));

#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < M * nab; ++i) quantize_x_block(x, sxm, sxk, xdt, type, ws, xl, i / nab, i % nab);

    for (int64_t m0 = 0; m0 < M; m0 += mt) {
      const int64_t m1 = std::min(M, m0 + mt);
#if QRT_GGUF_SIMD || QRT_GGUF_AVX2
      // about 8 chunks of contiguous groups per thread, handed out as threads come free: a thread
      // that other work on the machine delays does not hold the others back (with a static split, a
      // preempted thread cost every call a scheduler time slice). Each row is still computed by one
      // thread, so results do not depend on the thread count.
#pragma omp for schedule(dynamic, chunk) nowait
      for (int64_t gi = 0; gi < ngroups; ++gi) {
        const uint8_t* p = w + gi * pbytes;
        const uint8_t* f = fields + gi * fbytes;
        for (int64_t m = m0; m < m1; m += 4) {
          const int mr = int(std::min<int64_t>(4, m1 - m));
          XRow xr[4];
          for (int i = 0; i < mr; ++i) xr[i] = x_row(ws, xl, m + i);
          alignas(64) float res[4 * kGroup];
          group_dot_any(type, p, f, nb, xr, mr, res);
          for (int i = 0; i < mr; ++i)
            for (int64_t r = 0; r < kGroup; ++r)
              store(out, som, odt, bias, bdt, m + i, gi * kGroup + r, res[i * kGroup + r]);
        }
      }
#endif
#if QRT_GGUF_I8MM
      // weight rows in pairs, an odd last one alone: one SMMLA serves two of them
#pragma omp for schedule(static)
      for (int64_t rp = 0; rp < (ntail + 1) / 2; ++rp) {
        const int64_t r = 2 * rp, n = ngroups * kGroup + r;
        const bool pair = r + 1 < ntail;
        for (int64_t m = m0; m < m1; m += 4) {
          const int mr = int(std::min<int64_t>(4, m1 - m));
          XRow xr[4];
          float v0[4], v1[4];
          for (int i = 0; i < mr; ++i) xr[i] = x_row(ws, xl, m + i);
          // one activation row (decoding) meets each weight row through rows_dot: an SVE CPU's kernel
          if (pair && mr >= 2)
            rows_dot_neon_mm(type, tail + r * rbytes, tail + (r + 1) * rbytes, nb, xr, mr, v0, v1);
          else
            rows_dot(type, tail + r * rbytes, nb, xr, mr, v0);
          if (pair && mr == 1) rows_dot(type, tail + (r + 1) * rbytes, nb, xr, mr, v1);
          for (int i = 0; i < mr; ++i) {
            store(out, som, odt, bias, bdt, m + i, n, v0[i]);
            if (pair) store(out, som, odt, bias, bdt, m + i, n + 1, v1[i]);
          }
        }
      }
#else
#pragma omp for schedule(static)
      for (int64_t r = 0; r < ntail; ++r) {
#if QRT_GGUF_AVX2 || QRT_GGUF_NEON
        for (int64_t m = m0; m < m1; m += 4) {
          const int mr = int(std::min<int64_t>(4, m1 - m));
          XRow xr[4];
          float v[4];
          for (int i = 0; i < mr; ++i) xr[i] = x_row(ws, xl, m + i);
          rows_dot(type, tail + r * rbytes, nb, xr, mr, v);
          for (int i = 0; i < mr; ++i) store(out, som, odt, bias, bdt, m + i, ngroups * kGroup + r, v[i]);
        }
#else
        for (int64_t m = m0; m < m1; ++m) {
          const float v = row_dot_scalar(type, tail + r * rbytes, nb, x_row(ws, xl, m));
          store(out, som, odt, bias, bdt, m, ngroups * kGroup + r, v);
        }
#endif
      }
#endif  // QRT_GGUF_I8MM
    }
  }
  // rows with a NaN or Inf input came out NaN; those with Inf but no NaN get the reference's infinities
  const int64_t esz = xdt == qrt::F32 ? 4 : 2;
  for (int64_t m = 0; m < M; ++m)
    if (poisoned(ws, xl, m, nab))
      inf_row(type, w, N, K, ngroups, static_cast<const uint8_t*>(x) + m * sxm * esz, sxk, xdt, bias, bdt, out, som,
              odt, m, threads);
  return 0;
}

}  // extern "C"

// ---- dequantized rows (the AMX path of backends/cpu/amx.py) -----------------------------------
// Rows [n0, n1) of the dequantized weight, exact: weights only, no activation quantization. A grouped
// row's block is first gathered back from its planes and fields (undoing the transposes and Q6_K's
// plane order) into llama.cpp's canonical block, which decode_legacy / decode_k read (the unpacked
// 6-bit scales of Q3_K/Q4_K/Q5_K are taken as unpacked); tail rows are canonical already. Values are
// computed in the reference's fp32 order (d * q, then + m; d * sc, dmin * mn, then dl * q - ml), with
// no fused multiply-add, then rounded once to odt (fp32, bf16 or fp16).
namespace {

// the scale fields of each type as (bytes, transpose unit), in the layout's order (gguf_native._fields)
struct FieldSpec {
  int n;
  int len[4], unit[4];
};
constexpr FieldSpec kFields[NTYPES] = {
    {1, {2}, {2}},                       // q4_0: d
    {2, {2, 2}, {2, 2}},                 // q4_1: d, m
    {1, {2}, {2}},                       // q5_0: d
    {2, {2, 2}, {2, 2}},                 // q5_1: d, m
    {1, {2}, {2}},                       // q8_0: d
    {3, {2, 2, 16}, {2, 2, 1}},          // q2_k: d, dmin, scales
    {2, {2, 16}, {2, 1}},                // q3_k: d, scales (unpacked, minus 32)
    {4, {2, 2, 8, 8}, {2, 2, 1, 1}},     // q4_k: d, dmin, scales, mins (unpacked)
    {4, {2, 2, 8, 8}, {2, 2, 1, 1}},     // q5_k: as q4_k
    {2, {2, 16}, {2, 1}},                // q6_k: d, scales
};

// the plane holding Q6_K's canonical code word w (the inverse of gguf_native.PLANE_ORDER)
struct Q6Planes {
  int pos[48];
  Q6Planes() {
    int i = 0;
    for (int n = 0; n < 2; ++n)
      for (int h = 0; h < 2; ++h) {
        for (int c = 0; c < 4; ++c) pos[16 * n + 4 * h + c] = i++;
        for (int c = 0; c < 4; ++c) pos[16 * n + 8 + 4 * h + c] = i++;
        for (int c = 0; c < 4; ++c) pos[32 + 8 * n + 4 * h + c] = i++;
      }
  }
};

// row r of a group block (planes p, fields f) as a canonical block `blk` (T bytes), plus the
// unpacked K-quant scales/mins in us (16 + 16 bytes) for the types that store them unpacked
void gather_block(int32_t t, const uint8_t* p, const uint8_t* f, int64_t r, uint8_t* blk, uint8_t* us) {
  static const Q6Planes q6;
  const TypeInfo ti = kInfo[t];
  uint8_t codes[192], flds[24];
  for (int w = 0; w < ti.P / 4; ++w) {
    const int plane = t == Q6_K ? q6.pos[w] : w;
    std::memcpy(codes + 4 * w, p + 64 * plane + 4 * r, 4);
  }
  const FieldSpec& fs = kFields[t];
  int off = 0, fo = 0;
  for (int i = 0; i < fs.n; ++i) {
    const int u = fs.unit[i], L = fs.len[i];
    for (int j = 0; j < L / u; ++j) std::memcpy(flds + fo + j * u, f + off + (j * kGroup + r) * u, u);
    off += L * int(kGroup);
    fo += L;
  }
  std::memset(blk, 0, ti.T);
  switch (t) {
    case Q2_K:  // scales16, qs64, d, dmin
      std::memcpy(blk, flds + 4, 16);
      std::memcpy(blk + 16, codes, 64);
      std::memcpy(blk + 80, flds, 4);
      break;
    case Q3_K:  // hmask32, qs64, scales12 (unpacked separately), d
      std::memcpy(blk, codes, 96);
      std::memcpy(blk + 108, flds, 2);
      std::memcpy(us, flds + 2, 16);
      break;
    case Q4_K:
    case Q5_K:  // d, dmin, scales12 (unpacked separately), [qh32], qs128
      std::memcpy(blk, flds, 4);
      std::memcpy(blk + 16, codes, ti.P);
      std::memcpy(us, flds + 4, 16);
      break;
    case Q6_K:  // ql128, qh64, scales16, d
      std::memcpy(blk, codes, 192);
      std::memcpy(blk + 192, flds + 2, 16);
      std::memcpy(blk + 208, flds, 2);
      break;
    default:  // legacy: d[, m], [qh], qs
      std::memcpy(blk, flds, fo);
      std::memcpy(blk + fo, codes, ti.P);
  }
}

// the block's B values in fp32 as the reference computes them; `us` overrides decode_k's scales
void dequant_block(int32_t t, const uint8_t* blk, const uint8_t* us, float* o) {
  if (!is_k(t)) {
    Legacy l;
    decode_legacy(t, blk, l);
    alignas(64) float prod[32];
    for (int j = 0; j < 32; ++j) prod[j] = l.d * float(l.q[j]);
    if (t == Q4_1 || t == Q5_1) {
      asm volatile("" : : "r"(prod) : "memory");  // d * q rounded on its own: no fused multiply-add
      for (int j = 0; j < 32; ++j) o[j] = prod[j] + l.m;
    } else {
      std::memcpy(o, prod, sizeof(prod));
    }
    return;
  }
  KQuant k;
  decode_k(t, blk, k);
  if (us) {
    if (t == Q3_K) {
      for (int i = 0; i < 16; ++i) k.sc[i] = static_cast<int8_t>(us[i]);
    } else {
      for (int i = 0; i < 8; ++i) {
        k.sc[i] = us[i];
        k.mn[i] = us[8 + i];
      }
    }
  }
  const int len = 256 / k.nsub;
  alignas(64) float dl[16], ml[16], prod[256];
  for (int u = 0; u < k.nsub; ++u) {
    dl[u] = k.d * float(k.sc[u]);
    ml[u] = k.dmin * float(k.mn[u]);
  }
  for (int e = 0; e < 256; ++e) prod[e] = dl[e / len] * float(k.q[e]);
  if (t == Q2_K || t == Q4_K || t == Q5_K) {
    asm volatile("" : : "r"(prod) : "memory");
    for (int e = 0; e < 256; ++e) o[e] = prod[e] - ml[e / len];
  } else {
    std::memcpy(o, prod, sizeof(prod));
  }
}

#if QRT_GGUF_SIMD
// dequant_block's values (the same fp32 products and sums, each rounded on its own), 16 at a time
// with AVX-512, rounded once to odt and stored at out[off + j]
void dequant_block_store(int32_t t, const uint8_t* blk, const uint8_t* us, void* out, int64_t off, int32_t odt) {
  alignas(64) float prod[256];
  if (!is_k(t)) {
    Legacy l;
    decode_legacy(t, blk, l);
    const __m512 dv = _mm512_set1_ps(l.d);
    for (int j = 0; j < 32; j += 16)
      _mm512_store_ps(prod + j, _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_loadu_si512(l.q + j))));
    if (t == Q4_1 || t == Q5_1) {
      asm volatile("" : : "r"(prod) : "memory");  // d * q rounded on its own: no fused multiply-add
      const __m512 mv = _mm512_set1_ps(l.m);
      for (int j = 0; j < 32; j += 16) qrt::store16_rounded(out, odt, off + j, _mm512_add_ps(_mm512_load_ps(prod + j), mv));
    } else {
      for (int j = 0; j < 32; j += 16) qrt::store16_rounded(out, odt, off + j, _mm512_load_ps(prod + j));
    }
    return;
  }
  KQuant k;
  decode_k(t, blk, k);
  if (us) {
    if (t == Q3_K) {
      for (int i = 0; i < 16; ++i) k.sc[i] = static_cast<int8_t>(us[i]);
    } else {
      for (int i = 0; i < 8; ++i) {
        k.sc[i] = us[i];
        k.mn[i] = us[8 + i];
      }
    }
  }
  const int len = 256 / k.nsub;
  alignas(64) float dl[16], ml[16];
  for (int u = 0; u < k.nsub; ++u) {
    dl[u] = k.d * float(k.sc[u]);
    ml[u] = k.dmin * float(k.mn[u]);
  }
  for (int e = 0; e < 256; e += 16)
    _mm512_store_ps(prod + e, _mm512_mul_ps(_mm512_set1_ps(dl[e / len]), _mm512_cvtepi32_ps(_mm512_loadu_si512(k.q + e))));
  if (t == Q2_K || t == Q4_K || t == Q5_K) {
    asm volatile("" : : "r"(prod) : "memory");
    for (int e = 0; e < 256; e += 16)
      qrt::store16_rounded(out, odt, off + e, _mm512_sub_ps(_mm512_load_ps(prod + e), _mm512_set1_ps(ml[e / len])));
  } else {
    for (int e = 0; e < 256; e += 16) qrt::store16_rounded(out, odt, off + e, _mm512_load_ps(prod + e));
  }
}
#endif

// Row m of the output for an activation row holding ±Inf: the reference's fp32 sum is then decided
// by its infinite terms alone (a finite rest cannot change an infinity), so y[m, n] is the IEEE sum
// of w[n, k] * x[k] over the infinite x[k]: ±Inf where they share a sign, NaN where two signs meet or
// a weight is 0, plus the bias as the reference adds it. A row that also holds a NaN keeps its NaN
// outputs. Rare inputs only: one exactly dequantized weight block per (row, block with an Inf).
void inf_row(int32_t t, const uint8_t* w, int64_t N, int64_t K, int64_t ngroups, const void* xrow, int64_t sk,
             int32_t xdt, const void* bias, int32_t bdt, void* out, int64_t som, int32_t odt, int64_t m,
             int32_t threads) {
  std::vector<int64_t> pos;
  for (int64_t k = 0; k < K; ++k) {
    const float v = qrt::load_act(xrow, k * sk, xdt);
    if (std::isnan(v)) return;
    if (std::isinf(v)) pos.push_back(k);
  }
  if (pos.empty()) return;
  const Layout L(t, w, K, ngroups);
#pragma omp parallel for num_threads(std::max<int32_t>(threads, 1)) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    alignas(64) uint8_t blk[256];
    uint8_t us[32];
    alignas(64) float vals[256];
    int64_t have = -1;
    float acc = 0.f;
    for (const int64_t k : pos) {
      const int64_t b = k / L.ti.B;
      if (b != have) {
        const uint8_t* scl;
        const uint8_t* src = L.block(t, n, b, blk, us, &scl);
        dequant_block(t, src, scl, vals);
        have = b;
      }
      acc += vals[k % L.ti.B] * qrt::load_act(xrow, k * sk, xdt);
    }
    store(out, som, odt, bias, bdt, m, n, acc);
  }
}

}  // namespace

extern "C" {

// w, N, K, ngroups as for quantrt_gguf_linear; out[(n - n0) * ldo + k] in dtype odt.
// Returns 0, or -1 for bad arguments.
int32_t quantrt_gguf_dequant_rows(int32_t type, const uint8_t* w, int64_t N, int64_t K, int64_t ngroups,
                                  int64_t n0, int64_t n1, void* out, int32_t odt, int64_t ldo, int32_t threads) {
  if (type < 0 || type >= NTYPES || K % kInfo[type].B || ngroups * kGroup > N) return -1;
  if (n0 < 0 || n1 > N || n0 > n1 || ldo < K || (odt != qrt::F32 && odt != qrt::BF16 && odt != qrt::F16)) return -1;
  const Layout L(type, w, K, ngroups);
  const TypeInfo ti = L.ti;
#pragma omp parallel for num_threads(std::max<int64_t>(1, std::min<int64_t>(threads, n1 - n0))) schedule(static)
  for (int64_t n = n0; n < n1; ++n) {
    alignas(64) uint8_t blk[256];
    uint8_t us[32];
    alignas(64) float vals[256];
    (void)vals;
    for (int64_t b = 0; b < L.nb; ++b) {
      const uint8_t* scl;
      const uint8_t* src = L.block(type, n, b, blk, us, &scl);
#if QRT_GGUF_SIMD
      dequant_block_store(type, src, scl, out, (n - n0) * ldo + b * ti.B, odt);
#else
      dequant_block(type, src, scl, vals);
      for (int j = 0; j < ti.B; ++j) qrt::store_out(out, (n - n0) * ldo + b * ti.B + j, vals[j], odt);
#endif
    }
  }
  return 0;
}

}  // extern "C"

// ---- large batches on AMX tiles (cpu.amx_gguf) ----------------------------------------------------
// Q4_K, Q5_K, Q6_K, Q8_0 and Q4_0, rows in 16-row groups (N a multiple of 16). For a block of 4 groups
// (64 output rows) and a K chunk of 2048, the group planes are decoded straight into a bf16 panel in
// AMX's B-tile layout (qrt::amx_block: pair (k, k+1) of 16 rows per 64-byte row), each weight computed
// in fp32 as the type's dequantizer does (d * sc * q - dmin * m, d * q ...) and rounded once to bf16
// (what the dequant + oneDNN path multiplied), then every 16 rows of x (bf16) run over the panel on
// AMX tiles: no per-group fold, the scales are in the panel. A plane (16 rows x 4 code bytes) becomes
// panel rows by its bytes 0-1 and 2-3 (and, for 4-bit codes, its low and high nibbles).
namespace {
#if defined(QRT_AMX) && QRT_GGUF_SIMD
constexpr int kTileGroups = 4;          // groups per block: 64 output rows, the panel's 4 tiles
constexpr int64_t kTileChunk = 2048;    // K per panel: 8 super-blocks, 256 KiB of bf16 (stays in L2)

// The pieces every type's panel decoder shares. A panel row is 16 rows x a pair of k, as 32 bf16
// words (row r at words 2r, 2r + 1); per-row fp32 values (scales) are duplicated into that layout as
// two halves, rows 0-7 and 8-15.
struct PairVec {
  __m512 lo, hi;
};
QRT_INLINE PairVec pair_dup(__m512 v) {
  const __m512i lo = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  return {_mm512_permutexvar_ps(lo, v), _mm512_permutexvar_ps(_mm512_add_epi32(lo, _mm512_set1_epi32(8)), v)};
}
// bytes 2h, 2h + 1 of every row's 4 plane bytes, as 32 16-bit words (zero- or sign-extended)
template <bool sign>
QRT_INLINE __m512i pair_bytes(__m512i v, int h) {
  const __m256i b = _mm512_cvtepi32_epi16(h ? _mm512_srli_epi32(v, 16) : v);
  return sign ? _mm512_cvtepi8_epi16(b) : _mm512_cvtepu8_epi16(b);
}
// 32 16-bit codes minus `off`, as fp32 halves (rows 0-7, rows 8-15)
template <bool sign>
QRT_INLINE PairVec pair_f32(__m512i q, int32_t off) {
  const __m256i a = _mm512_castsi512_si256(q), b = _mm512_extracti64x4_epi64(q, 1);
  const __m512i o = _mm512_set1_epi32(off);
  const __m512i ia = sign ? _mm512_cvtepi16_epi32(a) : _mm512_cvtepu16_epi32(a);
  const __m512i ib = sign ? _mm512_cvtepi16_epi32(b) : _mm512_cvtepu16_epi32(b);
  return {_mm512_cvtepi32_ps(_mm512_sub_epi32(ia, o)), _mm512_cvtepi32_ps(_mm512_sub_epi32(ib, o))};
}
// panel row `pair` of group slot g <- the weights (rounded once to bf16)
QRT_INLINE void store_pair(uint16_t* panel, int64_t pair, int g, PairVec w) {
  _mm512_store_si512(panel + (pair * kTileGroups + g) * 32, (__m512i)_mm512_cvtne2ps_pbh(w.hi, w.lo));
}
QRT_INLINE PairVec mul(PairVec q, PairVec s) { return {_mm512_mul_ps(q.lo, s.lo), _mm512_mul_ps(q.hi, s.hi)}; }

// Q4_K and Q5_K (five: the 8 qh planes first, bit 2j of qh byte l the fifth bit of the low nibble of
// code byte l of chunk j, bit 2j + 1 that of its high nibble): w = d * sc * q - dmin * m
template <bool five>
void qk45_panel(const uint8_t* p, const uint8_t* f, int64_t nsb, int g, uint16_t* panel) {
  const __m512i m4 = _mm512_set1_epi16(0x0F), one = _mm512_set1_epi16(1);
  const int qs = five ? 512 : 0;
  for (int64_t sb = 0; sb < nsb; ++sb, p += five ? 2560 : 2048, f += 320) {
    const __m512 d = f16x16(f), dmin = f16x16(f + 32);
    QRT_UNROLL
    for (int s = 0; s < 8; ++s) {  // sub-block s: chunk j = s / 2, low (even s) or high (odd s) nibbles
      const int j = s >> 1, hi = s & 1;
      const PairVec a = pair_dup(_mm512_mul_ps(d, _mm512_cvtepi32_ps(bytes_u32(f + 64 + 16 * s))));
      const PairVec b = pair_dup(_mm512_mul_ps(dmin, _mm512_cvtepi32_ps(bytes_u32(f + 192 + 16 * s))));
      QRT_UNROLL
      for (int c = 0; c < 8; ++c) {
        const __m512i v = ld(p + qs + 64 * (8 * j + c));
        QRT_UNROLL
        for (int h = 0; h < 2; ++h) {  // code bytes 2h, 2h + 1 of every row: one pair of k
          const __m512i u = pair_bytes<false>(v, h);
          __m512i q = hi ? _mm512_and_si512(_mm512_srli_epi16(u, 4), m4) : _mm512_and_si512(u, m4);
          if constexpr (five) {
            const __m512i w = pair_bytes<false>(ld(p + 64 * c), h);
            const __m512i bit = _mm512_and_si512(_mm512_srl_epi16(w, _mm_cvtsi32_si128(s)), one);
            q = _mm512_or_si512(q, _mm512_slli_epi16(bit, 4));
          }
          const PairVec qf = pair_f32<false>(q, 0);
          store_pair(panel, sb * 128 + 32 * j + 16 * hi + 2 * c + h, g,
                     {_mm512_fmsub_ps(qf.lo, a.lo, b.lo), _mm512_fmsub_ps(qf.hi, a.hi, b.hi)});
        }
      }
    }
  }
}

// Q8_0: 8 planes per block (plane c: codes k = 4c..4c+3, int8), d per block: w = d * q
void q80_panel(const uint8_t* p, const uint8_t* f, int64_t nblocks, int g, uint16_t* panel) {
  for (int64_t b = 0; b < nblocks; ++b, p += 512, f += 32) {
    const PairVec d = pair_dup(f16x16(f));
    QRT_UNROLL
    for (int c = 0; c < 8; ++c) {
      const __m512i v = ld(p + 64 * c);
      QRT_UNROLL
      for (int h = 0; h < 2; ++h) store_pair(panel, b * 16 + 2 * c + h, g, mul(pair_f32<true>(pair_bytes<true>(v, h), 0), d));
    }
  }
}

// Q4_0: 4 planes per block (plane c: bytes 4c..4c+3, low nibbles k = 4c.., high k = 16 + 4c..), d per
// block: w = d * (q - 8)
void q40_panel(const uint8_t* p, const uint8_t* f, int64_t nblocks, int g, uint16_t* panel) {
  const __m512i m4 = _mm512_set1_epi16(0x0F);
  for (int64_t b = 0; b < nblocks; ++b, p += 256, f += 32) {
    const PairVec d = pair_dup(f16x16(f));
    QRT_UNROLL
    for (int c = 0; c < 4; ++c) {
      const __m512i v = ld(p + 64 * c);
      QRT_UNROLL
      for (int h = 0; h < 2; ++h) {
        const __m512i u = pair_bytes<false>(v, h);
        QRT_UNROLL
        for (int hi = 0; hi < 2; ++hi) {
          const __m512i q = hi ? _mm512_and_si512(_mm512_srli_epi16(u, 4), m4) : _mm512_and_si512(u, m4);
          store_pair(panel, b * 16 + 8 * hi + 2 * c + h, g, mul(pair_f32<false>(q, 8), d));
        }
      }
    }
  }
}

// Q6_K: per super-block 48 planes in gguf_native.PLANE_ORDER (per half n and h: 4 planes of ql words
// 16n + 4h + c, 4 of ql words 16n + 8 + 4h + c, 4 of qh words 8n + 4h + c), then d and 16 signed
// sub-block scales: code byte i of plane c in sub-block t = 8n + 2s + h is k = 16t + 4c + i (the
// reading order of grp_q6_k), w = d * sc[t] * (q - 32)
void q6k_panel(const uint8_t* p, const uint8_t* f, int64_t nblocks, int g, uint16_t* panel) {
  const __m512i m4 = mask4(), m30 = _mm512_set1_epi8(0x30);
  for (int64_t sb = 0; sb < nblocks; ++sb, p += 3072, f += 288) {
    const __m512 d = f16x16(f);
    QRT_UNROLL
    for (int n = 0; n < 2; ++n) {
      QRT_UNROLL
      for (int h = 0; h < 2; ++h) {
        const uint8_t* run = p + 768 * (2 * n + h);
        QRT_UNROLL
        for (int s = 0; s < 4; ++s) {
          const int t = 8 * n + 2 * s + h;
          const PairVec a = pair_dup(_mm512_mul_ps(d, _mm512_cvtepi32_ps(bytes_i32(f + 32 + 16 * t))));
          QRT_UNROLL
          for (int c = 0; c < 4; ++c) {
            const __m512i src = ld(run + (s & 1 ? 256 : 0) + 64 * c), qh = ld(run + 512 + 64 * c);
            const __m512i nib = _mm512_and_si512(s < 2 ? src : _mm512_srli_epi16(src, 4), m4);
            const __m512i hb = s == 0 ? _mm512_slli_epi16(qh, 4)
                               : s == 1 ? _mm512_slli_epi16(qh, 2)
                               : s == 2 ? qh
                                        : _mm512_srli_epi16(qh, 2);
            const __m512i u = _mm512_ternarylogic_epi32(nib, hb, m30, 0xF8);  // nib | (hb & 0x30)
            QRT_UNROLL
            for (int e = 0; e < 2; ++e)
              store_pair(panel, sb * 128 + 8 * t + 2 * c + e, g, mul(pair_f32<false>(pair_bytes<false>(u, e), 32), a));
          }
        }
      }
    }
  }
}

// the panel of `nblocks` blocks of one group (its planes p and fields f at the chunk's first block)
void type_panel(int32_t type, const uint8_t* p, const uint8_t* f, int64_t nblocks, int g, uint16_t* panel) {
  switch (type) {
    case Q4_K: qk45_panel<false>(p, f, nblocks, g, panel); break;
    case Q5_K: qk45_panel<true>(p, f, nblocks, g, panel); break;
    case Q8_0: q80_panel(p, f, nblocks, g, panel); break;
    case Q6_K: q6k_panel(p, f, nblocks, g, panel); break;
    default: q40_panel(p, f, nblocks, g, panel);
  }
}
#endif
}  // namespace

extern "C" {

// 1 when this build can run quantrt_gguf_linear_tiles (AMX tiles compiled and granted, AVX-512 VNNI)
int32_t quantrt_gguf_tiles_ready() {
#if defined(QRT_AMX) && QRT_GGUF_SIMD
  return qrt::amx_permitted() ? 1 : 0;
#else
  return 0;
#endif
}

// y = x @ W^T (+ bias) on AMX tiles for a Q4_K, Q5_K, Q6_K, Q8_0 or Q4_0 weight whose rows are all grouped
// (N = 16 * ngroups):
// x bf16 [M, K] with row stride ldx (elements), out (row stride som, dtype odt). Returns 0, -1 for
// bad arguments, -2 when this build or weight cannot take this path, -3 when out of memory.
int32_t quantrt_gguf_linear_tiles(int32_t type, const uint8_t* w, int64_t N, int64_t K, int64_t ngroups,
                                  const uint16_t* x, int64_t M, int64_t ldx, const void* bias, int32_t bdt,
                                  void* out, int64_t som, int32_t odt, int32_t threads) {
#if defined(QRT_AMX) && QRT_GGUF_SIMD
  if (type != Q4_K && type != Q5_K && type != Q6_K && type != Q8_0 && type != Q4_0) return -2;
  const TypeInfo ti = kInfo[type];
  if (ngroups * kGroup != N || K % ti.B || ldx < K || M < 0) return -1;
  if (!qrt::amx_permitted()) return -2;
  if (M == 0) return 0;
  const int64_t nb = K / ti.B, pbytes = nb * kGroup * ti.P, fbytes = nb * kGroup * ti.F;
  const uint8_t* fields = w + ngroups * pbytes;
  const int64_t nblk = (ngroups + kTileGroups - 1) / kTileGroups;
  constexpr int64_t W = kTileGroups * kGroup;  // output rows per block
  int failed = 0;
#pragma omp parallel num_threads(std::max<int64_t>(1, std::min<int64_t>(threads, nblk))) reduction(| : failed)
  {
    uint16_t* panel = static_cast<uint16_t*>(std::aligned_alloc(64, sizeof(uint16_t) * kTileChunk * W));
    float* C = static_cast<float*>(std::aligned_alloc(64, sizeof(float) * W * ((M + 15) / 16 * 16)));
    alignas(64) float stage[16 * W];
    int rows_configured = 0;
    if (!panel || !C) failed = 1;
#pragma omp for schedule(dynamic, 1)
    for (int64_t blk = 0; blk < nblk; ++blk) {
      if (failed) continue;
      const int64_t g0 = blk * kTileGroups;
      const int ntv = int(std::min<int64_t>(kTileGroups, ngroups - g0));
      std::memset(C, 0, sizeof(float) * W * M);
      for (int64_t k0 = 0; k0 < K; k0 += kTileChunk) {
        const int64_t k1 = std::min(K, k0 + kTileChunk), b0 = k0 / ti.B;
        for (int g = 0; g < kTileGroups; ++g) {  // a missing group repeats the last: its columns are not stored
          const int64_t gi = g0 + std::min(g, ntv - 1);
          type_panel(type, w + gi * pbytes + b0 * kGroup * ti.P, fields + gi * fbytes + b0 * kGroup * ti.F,
                     (k1 - k0) / ti.B, g, panel);
        }
        for (int64_t m0 = 0; m0 < M; m0 += 16) {
          const int rm = int(std::min<int64_t>(16, M - m0));
          if (rm != rows_configured) qrt::amx_configure(rows_configured = rm);
          qrt::amx_block<1, 1>(panel, (k1 - k0) / 2, x + m0 * ldx + k0, ldx, 0, stage);
          for (int i = 0; i < rm; ++i)
            for (int n = 0; n < W; n += 16) {
              float* c = C + (m0 + i) * W + n;
              _mm512_store_ps(c, _mm512_add_ps(_mm512_load_ps(c), _mm512_load_ps(stage + i * W + n)));
            }
        }
      }
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < int64_t(ntv) * kGroup; ++n) store(out, som, odt, bias, bdt, m, g0 * kGroup + n, C[m * W + n]);
    }
    if (rows_configured) _tile_release();
    std::free(panel);
    std::free(C);
  }
  return failed ? -3 : 0;
#else
  (void)type, (void)w, (void)N, (void)K, (void)ngroups, (void)x, (void)M, (void)ldx, (void)bias, (void)bdt;
  (void)out, (void)som, (void)odt, (void)threads;
  return -2;
#endif
}

}  // extern "C"
