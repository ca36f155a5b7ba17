// quantrt: device helpers shared by the integer weight-only kernels (wna16_mma.cu, wna16_wgmma.cu):
// code-to-pair conversion by bit tricks, dequantization, mma.sync, asynchronous copies, the
// repacked layout's addressing (quantrt/backends/cuda/wna16_layout.py) and the x staging swizzle.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace qrt {

typedef unsigned int u32;

// Weight codes a kernel instance reads (its CODE template argument): 4 and 8 are unsigned
// integers of that width, E2M1 is fp4 (sign, 2 exponent bits, 1 mantissa bit), LUT4 an index
// into a 16-value code book (bitsandbytes NF4/FP4) and Q4K GGUF Q4_K's unsigned nibbles (a 6-bit
// scale and min per 32 inputs), all packed as 4-bit codes in int4's lane layout (LUT4 in the
// canonical nibble order); Q80 is GGUF Q8_0's signed bytes plus 128 (an fp16 scale per 32
// inputs) in int8's lane layout. Q40, Q41, Q50, Q51, Q5K and Q6K are GGUF Q4_0, Q4_1, Q5_0, Q5_1,
// Q5_K and Q6_K: the low nibble of each code in int4's lane layout and everything else of a
// 32-input run (the fifth and sixth bits, d, m; the K types' sub-block scales as d sc, -dmin m) as
// its group parameter; Q2K and Q3K are GGUF Q2_K and Q3_K with their whole 2- and 3-bit codes
// widened to nibbles (Q3_K's high bit as bit 2) and the run's two sub-block scales (and offsets).
// F8E4 and F8E5 are fp8 weights (e4m3, e5m2) as stored, in int8's lane layout (see Fp8Bits), with
// an fp32 scale per group and column.
enum : int { E2M1 = 41, LUT4, Q4K, Q80, Q40, Q41, Q50, Q51, Q5K, Q6K, Q2K, Q3K, F8E4, F8E5 };
__host__ __device__ constexpr int code_bits(int code) {
  return code == 8 || code == Q80 || code == F8E4 || code == F8E5 ? 8 : 4;
}
// codes with a zero point: the folded path subtracts it times the chunk's sum of x
__host__ __device__ constexpr bool has_zero(int code) { return code != F8E4 && code != F8E5; }

template <typename T2> __device__ __forceinline__ u32 as_u32(T2 v) { return *reinterpret_cast<u32*>(&v); }
template <typename T2> __device__ __forceinline__ T2 as_t2(u32 v) { return *reinterpret_cast<T2*>(&v); }

template <typename T> struct Kind;
template <> struct Kind<__half> {
  typedef __half2 T2;
  static __device__ __forceinline__ u32 magic4() { return 0x64006400u; }  // 1024.0 per half
  static __device__ __forceinline__ u32 ones2() { return 0x3C003C00u; }
  static __device__ __forceinline__ u32 pair(float v) { return as_u32(__float2half2_rn(v)); }
  static __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
};
template <> struct Kind<__nv_bfloat16> {
  typedef __nv_bfloat162 T2;
  static __device__ __forceinline__ u32 magic4() { return 0x43004300u; }  // 128.0 per half
  static __device__ __forceinline__ u32 ones2() { return 0x3F803F80u; }
  static __device__ __forceinline__ u32 pair(float v) { return as_u32(__float2bfloat162_rn(v)); }
  static __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
};

__device__ __forceinline__ u32 and_or(u32 a, u32 mask, u32 bits) {
  u32 r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "r"(mask), "r"(bits));  // (a & mask) | bits
  return r;
}

