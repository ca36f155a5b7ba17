// Decode attention over a paged TurboQuant cache with 4-bit rotated keys and 4-bit values
// (kv-tq-4bit-nc), one query token per sequence, for NVIDIA sm_80+ (mma.sync, movmatrix).
//
// Program (KV head h, split sp, sequence b), four warps. Each warp walks its own 16-token steps
// of the split (steps w, w + 4, ...) with its own online softmax, so the token loop has no barrier
// and no exchange between warps; the warps merge once at the end through shared memory. A step:
//
//   scores  S[16 tokens x 8 heads] = K[16 x D] . Q^T[D x 8]        (D/16 mma m16n8k16)
//   values  O^T[D x 8 heads]      += V^T[D x 16 tokens] . P'[16 x 8] (D/16 mma, P' = p * value scale)
//
// Keys are the A operand: a thread decodes the codes of its own two tokens (g, g + 8) and its own
// quarter of the channels straight into A fragments. The score is a sum over channels, so which
// physical channel a fragment column stands for is free as long as q's B fragment (built once,
// per thread, from the same channels) agrees: a thread's slice is D/4 contiguous channels, one
// wide load per token. Centroids come from byte tables by prmt (symmetric code book: eight
// magnitudes, the sign ORed in), eight codes per 32-bit word.
//
// Values are the A operand of the transposed product: a fragment pairs two tokens of one channel,
// so a thread loads its D/8 channels of four tokens (2t, 2t+1, 2t+8, 2t+9) and gathers byte j of
// two tokens with one prmt; each nibble masked in place is an fp16 subnormal, code * 2^-24 (low
// nibble) or code * 2^-20 (high nibble), exact, and the accumulators are scaled back at the end.
// Output rows of a fragment map to physical channels the same way (row g: low nibble, row g + 8:
// high nibble), so no channel order is imposed on the cache. P' comes from the score accumulators
// by one movmatrix per 8 tokens. Per-token factors (key norm, value scale and zero) ride along;
// the zero-point term is a per-thread sum of p * zero.
//
// Loads run two steps ahead of the math: a thread's codes go straight to its slots of a three-stage
// ring in shared memory (cp.async, no registers held), its per-token scalars to one of two register
// sets (the loop unrolled by two; one scalar per register, never packed), and the block table
// entry a fetch needs is read two steps before that fetch, into the same set (clamped only when
// used). q is rotated in registers: the butterflies within a thread's quarter of a head, then
// across the four lanes that hold that head (shuffles), no barrier.
//
// Out: DIRECT, the normalised rows; else per split the max (log2 units), the sum of p and the
// unnormalised rows, the layout backends/triton/kv.py's combine merges.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace tqkv {

typedef unsigned int u32;
typedef long long i64;

constexpr float LOG2E = 1.4426950408889634f;
constexpr int WARPS = 4;
constexpr int MAX_G = 8;
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 c) {
  u32 d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

template <int LUT>
__device__ __forceinline__ u32 lop3(u32 a, u32 b, u32 c) {
  u32 d;
  asm("lop3.b32 %0, %1, %2, %3, %4;" : "=r"(d) : "r"(a), "r"(b), "r"(c), "n"(LUT));
  return d;
}

__device__ __forceinline__ void mma(float c[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 transpose8x8(u32 x) {
  u32 d;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(x));
  return d;
}

// 2^x in one instruction (the special-function unit; exact enough for softmax weights, as
// FlashAttention uses it), 0 for -inf
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// A value the compiler must keep rather than recompute inside the loop (it rematerialises
// loop-invariant address arithmetic under register pressure, in every step)
template <typename T>
__device__ __forceinline__ T kept(T x) {
  static_assert(sizeof(T) == 8, "64-bit values");
  asm volatile("" : "+l"(x));
  return x;
}

__device__ __forceinline__ u32 half2_bits(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<u32*>(&h);
}

// The fp16 in the low half of a 32-bit register (a 16-bit load's result, kept unpacked: two
// scalars merged into one register would cost a prmt per step and wait for both loads)
__device__ __forceinline__ float half_bits(u32 x) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(x)));
}

