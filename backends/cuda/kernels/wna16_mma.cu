// quantrt: integer weight-only matmul (W4A16, W8A16) on tensor cores, for small batches.
//
// y[M, N] = x[M, K] @ dequant(W)[N, K]^T (+ bias), with x and y in fp16 or bf16 and fp32
// accumulation through mma.sync m16n8k16. Decode-sized M is bound by streaming the weights,
// so everything here serves that stream:
//  * the weights are repacked once at load (quantrt/backends/cuda/wna16_layout.py) so that
//    each lane's 16-byte load holds exactly the B-fragment codes it multiplies: one coalesced
//    512-byte read per warp per (8 columns x KC inputs), no shuffles, no shared memory;
//  * codes become fp16/bf16 pairs by bit tricks (a nibble or byte OR-ed into the mantissa of
//    a power of two), then one subtract of (that power + zero point) and one multiply by the
//    group scale per pair;
//  * every warp keeps the next chunk's loads in flight while it computes the current one;
//  * the warps of a block split K and reduce through shared memory, so one launch writes
//    the output: no workspace, no atomics, no second pass, deterministic, graph-safe.
// x is read straight from global memory (it is tiny and stays in L1/L2); rows past M are
// never loaded.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace qrt {

typedef unsigned int u32;

template <typename T> struct Kind;
template <> struct Kind<__half> {
  typedef __half2 T2;
  static __device__ __forceinline__ u32 magic4() { return 0x64006400u; }  // 1024.0 per half
  static __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
};
template <> struct Kind<__nv_bfloat16> {
  typedef __nv_bfloat162 T2;
  static __device__ __forceinline__ u32 magic4() { return 0x43004300u; }  // 128.0 per half
  static __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
};

__device__ __forceinline__ u32 and_or(u32 a, u32 mask, u32 bits) {
  u32 r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "r"(mask), "r"(bits));  // (a & mask) | bits
  return r;
}