// c = a b (+ c unless first): the first mma of a chunk's sums writes them, so they need no zeroing
template <typename T> __device__ __forceinline__ void mma(float* c, bool first, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1);
template <>
__device__ __forceinline__ void mma<__half>(float* c, bool first, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  if (first)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};"
        : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.f));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float* c, bool first, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                                   u32 b1) {
  if (first)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};"
        : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.f));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 ldg_stream(const uint4* p) {
  uint4 r;  // read once: keep it out of L1
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

__device__ __forceinline__ u32 word(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// The raw pair registers (magic + q) of k16 tile kt from a lane's 16 bytes of codes: r0 holds
// inputs 4kt, 4kt+1 of the lane's run, r1 inputs 4kt+2, 4kt+3 (low half first).
// 4-bit: word kt/2, nibble slot p holds input 8*(kt/2) + 2*(p%4) + p/4, so (w >> 8h) & 0x000F000F
// is one pair. 8-bit: word kt, byte i holds input 4kt + i.
template <typename T, int BITS> struct Codes;
template <typename T> struct Codes<T, 4> {
  static __device__ __forceinline__ void raw(const uint4& v, int kt, u32& r0, u32& r1) {
    const u32 s = word(v, kt >> 1) >> (8 * (kt & 1));
    r0 = and_or(s, 0x000F000Fu, Kind<T>::magic4());
    r1 = and_or(s >> 4, 0x000F000Fu, Kind<T>::magic4());
  }
};
template <> struct Codes<__half, 8> {
  static __device__ __forceinline__ void raw(const uint4& v, int kt, u32& r0, u32& r1) {
    const u32 w = word(v, kt);
    r0 = __byte_perm(w, 0x64646464u, 0x4140);
    r1 = __byte_perm(w, 0x64646464u, 0x4342);
  }
};
// fp8 codes: a byte's exponent and mantissa bits placed just below the activation dtype's sign,
// the exponent's low bits on the dtype's, give the code's value times 2^-LIFT exactly (subnormal
// codes become the dtype's subnormals); one multiply by 2^LIFT per pair restores it, so the pairs
// are the codes' values and a scale stays fp32 (the folded path) or multiplies after (Deq). LIFT:
// bf16 e4m3 120, e5m2 112; fp16 e4m3 8, e5m2 0 (the byte is fp16's top byte). e5m2's infinities and
// NaN stay such in fp16 only; checkpoints hold neither.
template <typename T, int CODE> struct Fp8Bits;
template <> struct Fp8Bits<__nv_bfloat16, F8E4> {
  static constexpr int SHIFT = 4;
  static constexpr u32 LIFT2 = 0x7B807B80u;  // 2^120 per half
};
template <> struct Fp8Bits<__nv_bfloat16, F8E5> {
  static constexpr int SHIFT = 5;
  static constexpr u32 LIFT2 = 0x77807780u;  // 2^112
};
template <> struct Fp8Bits<__half, F8E4> {
  static constexpr int SHIFT = 7;
  static constexpr u32 LIFT2 = 0x5C005C00u;  // 2^8
};
template <> struct Fp8Bits<__half, F8E5> {
  static constexpr int SHIFT = 8;
  static constexpr u32 LIFT2 = 0;  // none: the bits are the value
};
template <typename T, int CODE>
__device__ __forceinline__ u32 fp8_pair(u32 w, u32 sel) {
  typedef typename Kind<T>::T2 T2;
  const u32 b = __byte_perm(w, 0, sel);  // the two bytes in the low byte of each half
  const u32 v = ((b & 0x007F007Fu) << Fp8Bits<T, CODE>::SHIFT) | ((b & 0x00800080u) << 8);
  if constexpr (Fp8Bits<T, CODE>::LIFT2 == 0) return v;
  else return as_u32(__hmul2(as_t2<T2>(v), as_t2<T2>(Fp8Bits<T, CODE>::LIFT2)));
}
template <typename T> struct Codes<T, F8E4> {
  static __device__ __forceinline__ void raw(const uint4& v, int kt, u32& r0, u32& r1) {
    const u32 w = word(v, kt);
    r0 = fp8_pair<T, F8E4>(w, 0x4140);
    r1 = fp8_pair<T, F8E4>(w, 0x4342);
  }
};
template <typename T> struct Codes<T, F8E5> {
  static __device__ __forceinline__ void raw(const uint4& v, int kt, u32& r0, u32& r1) {
    const u32 w = word(v, kt);
    r0 = fp8_pair<T, F8E5>(w, 0x4140);
    r1 = fp8_pair<T, F8E5>(w, 0x4342);
  }
};

// Folded path, bf16 8-bit: 2^7 + a byte does not fit bf16's 8-bit significand, so each byte is
// read as its two nibbles, two "virtual" inputs with the same x: x * (128 + lo) + 16x * (128 + hi)
// = x * (2176 + q), and 16x is exact in bf16. A real k16 tile becomes two virtual ones: bytes 0
// and 2 of each word, then bytes 1 and 3. (A nibble cannot be read in place above bit 3: bf16's
// mantissa has 7 bits, so every nibble pair is shifted down, as for 4-bit codes.)
template <typename T, int BITS> struct Split {
  static constexpr bool value = false;
};
template <> struct Split<__nv_bfloat16, 8> {
  static constexpr bool value = true;
};
// virtual tiles per real k16 tile on the folded path
template <typename T, int BITS> __host__ __device__ constexpr int virtual_tiles() { return Split<T, BITS>::value ? 2 : 1; }

// The code registers of (virtual) tile vt on the folded path.
template <typename T, int BITS>
__device__ __forceinline__ void folded_codes(const uint4& v, int vt, u32& r0, u32& r1) {
  if constexpr (Split<T, BITS>::value) {
    const u32 s = word(v, vt >> 1) >> (8 * (vt & 1));
    r0 = and_or(s, 0x000F000Fu, 0x43004300u);
    r1 = and_or(s >> 4, 0x000F000Fu, 0x43004300u);
  } else {
    Codes<T, BITS>::raw(v, vt, r0, r1);
  }
}
// The x registers of virtual tile v of real tile kt, from the lane's x pairs lo = (4kt, 4kt+1)
// and hi = (4kt+2, 4kt+3), matching folded_codes.
template <typename T, int BITS>
__device__ __forceinline__ void folded_x(u32 lo, u32 hi, int v, u32& r0, u32& r1) {
  if constexpr (Split<T, BITS>::value) {
    r0 = v ? __byte_perm(lo, hi, 0x7632) : __byte_perm(lo, hi, 0x5410);  // inputs (1, 3) or (0, 2)
    r1 = as_u32(__hmul2(as_t2<__nv_bfloat162>(r0), as_t2<__nv_bfloat162>(0x41804180u)));  // x 16
  } else {
    r0 = lo;
    r1 = hi;
  }
}

// Group parameters as stored, [groups][Npad]: one u32 per column (low half zb = magic + z, high
// half s) in the activation dtype, or for bf16 8-bit a float2 (zb = 2176 + z, s; see Split),
// since bf16 cannot hold that sum.
template <typename T, int BITS> struct Param {
  typedef u32 type;
};
template <> struct Param<__nv_bfloat16, 8> {
  typedef float2 type;
};
// fp4: one e5m3 scale byte per group and column (no zero point; see Fp4Scale)
template <typename T> struct Param<T, E2M1> {
  typedef unsigned char type;
};
template <typename T> struct Param<T, LUT4> {
  typedef T type;
};
// Q4K: a super-block's 16 head bytes as llama.cpp stores them (d, dmin fp16; 12 bytes of 6-bit
// sub-block scales and mins), per column; a super-block (256 inputs) spans two chunks.
template <typename T> struct Param<T, Q4K> {
  typedef uint4 type;
};
// Q80: a block's fp16 scale d as stored (its bits), per column; two blocks per 64-input chunk.
template <typename T> struct Param<T, Q80> {
  typedef unsigned short type;
};
// The GGUF codes of one parameter per 32-input run (four per 128-input chunk, one per lane of a
// quad): Q40 the block's fp16 d as stored; Q41 d and m (low, high half); Q50, Q51 the block's fifth
// bits (see high_bits), then d, or d and m; Q5K the fifth bits, then d sc and -dmin m in the
// activation dtype; Q6K the fifth bits, the sixth bits, then d sc of the run's two 16-input
// sub-blocks in the activation dtype (4 bytes unused).
template <typename P> struct ParamOf {
  typedef P type;
};
template <typename T> struct Param<T, Q40> : ParamOf<unsigned short> {};
template <typename T> struct Param<T, Q41> : ParamOf<u32> {};
template <typename T> struct Param<T, Q50> : ParamOf<uint2> {};
template <typename T> struct Param<T, Q51> : ParamOf<uint2> {};
template <typename T> struct Param<T, Q5K> : ParamOf<uint2> {};
template <typename T> struct Param<T, Q6K> : ParamOf<uint4> {};
// fp8: the scale per group and column, fp32 as checkpoints store it (block scales, one group per
// channel for tensor and channel scales)
template <typename T> struct Param<T, F8E4> : ParamOf<float> {};
template <typename T> struct Param<T, F8E5> : ParamOf<float> {};

// LUT4 code books reach the decode as a Book (empty for the other codes), loaded by each block
// before its first decode: the 256 pairs of mma_codebook.book_pairs (entry b = (book[b & 15],
// book[b >> 4]) in the activation dtype) copied to shared memory once per bank (32 KiB), so each
// lane reads its own copy: random code bytes never collide on a bank.
template <int CODE> struct Book {
  __device__ __forceinline__ void load(const u32* __restrict__) {}
};
__shared__ uint4 book_rep[256 * 8];  // entry b's pair at [b * 32 + lane] as u32
template <> struct Book<LUT4> {
  const u32* base;
  __device__ __forceinline__ void load(const u32* __restrict__ book) {
    // one read per entry; its 8 stores start at a rotated piece, so a warp's 16-byte stores of
    // consecutive entries spread over all banks
    for (int e = threadIdx.x; e < 256; e += blockDim.x) {
      const u32 v = __ldg(book + e);
#pragma unroll
      for (int q = 0; q < 8; q++) book_rep[e * 8 + ((q + e) & 7)] = make_uint4(v, v, v, v);
    }
    __syncthreads();
    base = reinterpret_cast<const u32*>(book_rep) + (threadIdx.x & 31);
  }
};

// Dequantized pair registers (v - zb) * s of tile kt, for the unfolded path.
template <typename T, int BITS> struct Deq {
  static __device__ __forceinline__ void run(const uint4& v, int kt, u32 p, int, u32& b0, u32& b1, const Book<BITS>&) {
    typedef typename Kind<T>::T2 T2;
    const T2 zb = as_t2<T2>(__byte_perm(p, 0, 0x1010)), s = as_t2<T2>(__byte_perm(p, 0, 0x3232));
    u32 r0, r1;
    Codes<T, BITS>::raw(v, kt, r0, r1);
    b0 = as_u32(__hmul2(__hsub2(as_t2<T2>(r0), zb), s));
    b1 = as_u32(__hmul2(__hsub2(as_t2<T2>(r1), zb), s));
  }
};
template <> struct Deq<__nv_bfloat16, 8> {
  static __device__ __forceinline__ void run(const uint4& v, int kt, float2 p, int, u32& b0, u32& b1, const Book<8>&) {
    const u32 w = word(v, kt);
    float f[4];
#pragma unroll
    for (int i = 0; i < 4; i++)  // (2^23 + q) - (2^23 - 2176) = 2176 + q exactly; zb = 2176 + z
      f[i] = (__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440 | i)) - (8388608.f - 2176.f) - p.x) * p.y;
    b0 = as_u32(__floats2bfloat162_rn(f[0], f[1]));
    b1 = as_u32(__floats2bfloat162_rn(f[2], f[3]));
  }
};
// fp4 pairs: e2m1 (s, e1 e0 m) placed as a subnormal fp16 (bits 9..11, value * 2^-14) or bf16
// (bits 6..8, value * 2^-126), exact for every code including -0. The group's scale byte is
// e5m3 (5 exponent bits, bias 15, 3 mantissa bits; always normal, see mma_codebook.fp4_operands):
// fp16's bits 7..14, or bf16's bits 4..11 with 224 added to the exponent (value * 2^112), each
// widened to a pair by one multiply-add. One multiply gives code * scale * 2^-14 in either dtype
// (at most 6 significant bits): exactly in bf16, and in fp16 down to 2^-24 (NVFP4 always, MXFP4
// within 2^24 of its column's largest scale); the column factor carries the rest.
template <typename T> struct Fp4Bits;
template <> struct Fp4Bits<__half> {
  static __device__ __forceinline__ u32 pair(u32 s) { return ((s & 0x00070007u) << 9) | ((s & 0x00080008u) << 12); }
};
template <> struct Fp4Bits<__nv_bfloat16> {
  static __device__ __forceinline__ u32 pair(u32 s) { return ((s & 0x00070007u) << 6) | ((s & 0x00080008u) << 12); }
};
template <typename T> struct Fp4Scale;
template <> struct Fp4Scale<__half> {
  static __device__ __forceinline__ u32 pair(u32 b) { return b * 0x00800080u; }
};
template <> struct Fp4Scale<__nv_bfloat16> {
  static __device__ __forceinline__ u32 pair(u32 b) { return b * 0x00100010u + 0x70007000u; }
};
template <typename T> struct Deq<T, E2M1> {
  static __device__ __forceinline__ void run(const uint4& v, int kt, unsigned char p, int, u32& b0, u32& b1,
                                             const Book<E2M1>&) {
    typedef typename Kind<T>::T2 T2;
    const T2 s = as_t2<T2>(Fp4Scale<T>::pair(p));
    const u32 w = word(v, kt >> 1) >> (8 * (kt & 1));
    b0 = as_u32(__hmul2(as_t2<T2>(Fp4Bits<T>::pair(w)), s));
    b1 = as_u32(__hmul2(as_t2<T2>(Fp4Bits<T>::pair(w >> 4)), s));
  }
};
// LUT4 pairs: LUT4 codes keep the canonical nibble order (wna16_layout.lane_k, natural), so bytes
// 2h and 2h + 1 of word kt/2 (h = kt % 2) index the pairs (4kt, 4kt+1) and (4kt+2, 4kt+3): two
// lookups of the lane's copy of the pair table, one multiply each by the group's scale.
template <typename T> struct Deq<T, LUT4> {
  static __device__ __forceinline__ void run(const uint4& v, int kt, T p, int, u32& b0, u32& b1, const Book<LUT4>& bk) {
    typedef typename Kind<T>::T2 T2;
    const T2 s = T2{p, p};
    const u32 w = word(v, kt >> 1) >> (16 * (kt & 1));
    const u32 t0 = bk.base[(w & 0xFF) << 5], t1 = bk.base[((w >> 8) & 0xFF) << 5];
    b0 = as_u32(__hmul2(as_t2<T2>(t0), s));
    b1 = as_u32(__hmul2(as_t2<T2>(t1), s));
  }
};
// GGUF Q4_K pairs: lane t of chunk c holds the 32 inputs of sub-block j = 4 (c % 2) + t, whose
// 6-bit scale sc and min m come from the head's 12 bytes as llama.cpp's get_scale_min_k4 reads
// them. The code (v - magic, exact) times s = d sc plus -o = -dmin m, by one fused multiply-add
// per pair with s and o rounded once to the activation dtype (relative 2^-9 in bf16, 2^-12 in
// fp16): the same rounding as every unfolded pair. s and o depend on the chunk and column only,
// so the compiler computes them once per chunk for the unrolled tiles.
__device__ __forceinline__ void q4k_scale_min(const uint4& p, int j, float& s, float& o) {
  const int i = (j & 3) * 8;  // branch-free, so the unrolled tiles share one computation
  const u32 y = (p.y >> i) & 0xFF, z = (p.z >> i) & 0xFF, w = (p.w >> i) & 0xFF;
  const bool lo = j < 4;
  const u32 sc = lo ? y & 63 : (w & 15) | ((y >> 6) << 4);
  const u32 m = lo ? z & 63 : (w >> 4) | ((z >> 6) << 4);
  s = __half2float(__ushort_as_half((unsigned short)(p.x & 0xFFFFu))) * (float)sc;
  o = __half2float(__ushort_as_half((unsigned short)(p.x >> 16))) * (float)m;
}
template <typename T> struct Deq<T, Q4K> {
  static __device__ __forceinline__ void run(const uint4& v, int kt, const uint4& p, int c, u32& b0, u32& b1,
                                             const Book<Q4K>&) {
    typedef typename Kind<T>::T2 T2;
    float s, o;
    q4k_scale_min(p, 4 * (c & 1) + (threadIdx.x & 3), s, o);
    const T2 s2 = as_t2<T2>(Kind<T>::pair(s)), o2 = as_t2<T2>(Kind<T>::pair(-o));
    const T2 magic = as_t2<T2>(Kind<T>::magic4());
    u32 r0, r1;
    Codes<T, 4>::raw(v, kt, r0, r1);
    b0 = as_u32(__hfma2(__hsub2(as_t2<T2>(r0), magic), s2, o2));
    b1 = as_u32(__hfma2(__hsub2(as_t2<T2>(r1), magic), s2, o2));
  }
};
// GGUF Q8_0 pairs: bytes u = q + 128 of word kt (inputs 4kt..4kt+3), the signed code exactly
// in the activation dtype, times the block's d (exact in fp16, rounded once in bf16).
// fp16: 1024 + u by one byte permute, less 1152. bf16 holds 128 + u only for u < 128, so the
// low 7 bits go into 128's mantissa and bit 7 picks what to subtract: 256 (u < 128) or 128.
template <typename T> struct Q8Code;
template <> struct Q8Code<__half> {
  static __device__ __forceinline__ u32 pair(u32 w, u32 sel) {
    return as_u32(__hsub2(as_t2<__half2>(__byte_perm(w, 0x64646464u, sel)), as_t2<__half2>(0x64806480u)));
  }
};
template <> struct Q8Code<__nv_bfloat16> {
  static __device__ __forceinline__ u32 pair(u32 w, u32 sel) {
    const u32 b = __byte_perm(w, 0, sel);  // the two bytes in the low byte of each half
    const u32 v = and_or(b, 0x007F007Fu, 0x43004300u);
    const u32 c = (b & 0x00800080u) ^ 0x43804380u;
    return as_u32(__hsub2(as_t2<__nv_bfloat162>(v), as_t2<__nv_bfloat162>(c)));
  }
};
template <typename T> struct Deq<T, Q80> {
  static __device__ __forceinline__ void run(const uint4& v, int kt, unsigned short p, int, u32& b0, u32& b1,
                                             const Book<Q80>&) {
    typedef typename Kind<T>::T2 T2;
    const T2 d = as_t2<T2>(Kind<T>::pair(__half2float(__ushort_as_half(p))));
    const u32 w = word(v, kt);
    b0 = as_u32(__hmul2(as_t2<T2>(Q8Code<T>::pair(w, 0x4140)), d));
    b1 = as_u32(__hmul2(as_t2<T2>(Q8Code<T>::pair(w, 0x4342)), d));
  }
};
// GGUF blocks on the 4-bit lane layout. A lane's run of 32 inputs is one block, so its group
// parameter is the block's. Codes of 5 bits keep their fifth bits in a word laid out for the
// decode: input 4kt + j of the run at bit kt + {0, 16, 8, 24}[j], so one shift and mask put the
// bits of tile kt's pairs at bits 4 and 20, where they join the magic number's mantissa (magic + q
// stays exact up to q = 31 in fp16 and bf16). Decoding is then the int4 one with a different
// offset and scale: (magic + q - zb) * d, or (magic + q - magic) * d + m as one fused multiply-add.
__device__ __forceinline__ void high_bits(u32 h, int kt, u32 magic, u32& m0, u32& m1) {
  m0 = and_or(kt <= 4 ? h << (4 - kt) : h >> (kt - 4), 0x00100010u, magic);  // inputs 4kt, 4kt + 1
  m1 = and_or(h >> (kt + 4), 0x00100010u, magic);                              // 4kt + 2, 4kt + 3
}
// magic + q of tile kt's pairs, q's fifth bits (if any) from the block's high-bit word
template <typename T, bool HIGH>
__device__ __forceinline__ void gguf_raw(const uint4& v, int kt, u32 h, u32& r0, u32& r1) {
  u32 m0 = Kind<T>::magic4(), m1 = m0;
  if constexpr (HIGH) high_bits(h, kt, Kind<T>::magic4(), m0, m1);
  const u32 s = word(v, kt >> 1) >> (8 * (kt & 1));
  r0 = and_or(s, 0x000F000Fu, m0);
  r1 = and_or(s >> 4, 0x000F000Fu, m1);
}
template <typename T> __device__ __forceinline__ u32 f16_pair(u32 bits) {
  return Kind<T>::pair(__half2float(__ushort_as_half((unsigned short)(bits & 0xFFFFu))));
}
// (magic + q - zb) * d: Q4_0 (zb = magic + 8) and Q5_0 (magic + 16)
template <typename T, bool HIGH>
__device__ __forceinline__ void gguf_sym(const uint4& v, int kt, u32 h, u32 d_bits, u32& b0, u32& b1) {
  typedef typename Kind<T>::T2 T2;
  const T2 d = as_t2<T2>(f16_pair<T>(d_bits));
  const T2 zb = as_t2<T2>(Kind<T>::magic4() + (HIGH ? 0x00100010u : 0x00080008u));
  u32 r0, r1;
  gguf_raw<T, HIGH>(v, kt, h, r0, r1);
  b0 = as_u32(__hmul2(__hsub2(as_t2<T2>(r0), zb), d));
  b1 = as_u32(__hmul2(__hsub2(as_t2<T2>(r1), zb), d));
}
// (magic + q - magic) * s + o, s and o pairs in the activation dtype: Q4_1, Q5_1, Q5_K
template <typename T, bool HIGH>
__device__ __forceinline__ void gguf_affine(const uint4& v, int kt, u32 h, u32 s2, u32 o2, u32& b0, u32& b1) {
  typedef typename Kind<T>::T2 T2;
  const T2 magic = as_t2<T2>(Kind<T>::magic4());
  u32 r0, r1;
  gguf_raw<T, HIGH>(v, kt, h, r0, r1);
  b0 = as_u32(__hfma2(__hsub2(as_t2<T2>(r0), magic), as_t2<T2>(s2), as_t2<T2>(o2)));
  b1 = as_u32(__hfma2(__hsub2(as_t2<T2>(r1), magic), as_t2<T2>(s2), as_t2<T2>(o2)));
}
template <typename T> struct Deq<T, Q40> {
  static __device__ __forceinline__ void run(const uint4& v, int kt, unsigned short p, int, u32& b0, u32& b1,
                                             const Book<Q40>&) {
    gguf_sym<T, false>(v, kt, 0, p, b0, b1);
  }
};
template <typename T> struct Deq<T, Q50> {
  static __device__ __forceinline__ void run(const uint4& v, int kt, uint2 p, int, u32& b0, u32& b1,
                                             const Book<Q50>&) {
    gguf_sym<T, true>(v, kt, p.x, p.y, b0, b1);
  }
};
template <typename T> struct Deq<T, Q41> {
  static __device__ __forceinline__ void run(const uint4& v, int kt, u32 p, int, u32& b0, u32& b1,
                                             const Book<Q41>&) {
    gguf_affine<T, false>(v, kt, 0, f16_pair<T>(p), f16_pair<T>(p >> 16), b0, b1);
  }
};
template <typename T> struct Deq<T, Q51> {
  static __device__ __forceinline__ void run(const uint4& v, int kt, uint2 p, int, u32& b0, u32& b1,
                                             const Book<Q51>&) {
    gguf_affine<T, true>(v, kt, p.x, f16_pair<T>(p.y), f16_pair<T>(p.y >> 16), b0, b1);
  }
};
template <typename T> struct Deq<T, Q5K> {
  static __device__ __forceinline__ void run(const uint4& v, int kt, uint2 p, int, u32& b0, u32& b1,
                                             const Book<Q5K>&) {
    gguf_affine<T, true>(v, kt, p.x, __byte_perm(p.y, 0, 0x1010), __byte_perm(p.y, 0, 0x3232), b0, b1);
  }
};
// Q2_K, Q3_K: the d sc (Q3_K: d (sc - 32)) of the run's two 16-input sub-blocks in the activation
// dtype; Q2_K also their -dmin m.
template <typename T> struct Param<T, Q3K> : ParamOf<u32> {};
template <typename T> struct Param<T, Q2K> : ParamOf<uint2> {};
// the half of a pair word for 16-input sub-block kt / 4 of a lane's run, in both halves
__device__ __forceinline__ u32 run_half(u32 pair, int kt) { return __byte_perm(pair, 0, kt < 4 ? 0x1010 : 0x3232); }
template <typename T> struct Deq<T, Q3K> {  // (magic + u - (magic + 4)) s, u = q + 4 in 0..7
  static __device__ __forceinline__ void run(const uint4& v, int kt, u32 p, int, u32& b0, u32& b1, const Book<Q3K>&) {
    typedef typename Kind<T>::T2 T2;
    const T2 zb = as_t2<T2>(Kind<T>::magic4() + 0x00040004u), s = as_t2<T2>(run_half(p, kt));
    u32 r0, r1;
    Codes<T, 4>::raw(v, kt, r0, r1);
    b0 = as_u32(__hmul2(__hsub2(as_t2<T2>(r0), zb), s));
    b1 = as_u32(__hmul2(__hsub2(as_t2<T2>(r1), zb), s));
  }
};
template <typename T> struct Deq<T, Q2K> {  // q s + o, q in 0..3
  static __device__ __forceinline__ void run(const uint4& v, int kt, uint2 p, int, u32& b0, u32& b1, const Book<Q2K>&) {
    gguf_affine<T, false>(v, kt, 0, run_half(p.x, kt), run_half(p.y, kt), b0, b1);
  }
};
// Q6_K: magic + q with the sixth bits (second word, same layout) at bits 5 and 21, less magic + 32,
// times d sc of the 16-input sub-block tile kt lies in (kt < 4: the run's first).
template <typename T> struct Deq<T, Q6K> {
  static __device__ __forceinline__ void run(const uint4& v, int kt, const uint4& p, int, u32& b0, u32& b1,
                                             const Book<Q6K>&) {
    typedef typename Kind<T>::T2 T2;
    u32 m0, m1;
    high_bits(p.x, kt, Kind<T>::magic4(), m0, m1);
    m0 = and_or(kt <= 5 ? p.y << (5 - kt) : p.y >> (kt - 5), 0x00200020u, m0);
    m1 = and_or(p.y >> (kt + 3), 0x00200020u, m1);
    const u32 w = word(v, kt >> 1) >> (8 * (kt & 1));
    const T2 zb = as_t2<T2>(Kind<T>::magic4() + 0x00200020u);
    const T2 s = as_t2<T2>(run_half(p.z, kt));
    b0 = as_u32(__hmul2(__hsub2(as_t2<T2>(and_or(w, 0x000F000Fu, m0)), zb), s));
    b1 = as_u32(__hmul2(__hsub2(as_t2<T2>(and_or(w >> 4, 0x000F000Fu, m1)), zb), s));
  }
};
// fp8 codes times the group's scale in fp32, rounded once to the activation dtype (the dense
// path's dequantization; the mma tiles fold fp8 scales onto the sums instead)
template <typename T, int CODE> struct Fp8Deq {
  static __device__ __forceinline__ u32 scaled(u32 r, float p) {
    typedef typename Kind<T>::T2 T2;
    const T2 h = as_t2<T2>(r);
    T2 o;
    o.x = Kind<T>::from_float(Kind<T>::to_float(h.x) * p);
    o.y = Kind<T>::from_float(Kind<T>::to_float(h.y) * p);
    return as_u32(o);
  }
  static __device__ __forceinline__ void run(const uint4& v, int kt, float p, int, u32& b0, u32& b1,
                                             const Book<CODE>&) {
    u32 r0, r1;
    Codes<T, CODE>::raw(v, kt, r0, r1);
    b0 = scaled(r0, p);
    b1 = scaled(r1, p);
  }
};
template <typename T> struct Deq<T, F8E4> : Fp8Deq<T, F8E4> {};
template <typename T> struct Deq<T, F8E5> : Fp8Deq<T, F8E5> {};
// A column's (zb, s) as floats, for the folded path's per-group fix-up.
template <typename T> __device__ __forceinline__ void zb_s(u32 p, float& zb, float& s) {
  typedef typename Kind<T>::T2 T2;
  const T2 h = as_t2<T2>(p);
  zb = Kind<T>::to_float(h.x);
  s = Kind<T>::to_float(h.y);
}
template <typename T> __device__ __forceinline__ void zb_s(float2 p, float& zb, float& s) {
  zb = p.x;
  s = p.y;
}
template <typename T> __device__ __forceinline__ void zb_s(float p, float& zb, float& s) {  // fp8: no zero
  zb = 0.f;
  s = p;
}

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src));
}
// 16 bytes of which the first `bytes` are read and the rest zero-filled (the tail of K).
__device__ __forceinline__ void cp_async16_fill(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }
// The WN warps of K group wk meet (named barrier 1 + wk; 0 is __syncthreads); one warp only syncs its lanes.
template <int WN> __device__ __forceinline__ void group_sync(int wk) {
  if constexpr (WN == 1)
    __syncwarp();
  else
    asm volatile("bar.sync %0, %1;" ::"r"(1 + wk), "n"(32 * WN) : "memory");
}

// n8 tiles stored side by side per chunk (wna16_layout.TG): tile T, chunk c, lane 0 in uint4.
constexpr int TG = 4;
__device__ __forceinline__ int tile_base(int tile, int chunks) { return ((tile / TG) * chunks * TG + tile % TG) * 32; }

// x rows are staged as 16-byte pieces; piece L of row r sits at slot xslot(r, L), a swizzle that
// keeps a quarter-warp's 16-byte reads (lanes t = 0..3 of rows g, g+1) on distinct banks.
template <int BITS> __device__ __forceinline__ int xslot(int r, int L) {
  return BITS == 4 ? (L ^ (((L >> 3) & 1) << 1) ^ (r & 1)) : (L ^ (r & 1));
}

}  // namespace qrt