// The centroids of the eight codes of one 32-bit word (channels 0..7 of it, code k in bits 4k..)
// as four fp16 pairs: (0, 1), (2, 3), (4, 5), (6, 7). Tables: the low and high bytes of the
// magnitudes c[8..15], four per register. Code i >= 8 is c[8 + (i & 7)], code i < 8 is
// -c[8 + (~i & 7)]: f is 7 in the nibbles of codes >= 8 (their top bits times 7/8, the high word
// of a product), lop3 0x82 is (a ^ ~b) & c, 0xF2 is a | (~b & c).
__device__ __forceinline__ void key8(u32 r, u32 l0, u32 l1, u32 h0, u32 h1, u32 out[4]) {
  const u32 f = __umulhi(r & 0x88888888u, 0xE0000000u);
  const u32 i = lop3<0x82>(r, f, 0x77777777u);
  const u32 t = r << 4;
  const u32 ma = prmt(t, r, 0xD9C8u);  // byte k: the sign of code k replicated (codes 0..3)
  const u32 mb = prmt(t, r, 0xFBEAu);  // codes 4..7
  const u32 ib = i >> 16;
  const u32 la = prmt(l0, l1, i);
  const u32 lb = prmt(l0, l1, ib);
  const u32 ha = lop3<0xF2>(prmt(h0, h1, i), ma, 0x80808080u);
  const u32 hb = lop3<0xF2>(prmt(h0, h1, ib), mb, 0x80808080u);
  out[0] = prmt(la, ha, 0x5140u);
  out[1] = prmt(la, ha, 0x7362u);
  out[2] = prmt(lb, hb, 0x5140u);
  out[3] = prmt(lb, hb, 0x7362u);
}

// Byte j of two tokens' value words (a: token 2t, b: token 2t + 1) as two fp16 pairs, the low
// nibbles and the high nibbles of the byte: each masked nibble is an fp16 subnormal, code * 2^-24
// and code * 2^-20, exact.
__device__ __forceinline__ void value2(u32 a, u32 b, int j, u32 out[2]) {
  const u32 x = prmt(a, b, j | (j << 4) | ((4 + j) << 8) | ((4 + j) << 12));
  out[0] = x & 0x000F000Fu;
  out[1] = x & 0x00F000F0u;
}

template <bool C, typename A, typename B>
struct Pick {
  typedef A type;
};
template <typename A, typename B>
struct Pick<false, A, B> {
  typedef B type;
};

template <int N>
struct Words {
  u32 w[N];
};

// A pair of activations (one 32-bit word) times a pair of signs, as floats.
template <bool BF16>
__device__ __forceinline__ void act2(u32 w, float s0, float s1, float& x0, float& x1) {
  if constexpr (BF16) {
    x0 = __uint_as_float(w << 16) * s0;
    x1 = __uint_as_float(w & 0xFFFF0000u) * s1;
  } else {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w));
    x0 = f.x * s0;
    x1 = f.y * s1;
  }
}

template <bool BF16>
__device__ __forceinline__ void store_act(void* p, i64 i, float x) {
  if constexpr (BF16) {
    reinterpret_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(x);
  } else {
    reinterpret_cast<__half*>(p)[i] = __float2half(x);
  }
}

// One step's data for one thread: its codes (read from the ring) and per-token scalars.
template <int D>
struct Step {
  Words<D / 32> k[2];  // tokens g, g + 8: this thread's D/4 key channels
  Words<D / 64> v[4];  // tokens 2t, 2t + 1, 2t + 8, 2t + 9: this thread's D/8 value channels
  u32 kn[2], vs[2], vz[2];  // tokens g, g + 8
};

// The per-token scalars of a step, loaded STEPS_AHEAD steps before their use, and (PAGED) the page
// of the step this set fetches next, read from the block table a further STEPS_AHEAD steps ahead:
// the fetch's addresses then wait for no load.
struct Scalars {
  u32 kn[2], vs[2], vz[2];
  int page;
};

// Copy N 32-bit words from global to shared memory without passing through registers
// (cp.async; 16-byte pieces bypass L1, as a streamed cache is read once).
template <int N>
__device__ __forceinline__ void copy_words(unsigned dst, const unsigned char* src) {
  if constexpr (N == 1) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
  } else if constexpr (N == 2) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(src) : "memory");
  } else {
#pragma unroll
    for (int j = 0; j < N / 4; ++j) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + 16 * j), "l"(src + 16 * j) : "memory");
    }
  }
}