template <typename T> __device__ __forceinline__ void mma(float* c, const u32* a, u32 b0, u32 b1);
template <> __device__ __forceinline__ void mma<__half>(float* c, const u32* a, u32 b0, u32 b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma<__nv_bfloat16>(float* c, const u32* a, u32 b0, u32 b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <typename T> __device__ __forceinline__ void mma0(float* d, const u32* a, u32 b0, u32 b1);
template <> __device__ __forceinline__ void mma0<__half>(float* d, const u32* a, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
}
template <> __device__ __forceinline__ void mma0<__nv_bfloat16>(float* d, const u32* a, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
}

template <typename T2> __device__ __forceinline__ u32 as_u32(T2 v) { return *reinterpret_cast<u32*>(&v); }
template <typename T2> __device__ __forceinline__ T2 as_t2(u32 v) { return *reinterpret_cast<T2*>(&v); }

__device__ __forceinline__ uint4 ldg_stream(const uint4* p) {
  uint4 r;  // read once: keep it out of L1
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// Scale and zero of one group for one column, as the dequantizer wants them:
// fp16/bf16 4-bit and fp16 8-bit: pairs (magic + z, s) applied as (v - zb) * s on T2 pairs;
// bf16 8-bit: floats (2^23 + z, s) applied in fp32.
template <typename T, int BITS> struct Group {
  typename Kind<T>::T2 zb, s;
};
template <> struct Group<__nv_bfloat16, 8> {
  float zb, s;
};

// Dequantize the two B-fragment registers of one k16 tile from one 32-bit word of codes.
// 4-bit: a word holds two k16 tiles; `half` picks one (nibble slots 0,4 / 1,5 or 2,6 / 3,7).
// 8-bit: a word holds one k16 tile: bytes (k 2t, 2t+1, 2t+8, 2t+9).
template <typename T, int BITS> struct Deq;
template <typename T> struct Deq<T, 4> {
  static __device__ __forceinline__ void run(u32 w, int half, const Group<T, 4>& g, u32& b0, u32& b1) {
    typedef typename Kind<T>::T2 T2;
    const u32 s = w >> (8 * half);
    T2 v0 = as_t2<T2>(and_or(s, 0x000F000Fu, Kind<T>::magic4()));
    T2 v1 = as_t2<T2>(and_or(s >> 4, 0x000F000Fu, Kind<T>::magic4()));
    b0 = as_u32(__hmul2(__hsub2(v0, g.zb), g.s));
    b1 = as_u32(__hmul2(__hsub2(v1, g.zb), g.s));
  }
};
// Folded dequantization: the B registers carry (magic + q) exactly; zero and scale are applied
// to the fp32 partial sums of each group instead, as s * (sum x(magic+q) - (magic+z) sum x), where
// sum x comes from one extra mma against ones per k16 tile, shared by all columns. This removes
// the per-pair subtract and multiply that otherwise bound the kernel by ALU issue.
template <typename T, int BITS> struct Raw2;
template <typename T> struct Raw2<T, 4> {
  static __device__ __forceinline__ void run(u32 w, int half, u32& b0, u32& b1) {
    const u32 s = w >> (8 * half);
    b0 = and_or(s, 0x000F000Fu, Kind<T>::magic4());
    b1 = and_or(s >> 4, 0x000F000Fu, Kind<T>::magic4());
  }
};
template <> struct Raw2<__half, 8> {
  static __device__ __forceinline__ void run(u32 w, int, u32& b0, u32& b1) {
    b0 = __byte_perm(w, 0x64646464u, 0x4140);
    b1 = __byte_perm(w, 0x64646464u, 0x4342);
  }
};
template <typename T, int BITS> struct Folds {
  static constexpr bool value = true;
};
template <> struct Folds<__nv_bfloat16, 8> {  // bf16 cannot hold 2^7 + a byte: scale the codes
  static constexpr bool value = false;
};
template <> struct Raw2<__nv_bfloat16, 8> {
  static __device__ __forceinline__ void run(u32, int, u32&, u32&) {}
};
template <typename T> __device__ __forceinline__ u32 ones2();
template <> __device__ __forceinline__ u32 ones2<__half>() { return 0x3C003C00u; }
template <> __device__ __forceinline__ u32 ones2<__nv_bfloat16>() { return 0x3F803F80u; }

template <> struct Deq<__half, 8> {
  static __device__ __forceinline__ void run(u32 w, int, const Group<__half, 8>& g, u32& b0, u32& b1) {
    __half2 v0 = as_t2<__half2>(__byte_perm(w, 0x64646464u, 0x4140));
    __half2 v1 = as_t2<__half2>(__byte_perm(w, 0x64646464u, 0x4342));
    b0 = as_u32(__hmul2(__hsub2(v0, g.zb), g.s));
    b1 = as_u32(__hmul2(__hsub2(v1, g.zb), g.s));
  }
};
template <> struct Deq<__nv_bfloat16, 8> {
  static __device__ __forceinline__ void run(u32 w, int, const Group<__nv_bfloat16, 8>& g, u32& b0,
                                             u32& b1) {
    float f[4];
#pragma unroll
    for (int i = 0; i < 4; i++) f[i] = (__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440 | i)) - g.zb) * g.s;
    b0 = as_u32(__floats2bfloat162_rn(f[0], f[1]));
    b1 = as_u32(__floats2bfloat162_rn(f[2], f[3]));
  }
};

// Group parameters as stored, [groups][Npad]: u32 words (low half zb, high half s) or, for bf16
// 8-bit, float pairs (zb, s); expanded to the dequantizer's form once per chunk.
template <typename T, int BITS> struct Raw {
  typedef u32 type;
  static __device__ __forceinline__ Group<T, BITS> expand(u32 raw) {
    typedef typename Kind<T>::T2 T2;
    Group<T, BITS> g;
    g.zb = as_t2<T2>(__byte_perm(raw, 0, 0x1010));
    g.s = as_t2<T2>(__byte_perm(raw, 0, 0x3232));
    return g;
  }
};
template <> struct Raw<__nv_bfloat16, 8> {
  typedef float2 type;
  static __device__ __forceinline__ Group<__nv_bfloat16, 8> expand(float2 raw) {
    Group<__nv_bfloat16, 8> g;
    g.zb = raw.x;
    g.s = raw.y;
    return g;
  }
};

// The codes of n8 tile `tile`, chunk c (in uint4, lane 0): tiles are stored TG side by side per
// chunk (see wna16_layout.py), so a block reads TG * 512 contiguous bytes per chunk.
constexpr int TG = 4;
__device__ __forceinline__ long long tile_offset(long long tile, long long c, long long chunks) {
  return (((tile / TG) * chunks + c) * TG + tile % TG) * 32;
}

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src));
}
template <int BYTES> __device__ __forceinline__ void cp_async_small(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(smem_addr(dst)), "l"(src), "n"(BYTES));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

}  // namespace qrt