__device__ __forceinline__ void copies_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void copies_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

template <int N>
__device__ __forceinline__ Words<N> shared_words(const u32* p) {
  Words<N> r;
  if constexpr (N == 1) {
    r.w[0] = p[0];
  } else if constexpr (N == 2) {
    const uint2 x = *reinterpret_cast<const uint2*>(p);
    r.w[0] = x.x;
    r.w[1] = x.y;
  } else {
#pragma unroll
    for (int j = 0; j < N / 4; ++j) {
      const uint4 x = reinterpret_cast<const uint4*>(p)[j];
      r.w[4 * j] = x.x;
      r.w[4 * j + 1] = x.y;
      r.w[4 * j + 2] = x.z;
      r.w[4 * j + 3] = x.w;
    }
  }
  return r;
}

// Steps a warp's loads run ahead of its math: codes through a ring of STEPS_AHEAD + 1 stages in
// shared memory (cp.async: no registers held), scalars in registers (two sets, the loop unrolled
// by two so none is moved: a move would wait for its load). The ring's size is the launch's
// dynamic shared memory, kv_mma.shared_bytes.
constexpr int STEPS_AHEAD = 2;
constexpr int STAGES = STEPS_AHEAD + 1;
static_assert(STEPS_AHEAD == 2, "the scalars' two register sets and the loop unrolled by two");


}  // namespace tqkv

using namespace tqkv;