// One block: NT n8 tiles (8*NT output columns) x MT m16 tiles, over the full K, split among the
// block's warps. Each warp streams its chunks through a STAGES-deep ring of asynchronous copies
// in shared memory (each lane copies, and later reads, only its own 16 bytes: no barriers), so
// the bytes in flight do not cost registers. KC inputs per chunk (128 at 4 bits, 64 at 8); GPC
// groups per chunk when a group is shorter than a chunk (else 1). MROWS8: M <= 8, fragment rows
// 8..15 are never loaded. Layouts: w [Npad/8 tiles][chunks][32 lanes] uint4; sz [groups][Npad].
template <typename T, int BITS, int MT, int NT, int GPC, int STAGES, bool MROWS8>
__global__ void wna16_mma(const T* __restrict__ x, const uint4* __restrict__ w, const void* __restrict__ sz,
                          const T* __restrict__ bias, T* __restrict__ y, long long M, long long K,
                          long long ldx, long long ldy, long long N, long long Npad, long long chunks,
                          long long group) {
  using namespace qrt;
  typedef Raw<T, BITS> R;
  typedef typename R::type RawT;
  constexpr int KC = BITS == 4 ? 128 : 64;
  constexpr int TILES = KC / 16;                      // k16 tiles per chunk
  constexpr int TPG = GPC > 1 ? TILES / GPC : TILES;  // k16 tiles per group inside a chunk
  constexpr int STAGE_W = NT * 32;                    // uint4 per stage
  constexpr int STAGE_G = NT * GPC * 32;              // RawT per stage
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int WK = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const long long ntile0 = (long long)blockIdx.x * NT;  // first n8 tile of this block
  const long long m0 = (long long)blockIdx.y * (16 * MT);
  const int Ki = (int)K;

  extern __shared__ uint4 smem[];
  uint4* wring = smem + (size_t)warp * STAGES * (STAGE_W + (STAGE_G * sizeof(RawT) + 15) / 16);
  RawT* gring = reinterpret_cast<RawT*>(wring + STAGES * STAGE_W);

  float acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; i++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int r = 0; r < 4; r++) acc[i][j][r] = 0.f;

  const long long per = (chunks + WK - 1) / WK;  // this warp's chunks: [c0, c1)
  const long long c0 = warp * per;
  const long long c1 = min(chunks, c0 + per);

  const T* xr[MT][2];  // rows g and g + 8 of each m16 tile, where below M
  bool rv[MT][2];
#pragma unroll
  for (int i = 0; i < MT; i++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const long long row = m0 + 16 * i + g + 8 * h;
      rv[i][h] = row < M && !(MROWS8 && h == 1);
      xr[i][h] = x + (rv[i][h] ? row : 0) * ldx;
    }

  const uint4* wl = w + lane;
  const RawT* szr = reinterpret_cast<const RawT*>(sz) + ntile0 * 8 + g;
  auto issue = [&](long long c, int slot) {
#pragma unroll
    for (int j = 0; j < NT; j++) cp_async16(wring + slot * STAGE_W + j * 32 + lane, wl + tile_offset(ntile0 + j, c, chunks));
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int q = 0; q < GPC; q++) {
        const long long gi = (c * KC + q * TPG * 16) / group;
        cp_async_small<sizeof(RawT)>(gring + slot * STAGE_G + (j * GPC + q) * 32 + lane, szr + gi * Npad + j * 8);
      }
  };