// Arguments are 8 bytes each (quantrt's launcher packs int64): floats travel as fp32 bits.
template <int D, bool QBF16, bool BT64, bool PAGED>
__global__ void __launch_bounds__(128, D <= 128 ? 4 : 2) tq4_decode(
    const void* q, const float* signs, const unsigned char* kp, const unsigned short* kn,
    const unsigned char* vp, const unsigned short* vs, const unsigned short* vz, const void* bt,
    const int* lens, float* pm, float* pl, float* po, void* out, i64 key_lo, i64 key_hi,
    i64 q_scale_bits, i64 cap_in_bits, i64 cap_out_bits, i64 sq_b, i64 sq_h, i64 skp_slot,
    i64 skp_h, i64 sn_slot, i64 sn_h, i64 svp_slot, i64 svp_h,
    i64 sbt_b, i64 sbt_t, i64 slen, i64 sp_b, i64 sp_h, i64 so_b, i64 so_h, i64 G_, i64 BS_,
    i64 log2_bs, i64 max_len, i64 window, i64 direct) {
  constexpr int KR = D / 32;  // key words per token per thread
  constexpr int VR = D / 64;  // value words per token per thread
  constexpr int KSTEPS = D / 16;
  const int h = blockIdx.x, sp = blockIdx.y, b = blockIdx.z, S = gridDim.y;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int G = static_cast<int>(G_), BS = static_cast<int>(BS_);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  // the warps' rings (dynamic: kv_mma.shared_bytes); after the token loop the same space holds each
  // warp's rows, lane-minor (a thread's stores hit 32 banks), one float of padding per row so the
  // merge's reads (16 channels of a head from two lanes) spread over the banks
  extern __shared__ __align__(16) u32 ring[];
  auto part = reinterpret_cast<float (*)[D / 4][33]>(ring);
  __shared__ float wm[WARPS][MAX_G], wl[WARPS][MAX_G];

  // q of head g, this thread's quarter of the channels (16-byte loads: the host aligns q), times
  // the signs: every load issued at once (the rotation below waits for them, after the first
  // steps' loads are out)
  constexpr int Q = D / 4;
  float x[Q];
  {
    const i64 row = b * sq_b + (static_cast<i64>(h) * G + g) * sq_h + t * Q;
    const uint4* qv = reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(q) + row);
    const float4* sg = reinterpret_cast<const float4*>(signs + t * Q);
#pragma unroll
    for (int i = 0; i < Q / 8; ++i) {
      const uint4 w = g < G ? __ldg(qv + i) : make_uint4(0u, 0u, 0u, 0u);
      const float4 sa = __ldg(sg + 2 * i), sb = __ldg(sg + 2 * i + 1);
      act2<QBF16>(w.x, sa.x, sa.y, x[8 * i], x[8 * i + 1]);
      act2<QBF16>(w.y, sa.z, sa.w, x[8 * i + 2], x[8 * i + 3]);
      act2<QBF16>(w.z, sb.x, sb.y, x[8 * i + 4], x[8 * i + 5]);
      act2<QBF16>(w.w, sb.z, sb.w, x[8 * i + 6], x[8 * i + 7]);
    }
  }
  const int pos = lens[b * slen] - 1;
  const i64 bt_row = b * sbt_b;
  // a block's page as stored (negative: none); clamped where it is used, not here, so that a
  // look-up made steps ahead is not waited for at once
  auto page_of = [&](int blk) -> int {
    const i64 e = static_cast<i64>(blk) * sbt_t + bt_row;
    return BT64 ? static_cast<int>(reinterpret_cast<const long long*>(bt)[e]) : reinterpret_cast<const int*>(bt)[e];
  };
  const int lg = static_cast<int>(log2_bs);
  // this split's tokens [first, last) of a sequence whose window is counted back from ``length``
  // and whose cache holds ``held`` of its tokens
  auto split_of = [&](int length, int held, int& first, int& last) {
    const int from = window > 0 ? max(length - static_cast<int>(window), 0) : 0;
    const int t0 = (from / 16) * 16;
    const int per = (((max(held - t0, 0) + 15) / 16 + S - 1) / S) * 16;
    first = t0 + sp * per;
    last = min(first + per, held);
  };
  // PAGED: the pages of this warp's first 2 STEPS_AHEAD steps (the ring's and the register sets'
  // next), looked up while the length is still on its way as if the sequence were max_len long (in
  // eager decode at batch 1 it is), and again once it is known if not
  int pages[2 * STEPS_AHEAD] = {};
  auto look_up = [&](int first, int last) {
#pragma unroll
    for (int i = 0; i < 2 * STEPS_AHEAD; ++i) {
      const int n = first + warp * 16 + i * 16 * WARPS;
      pages[i] = n < last ? page_of(n >> lg) : 0;
    }
  };
  int guess_start = 0, guess_end = 0;
  if constexpr (PAGED) {
    split_of(static_cast<int>(max_len), static_cast<int>(max_len), guess_start, guess_end);
    look_up(guess_start, guess_end);
  }
  const int L = min(pos + 1, static_cast<int>(max_len));
  const int lo = window > 0 ? max(pos + 1 - static_cast<int>(window), 0) : 0;
  int start, end;
  split_of(pos + 1, L, start, end);
  if constexpr (PAGED) {
    if (start != guess_start || end != guess_end) look_up(start, end);
  }

  const u32 l0 = static_cast<u32>(key_lo), l1 = static_cast<u32>(key_lo >> 32);
  const u32 h0 = static_cast<u32>(key_hi), h1 = static_cast<u32>(key_hi >> 32);
  const bool capped = cap_in_bits != 0;
  const float cap_in = __int_as_float(static_cast<int>(cap_in_bits));
  const float cap_out = __int_as_float(static_cast<int>(cap_out_bits));
  const float logit_mult = capped ? 1.f : LOG2E;
  // this thread's rows at slot 0: key codes and per-token scalars of token g, value codes of
  // token 2t (the scalar planes share one layout: their offsets from the key norms are fixed)
  typedef unsigned long long u64;
  const unsigned ksl = static_cast<unsigned>(skp_slot), vsl = static_cast<unsigned>(svp_slot);
  const unsigned ssl = static_cast<unsigned>(sn_slot);
  const unsigned char* pk = kept(kp + h * skp_h + t * (D / 8) + static_cast<u64>(g) * ksl);
  const unsigned char* pv = kept(vp + h * svp_h + g * (D / 16) + static_cast<u64>(2 * t) * vsl);
  const unsigned short* pn = kept(kn + h * sn_h + static_cast<u64>(g) * ssl);
  const i64 dvs = kept(vs - kn), dvz = kept(vz - kn);
  // this warp's ring; a stage holds, lane-minor, each lane's key rows (tokens g, g + 8) then its
  // value rows (2t, 2t + 1, 2t + 8, 2t + 9), so the lanes' reads and copies are contiguous
  constexpr int STAGE_WORDS = 32 * (2 * KR + 4 * VR);
  const unsigned ring0 = static_cast<unsigned>(__cvta_generic_to_shared(ring + warp * STAGES * STAGE_WORDS));
  auto key_at = [&](int stage, int j) { return stage * STAGE_WORDS + (j * 32 + lane) * KR; };
  auto value_at = [&](int stage, int j) { return stage * STAGE_WORDS + 64 * KR + (j * 32 + lane) * VR; };

  // The step at n0: this thread's codes copied into ring stage ``stage`` (keys of g and g + 8,
  // values of 2t, 2t + 1, 2t + 8, 2t + 9) and its scalars (g, g + 8) loaded into ``sc``. PAGED: a
  // page holds whole 16-token steps, its slots consecutive, so one lookup gives every row (the
  // slot of token n0 + i is base + i); else each token is looked up, those past the sequence
  // reading its last. ``page``: the step's page (PAGED).
  auto fetch = [&](int n0, int stage, Scalars& sc, int page) {
    // rows from this thread's row pointers (pk, pn: token g; pv: token 2t); PAGED: 32-bit offsets
    // (planes_fit bounds every slot's), else 64-bit (a row pointer's offset may be negative)
    typename Pick<PAGED, unsigned, u64>::type rk[2], rv[4];
    if constexpr (PAGED) {
      const unsigned base = (static_cast<unsigned>(max(page, 0)) << lg) + (n0 & ((1 << lg) - 1));
      rk[0] = base;
      rk[1] = base + 8;
      rv[0] = base;
      rv[1] = base + 1;
      rv[2] = base + 8;
      rv[3] = base + 9;
    } else {
      const int tok[6] = {g, g + 8, 2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9};
      u64 slot[6];
#pragma unroll
      for (int j = 0; j < 6; ++j) {
        const int n = min(n0 + tok[j], L - 1);
        slot[j] = static_cast<unsigned>(max(page_of(n / BS), 0) * BS + n % BS);
      }
      rk[0] = slot[0] - g;
      rk[1] = slot[1] - g;
#pragma unroll
      for (int j = 0; j < 4; ++j) rv[j] = slot[2 + j] - 2 * t;
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      copy_words<KR>(ring0 + 4 * key_at(stage, j), pk + rk[j] * ksl);
      const unsigned short* n = pn + rk[j] * ssl;
      sc.kn[j] = __ldg(n);
      sc.vs[j] = __ldg(n + dvs);
      sc.vz[j] = __ldg(n + dvz);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) copy_words<VR>(ring0 + 4 * value_at(stage, j), pv + rv[j] * vsl);
    copies_commit();
  };
  float m0 = -1.0e30f, m1 = -1.0e30f;  // running max of heads 2t, 2t + 1 (log2 units)
  float den0 = 0.f, den1 = 0.f, z0 = 0.f, z1 = 0.f;  // this thread's tokens only
  float acc[KSTEPS][4];
#pragma unroll
  for (int i = 0; i < KSTEPS; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

  u32 qf[KSTEPS][2];  // B fragments: head g, this thread's channels in the keys' pairing (below)
  // one step: the scores, the online softmax, the values; ``cur`` holds the step's data
  auto step = [&](int n0, const Step<D>& cur) {
    float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int m = 0; m < KR; ++m) {
      u32 A[4], B[4];
      key8(cur.k[0].w[m], l0, l1, h0, h1, A);
      key8(cur.k[1].w[m], l0, l1, h0, h1, B);
      mma(c, A[0], B[0], A[1], B[1], qf[2 * m][0], qf[2 * m][1]);
      mma(c, A[2], B[2], A[3], B[3], qf[2 * m + 1][0], qf[2 * m + 1][1]);
    }
    const int ta = n0 + g, tb = ta + 8;
    const bool oka = ta < L && ta >= lo, okb = tb < L && tb >= lo;
    const float ka = half_bits(cur.kn[0]) * logit_mult, kb = half_bits(cur.kn[1]) * logit_mult;
    float s[4] = {c[0] * ka, c[1] * ka, c[2] * kb, c[3] * kb};
    if (capped) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float e = ex2((2.f * LOG2E) * (s[j] * cap_in));
        s[j] = (1.f - __fdividef(2.f, e + 1.f)) * cap_out;
      }
    }
    s[0] = oka ? s[0] : NEG_INF;
    s[1] = oka ? s[1] : NEG_INF;
    s[2] = okb ? s[2] : NEG_INF;
    s[3] = okb ? s[3] : NEG_INF;
    float x0 = fmaxf(s[0], s[2]), x1 = fmaxf(s[1], s[3]);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, o));
      x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, o));
    }
    const float n0max = fmaxf(m0, x0), n1max = fmaxf(m1, x1);
    if (__any_sync(0xffffffffu, n0max > m0 || n1max > m1)) {
      const float a0 = ex2(m0 - n0max), a1 = ex2(m1 - n1max);
#pragma unroll
      for (int i = 0; i < KSTEPS; ++i) {
        acc[i][0] *= a0;
        acc[i][1] *= a1;
        acc[i][2] *= a0;
        acc[i][3] *= a1;
      }
      den0 *= a0;
      den1 *= a1;
      z0 *= a0;
      z1 *= a1;
      m0 = n0max;
      m1 = n1max;
    }
    const float p0 = ex2(s[0] - m0), p1 = ex2(s[1] - m1);
    const float p2 = ex2(s[2] - m0), p3 = ex2(s[3] - m1);
    den0 += p0 + p2;
    den1 += p1 + p3;
    const float va = oka ? half_bits(cur.vs[0]) : 0.f, vb = okb ? half_bits(cur.vs[1]) : 0.f;
    const float za = oka ? half_bits(cur.vz[0]) : 0.f, zb = okb ? half_bits(cur.vz[1]) : 0.f;
    z0 += p0 * za + p2 * zb;
    z1 += p1 * za + p3 * zb;
    const u32 pb0 = transpose8x8(half2_bits(p0 * va, p1 * va));
    const u32 pb1 = transpose8x8(half2_bits(p2 * vb, p3 * vb));