#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    if (c0 + s < c1) issue(c0 + s, s);
    cp_async_commit();
  }
  int slot = 0;
  for (long long c = c0; c < c1; c++) {
    {
      const long long nc = c + STAGES - 1;
      int ns = slot + STAGES - 1;
      if (ns >= STAGES) ns -= STAGES;
      if (nc < c1) issue(nc, ns);
      cp_async_commit();
    }
    cp_async_wait<STAGES - 1>();  // chunk c has landed (this lane's own copies)
    uint4 buf[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) buf[j] = wring[slot * STAGE_W + j * 32 + lane];
#pragma unroll
    for (int q = 0; q < GPC; q++) {
      float tmp[MT][NT][4];  // folded: this group's sums of x * (magic + q)
      float sx[MT][4];       // folded: this group's sums of x, per row
#pragma unroll
      for (int kq = 0; kq < TPG; kq++) {
        const int kt = q * TPG + kq;
        const int k = (int)c * KC + kt * 16 + 2 * t;
        u32 a[MT][4];
#pragma unroll
        for (int i = 0; i < MT; i++) {
          a[i][0] = rv[i][0] && k < Ki ? __ldg(reinterpret_cast<const u32*>(xr[i][0] + k)) : 0u;
          a[i][2] = rv[i][0] && k + 8 < Ki ? __ldg(reinterpret_cast<const u32*>(xr[i][0] + k + 8)) : 0u;
          a[i][1] = rv[i][1] && k < Ki ? __ldg(reinterpret_cast<const u32*>(xr[i][1] + k)) : 0u;
          a[i][3] = rv[i][1] && k + 8 < Ki ? __ldg(reinterpret_cast<const u32*>(xr[i][1] + k + 8)) : 0u;
        }
        if (Folds<T, BITS>::value) {
#pragma unroll
          for (int i = 0; i < MT; i++) {
            if (kq == 0) mma0<T>(sx[i], a[i], ones2<T>(), ones2<T>());
            else mma<T>(sx[i], a[i], ones2<T>(), ones2<T>());
          }
        }
#pragma unroll
        for (int j = 0; j < NT; j++) {
          const int wi = BITS == 4 ? kt >> 1 : kt;
          const u32 word = wi == 0 ? buf[j].x : wi == 1 ? buf[j].y : wi == 2 ? buf[j].z : buf[j].w;
          u32 b0, b1;
          if (Folds<T, BITS>::value) {
            Raw2<T, BITS>::run(word, BITS == 4 ? (kt & 1) : 0, b0, b1);
#pragma unroll
            for (int i = 0; i < MT; i++) {
              if (kq == 0) mma0<T>(tmp[i][j], a[i], b0, b1);
              else mma<T>(tmp[i][j], a[i], b0, b1);
            }
          } else {
            const Group<T, BITS> gp = R::expand(gring[slot * STAGE_G + (j * GPC + q) * 32 + lane]);
            Deq<T, BITS>::run(word, BITS == 4 ? (kt & 1) : 0, gp, b0, b1);
#pragma unroll
            for (int i = 0; i < MT; i++) mma<T>(acc[i][j], a[i], b0, b1);
          }
        }
      }
      if (Folds<T, BITS>::value) {  // acc += s * (tmp - zb * sx), for output columns 2t and 2t+1
#pragma unroll
        for (int j = 0; j < NT; j++) {
          const u32 raw = *reinterpret_cast<const u32*>(&gring[slot * STAGE_G + (j * GPC + q) * 32 + lane]);
          const u32 r0 = __shfl_sync(0xffffffffu, raw, 8 * t);      // the lane holding column 2t
          const u32 r1 = __shfl_sync(0xffffffffu, raw, 8 * t + 4);  // and 2t + 1
          typedef typename Kind<T>::T2 T2;
          const T2 p0 = as_t2<T2>(r0), p1 = as_t2<T2>(r1);
          const float zb0 = Kind<T>::to_float(p0.x), s0 = Kind<T>::to_float(p0.y);
          const float zb1 = Kind<T>::to_float(p1.x), s1 = Kind<T>::to_float(p1.y);
#pragma unroll
          for (int i = 0; i < MT; i++) {
            acc[i][j][0] = fmaf(s0, fmaf(-zb0, sx[i][0], tmp[i][j][0]), acc[i][j][0]);
            acc[i][j][1] = fmaf(s1, fmaf(-zb1, sx[i][1], tmp[i][j][1]), acc[i][j][1]);
            acc[i][j][2] = fmaf(s0, fmaf(-zb0, sx[i][2], tmp[i][j][2]), acc[i][j][2]);
            acc[i][j][3] = fmaf(s1, fmaf(-zb1, sx[i][3], tmp[i][j][3]), acc[i][j][3]);
          }
        }
      }
    }
    if (++slot == STAGES) slot = 0;
  }
  cp_async_wait<0>();

  // reduce the WK warps' partial sums through shared memory (reusing the rings), then write y
  constexpr int ROWS = 16 * MT, COLS = 8 * NT;
  float* red = reinterpret_cast<float*>(smem);  // [WK][ROWS][COLS]
  __syncthreads();
  float* mine = red + warp * ROWS * COLS;