#pragma unroll
    for (int k = 0; k < VR; ++k) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        u32 lo[2], hi[2];  // tokens 2t, 2t + 1 and 2t + 8, 2t + 9
        value2(cur.v[0].w[k], cur.v[1].w[k], j, lo);
        value2(cur.v[2].w[k], cur.v[3].w[k], j, hi);
        mma(acc[4 * k + j], lo[0], lo[1], hi[0], hi[1], pb0, pb1);
      }
    }
  };
  // the first steps' loads go out before q is rotated
  int n0 = start + warp * 16;
  Scalars sa, sb;  // the scalars of this step and the next
  int rd = 0;      // the ring stage of this step
  // (a step past the end commits an empty group: each step's wait counts STEPS_AHEAD groups after it)
  if (n0 < end) {
    fetch(n0, 0, sa, pages[0]);
  } else {
    copies_commit();
  }
  if (n0 + 16 * WARPS < end) {
    fetch(n0 + 16 * WARPS, 1, sb, pages[1]);
  } else {
    copies_commit();
  }
  sa.page = pages[2];
  sb.page = pages[3];

  // q rotated: the butterflies within a thread's quarter, then across the four quarters of a head
  // (lanes t ^ 1, t ^ 2); unnormalised, in the order of the channel bits, as the write rotates
#pragma unroll
  for (int len = 1; len < Q; len <<= 1) {
#pragma unroll
    for (int i = 0; i < Q; ++i) {
      if (!(i & len)) {
        const float u = x[i], w = x[i + len];
        x[i] = u + w;
        x[i + len] = u - w;
      }
    }
  }
#pragma unroll
  for (int m = 1; m < 4; m <<= 1) {
    const bool upper = t & m;
#pragma unroll
    for (int i = 0; i < Q; ++i) {
      const float y = __shfl_xor_sync(0xffffffffu, x[i], m);
      x[i] = upper ? y - x[i] : x[i] + y;
    }
  }
  const float q_scale = __int_as_float(static_cast<int>(q_scale_bits));