#pragma unroll
  for (int i = 0; i < MT; i++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int r = 0; r < 4; r++)
        mine[(16 * i + g + 8 * (r >> 1)) * COLS + 8 * j + 2 * t + (r & 1)] = acc[i][j][r];
  __syncthreads();
  const long long rows = min((long long)ROWS, M - m0);
  for (int e = threadIdx.x; e < rows * COLS; e += blockDim.x) {
    float v = 0.f;
    for (int u = 0; u < WK; u++) v += red[u * ROWS * COLS + e];
    const long long n = ntile0 * 8 + e % COLS;
    if (n < N) {
      if (bias) v += Kind<T>::to_float(bias[n]);
      y[(m0 + e / COLS) * ldy + n] = Kind<T>::from_float(v);
    }
  }
}

// Large M: write chunks [c_begin, c_begin + c_count) of the dequantized weight, [N, ldo] in T,
// for a dense GEMM after. One warp per 8 columns x one chunk, the same lane layout as above; the
// tile is transposed through shared memory so every lane stores whole 16-byte pieces of a row.
template <typename T, int BITS, int GPC>
__global__ void wna16_dequant(const uint4* __restrict__ w, const void* __restrict__ sz, T* __restrict__ out,
                              long long N, long long K, long long Npad, long long chunks, long long c_begin,
                              long long c_count, long long ldo, long long group) {
  using namespace qrt;
  typedef Raw<T, BITS> R;
  typedef typename R::type RawT;
  constexpr int KC = BITS == 4 ? 128 : 64;
  constexpr int TILES = KC / 16;
  constexpr int TPG = GPC > 1 ? TILES / GPC : TILES;
  __shared__ __align__(16) T tile[8][8][KC];  // [warp][row][k]
  const int wid = threadIdx.x >> 5;
  const long long item = (long long)blockIdx.x * (blockDim.x >> 5) + wid;
  const long long ntile = item / c_count, c = c_begin + item % c_count;
  if (ntile * 8 >= N) return;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint4 v = ldg_stream(w + tile_offset(ntile, c, chunks) + lane);
  const long long n = ntile * 8 + g;
  T* trow = tile[wid][g];
#pragma unroll
  for (int kt = 0; kt < TILES; kt++) {
    const int wi = BITS == 4 ? kt >> 1 : kt;
    const u32 word = wi == 0 ? v.x : wi == 1 ? v.y : wi == 2 ? v.z : v.w;
    const long long gi = (c * KC + (GPC > 1 ? (kt / TPG) * TPG * 16 : 0)) / group;
    const Group<T, BITS> gp = R::expand(__ldg(reinterpret_cast<const RawT*>(sz) + gi * Npad + n));
    u32 b0, b1;
    Deq<T, BITS>::run(word, BITS == 4 ? (kt & 1) : 0, gp, b0, b1);
    *reinterpret_cast<u32*>(trow + kt * 16 + 2 * t) = b0;
    *reinterpret_cast<u32*>(trow + kt * 16 + 2 * t + 8) = b1;
  }
  __syncwarp();
  // lane -> row lane / 4, a quarter of the chunk: KC/4 elements as 16-byte pieces
  constexpr int PER = KC / 4, VEC = 16 / sizeof(T);
  const int row = lane >> 2, q = lane & 3;
  const long long nr = ntile * 8 + row;
  if (nr >= N) return;
  const long long k0 = c * KC + q * PER;
  T* dst = out + nr * ldo + (k0 - c_begin * KC);
  const T* src = tile[wid][row] + q * PER;
  if (k0 + PER <= K) {
#pragma unroll
    for (int e = 0; e < PER; e += VEC) *reinterpret_cast<uint4*>(dst + e) = *reinterpret_cast<const uint4*>(src + e);
  } else {
    for (int e = 0; e < PER && k0 + e < K; e++) dst[e] = src[e];
  }
}