#pragma unroll
  for (int s = 0; s < KSTEPS; ++s) {
    qf[s][0] = half2_bits(x[4 * s] * q_scale, x[4 * s + 1] * q_scale);
    qf[s][1] = half2_bits(x[4 * s + 2] * q_scale, x[4 * s + 3] * q_scale);
  }

  // one step: the loads STEPS_AHEAD steps on go out (into the stage and the scalars this step
  // frees), this step's codes are read from the ring, then its math
  auto advance = [&](Scalars& sc) {
    Step<D> cur;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      cur.kn[j] = sc.kn[j];
      cur.vs[j] = sc.vs[j];
      cur.vz[j] = sc.vz[j];
    }
    const int wr = rd == 0 ? STAGES - 1 : rd - 1;
    const int ahead = n0 + STEPS_AHEAD * 16 * WARPS;
    if (ahead < end) {
      fetch(ahead, wr, sc, sc.page);
      if constexpr (PAGED) {
        const int next = ahead + STEPS_AHEAD * 16 * WARPS;
        sc.page = next < end ? page_of(next >> lg) : 0;
      }
    } else {
      copies_commit();
    }
    copies_wait<STEPS_AHEAD>();
#pragma unroll
    for (int j = 0; j < 2; ++j) cur.k[j] = shared_words<KR>(ring + warp * STAGES * STAGE_WORDS + key_at(rd, j));
#pragma unroll
    for (int j = 0; j < 4; ++j) cur.v[j] = shared_words<VR>(ring + warp * STAGES * STAGE_WORDS + value_at(rd, j));
    step(n0, cur);
    rd = rd == STAGES - 1 ? 0 : rd + 1;
    n0 += 16 * WARPS;
  };
#pragma unroll 1
  while (n0 < end) {
    advance(sa);
    if (n0 >= end) break;
    advance(sb);
  }

  // this warp's sums over its tokens: reduce over the eight lanes of each head pair
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {
    den0 += __shfl_xor_sync(0xffffffffu, den0, o);
    den1 += __shfl_xor_sync(0xffffffffu, den1, o);
    z0 += __shfl_xor_sync(0xffffffffu, z0, o);
    z1 += __shfl_xor_sync(0xffffffffu, z1, o);
  }
  const int ha = 2 * t, hb = 2 * t + 1;
  if (g == 0) {
    wm[warp][ha] = m0;
    wm[warp][hb] = m1;
    wl[warp][ha] = den0;
    wl[warp][hb] = den1;
  }
  __syncthreads();
  float M0 = wm[0][ha], M1 = wm[0][hb];
#pragma unroll
  for (int w = 1; w < WARPS; ++w) {
    M0 = fmaxf(M0, wm[w][ha]);
    M1 = fmaxf(M1, wm[w][hb]);
  }
  const float f0 = ex2(m0 - M0), f1 = ex2(m1 - M1);
  // element e of m-tile i: row g (low nibbles, codes * 2^-24) or g + 8 (high nibbles, * 2^-20),
  // head 2t or 2t + 1; the rows are channels g D/8 + 8k + 2j and the one after (i = 4k + j)
  constexpr float LO = 16777216.f, HI = 1048576.f;
#pragma unroll
  for (int i = 0; i < KSTEPS; ++i) {
    part[warp][4 * i][lane] = (acc[i][0] * LO + z0) * f0;
    part[warp][4 * i + 1][lane] = (acc[i][1] * LO + z1) * f1;
    part[warp][4 * i + 2][lane] = (acc[i][2] * HI + z0) * f0;
    part[warp][4 * i + 3][lane] = (acc[i][3] * HI + z1) * f1;
  }
  __syncthreads();
  for (int i = tid; i < G * D; i += 128) {
    const int r = i / D, d = i % D;
    float M = wm[0][r];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) M = fmaxf(M, wm[w][r]);
    float l = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) l += wl[w][r] * ex2(wm[w][r] - M);
    const int c = d % (D / 8), e = 4 * (4 * (c >> 3) + ((c & 7) >> 1)) + 2 * (c & 1) + (r & 1);
    const int from = (d / (D / 8)) * 4 + (r >> 1);  // the lane holding (head r, channel d)
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) o += part[w][e][from];
    const i64 hq = static_cast<i64>(h) * G + r;
    if (direct) {
      store_act<QBF16>(out, b * so_b + hq * so_h + d, l > 0.f ? o / l : 0.f);
    } else {
      const i64 at = b * sp_b + hq * sp_h + sp;
      po[at * D + d] = o;
      if (d == 0) {
        pm[at] = M;
        pl[at] = l;
      }
    }
  }
}
