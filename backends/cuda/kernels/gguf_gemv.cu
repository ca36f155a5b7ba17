// quantrt: GGUF GEMV for small batches, reading the per-field planes of
// quantrt/backends/triton/gguf.py (gguf_planes: llama.cpp's block bytes, split by field, each
// plane row 16-byte aligned). y[m, n] = sum_k x[m, k] w[n, k] (+ bias[n]) for q4_k and q6_k.
//
// Work split. A block owns R weight rows and XM rows of x; its W warps (blockDim.y) deal out K in
// "steps" (one step: every lane decodes one 16-byte run of codes per row, 1024 or 2048 weights per
// warp), each lane keeps fp32 sums per (x row, weight row), then the warp and the block reduce.
//
// Decode without integer-to-float conversions (a quarter-rate instruction): a code u < 128 is
// moved by one byte permute into bits 16..22 of the float 0x3F000000, giving exactly 0.5 + u/256,
// so a run's sum S = sum_i f_i x_i = X/2 + (sum_i u_i x_i)/256 with X = sum_i x_i (shared by the
// R rows). The sub-block scale and offset fold into two coefficients per run, A*S - B*X. The
// cancellation loses at most log2(1 + 128/u_mean) bits of fp32's 24. (q8_0 was written this way
// too and measured slower than the Triton GEMV on the H200, which keeps it: see gguf_gemv.py.)
// tests/cpu/test_gguf_gemv_emulated.py compiles the per-lane decode (qg::Step) as host C++ with
// QG_HOST_SHIM defined, its stand-ins for the CUDA intrinsics, against gguf-py's dequantizer.
#ifndef QG_HOST_SHIM
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif

namespace qg {

typedef unsigned int u32;

// type ids, as backends/triton/gguf.py numbers them (the order of BLOCKS)
constexpr int Q4_K = 7;
constexpr int Q6_K = 9;

template <typename T> struct Act;
template <> struct Act<__nv_bfloat16> {
  static __device__ __forceinline__ void unpack(u32 w, float& a, float& b) {
    a = __uint_as_float(w << 16);
    b = __uint_as_float(w & 0xFFFF0000u);
  }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
  static __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
};
template <> struct Act<__half> {
  static __device__ __forceinline__ void unpack(u32 w, float& a, float& b) {
    __half2 h = *reinterpret_cast<__half2*>(&w);
    float2 f = __half22float2(h);
    a = f.x;
    b = f.y;
  }
  static __device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
  static __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
};

// 16 activations starting at p (32-byte aligned) as fp32, and their sum
template <typename T>
__device__ __forceinline__ float load_x16(const T* p, float* f) {
  const uint4* q = reinterpret_cast<const uint4*>(p);
  uint4 a = __ldg(q), b = __ldg(q + 1);
  u32 w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    Act<T>::unpack(w[i], f[2 * i], f[2 * i + 1]);
    s += f[2 * i] + f[2 * i + 1];
  }
  return s;
}

// byte b of t (a value below 128) as the float 0.5 + t_b / 256
__device__ __forceinline__ float byte_f(u32 t, int b) {
  return __uint_as_float(__byte_perm(t, 0x3F000000u, 0x7044u | (b << 8)));
}

// sum over a 16-byte run's bytes (each below 128, 4 per word) of (0.5 + u/256) x
__device__ __forceinline__ float dot16(const u32* t, const float* x) {
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < 4; ++c)
#pragma unroll
    for (int b = 0; b < 4; ++b) s = fmaf(byte_f(t[c], b), x[4 * c + b], s);
  return s;
}

__device__ __forceinline__ uint4 ld_stream(const unsigned char* p) {
  return __ldcs(reinterpret_cast<const uint4*>(p));
}

__device__ __forceinline__ float half_at(const void* p, long long i) {
  return __half2float(reinterpret_cast<const __half*>(p)[i]);
}

__device__ __forceinline__ u32 byte_of(u32 w, int i) { return (w >> (8 * i)) & 0xFFu; }

// One type: its step size and the work of one lane in one step, for R rows and XM x rows.
template <int TYPE> struct Step;

// q4_k: planes head uint8 [N, K/256*16] (d, dmin, 12 scale bytes), qs uint8 [N, K/2].
// A lane takes 16 code bytes: 16 low nibbles (sub-block 2j) and 16 high (2j+1).
template <> struct Step<Q4_K> {
  static constexpr int WEIGHTS = 1024;
  static __device__ __forceinline__ long long units(long long K) { return K / 256; }
  template <typename T, int R, int XM>
  static __device__ __forceinline__ void run(int step, int lane, long long K, const T* const* xr,
                                             const unsigned char* const* p, const long long* rows,
                                             float (&acc)[XM][R]) {
    const long long sb = (long long)step * 4 + (lane >> 3);
    if (sb >= K / 256) return;
    const int part = lane & 7;  // 16-byte run of the super-block's 128 code bytes
    const int j = part >> 1;    // 64-weight chunk: sub-blocks 2j (low nibbles) and 2j+1 (high)
    const long long k0 = sb * 256 + j * 64 + (part & 1) * 16;
    uint4 q[R], h[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      q[r] = ld_stream(p[1] + rows[r] * (K / 2) + sb * 128 + part * 16);
      h[r] = ld_stream(p[0] + rows[r] * (K / 16) + sb * 16);
    }
    float al[R], bl[R], ah[R], bh[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float d = __half2float(__ushort_as_half((unsigned short)(h[r].x & 0xFFFFu)));
      const float dmin = __half2float(__ushort_as_half((unsigned short)(h[r].x >> 16)));
      // llama.cpp's get_scale_min_k4 for sub-blocks 2j and 2j + 1
      u32 sl, ml, sh, mh;
      if (j < 2) {
        sl = byte_of(h[r].y, 2 * j) & 63;
        ml = byte_of(h[r].z, 2 * j) & 63;
        sh = byte_of(h[r].y, 2 * j + 1) & 63;
        mh = byte_of(h[r].z, 2 * j + 1) & 63;
      } else {
        const int i = 2 * j - 4;
        sl = (byte_of(h[r].w, i) & 15) | ((byte_of(h[r].y, i) >> 6) << 4);
        ml = (byte_of(h[r].w, i) >> 4) | ((byte_of(h[r].z, i) >> 6) << 4);
        sh = (byte_of(h[r].w, i + 1) & 15) | ((byte_of(h[r].y, i + 1) >> 6) << 4);
        mh = (byte_of(h[r].w, i + 1) >> 4) | ((byte_of(h[r].z, i + 1) >> 6) << 4);
      }
      // d sc sum(q x) - dmin m X with sum(q x) = 256 S - 128 X
      al[r] = 256.f * d * (float)sl;
      bl[r] = fmaf(128.f * d, (float)sl, dmin * (float)ml);
      ah[r] = 256.f * d * (float)sh;
      bh[r] = fmaf(128.f * d, (float)sh, dmin * (float)mh);
    }
#pragma unroll
    for (int m = 0; m < XM; ++m)
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {  // sub-block 2j (low nibbles), then 2j + 1 (high)
        float xs[16];
        const float X = load_x16(xr[m] + k0 + 32 * hi, xs);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int sh = 4 * hi;
          const u32 c[4] = {(q[r].x >> sh) & 0x0F0F0F0Fu, (q[r].y >> sh) & 0x0F0F0F0Fu,
                            (q[r].z >> sh) & 0x0F0F0F0Fu, (q[r].w >> sh) & 0x0F0F0F0Fu};
          acc[m][r] = fmaf(hi ? ah[r] : al[r], dot16(c, xs), fmaf(-(hi ? bh[r] : bl[r]), X, acc[m][r]));
        }
      }
  }
};

// q6_k: planes ql uint8 [N, K/2], qh uint8 [N, K/4], scales int8 [N, K/16], d fp16 [N, K/256].
// A lane takes 16 high-bit bytes of one half super-block (128 weights), so 16 weights in each of
// its four 32-weight quarters, each quarter's 16 sharing one scale (llama.cpp's dequantize_row_q6_K).
template <> struct Step<Q6_K> {
  static constexpr int WEIGHTS = 2048;
  static __device__ __forceinline__ long long units(long long K) { return K / 256; }
  template <typename T, int R, int XM>
  static __device__ __forceinline__ void run(int step, int lane, long long K, const T* const* xr,
                                             const unsigned char* const* p, const long long* rows,
                                             float (&acc)[XM][R]) {
    const long long sb = (long long)step * 8 + (lane >> 2);
    if (sb >= K / 256) return;
    const int hf = (lane >> 1) & 1;  // half of the super-block
    const int is = lane & 1;         // 16-weight run within each quarter: scale index is + 2g
    const int l0 = is * 16;
    const long long k0 = sb * 256 + hf * 128 + l0;
    uint4 qa[R], qb[R], qh[R];
    float a[R][4];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const unsigned char* ql = p[0] + rows[r] * (K / 2) + sb * 128 + hf * 64 + l0;
      qa[r] = ld_stream(ql);
      qb[r] = ld_stream(ql + 32);
      qh[r] = ld_stream(p[1] + rows[r] * (K / 4) + sb * 64 + hf * 32 + l0);
      const uint2 sc = __ldcs(reinterpret_cast<const uint2*>(p[2] + rows[r] * (K / 16) + sb * 16 + hf * 8));
      const float d = 256.f * half_at(p[3], rows[r] * (K / 256) + sb);
      const u32 s8[2] = {sc.x, sc.y};
#pragma unroll
      for (int g = 0; g < 4; ++g) {
        const int i = is + 2 * g;
        a[r][g] = d * (float)(signed char)byte_of(s8[i >> 2], i & 3);
      }
    }
#pragma unroll
    for (int m = 0; m < XM; ++m)
#pragma unroll
      for (int g = 0; g < 4; ++g) {  // quarter g: weights 32 g + l0 .. + 16 of the half
        float xs[16];
        const float X = load_x16(xr[m] + k0 + 32 * g, xs);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const uint4 lo = g & 1 ? qb[r] : qa[r];  // ql bytes l (quarters 0, 2) or l + 32 (1, 3)
          const u32 L[4] = {lo.x, lo.y, lo.z, lo.w};
          const u32 H[4] = {qh[r].x, qh[r].y, qh[r].z, qh[r].w};
          u32 c[4];
#pragma unroll
          for (int i = 0; i < 4; ++i)  // low nibble (quarters 0, 1) or high (2, 3), then qh bits 2g, 2g + 1
            c[i] = ((L[i] >> (g & 2 ? 4 : 0)) & 0x0F0F0F0Fu) | (((H[i] >> (2 * g)) << 4) & 0x30303030u);
          // d sc sum((q - 32) x) = d sc (256 S - 160 X)
          acc[m][r] = fmaf(a[r][g], fmaf(-0.625f, X, dot16(c, xs)), acc[m][r]);
        }
      }
  }
};

}  // namespace qg

// Launch: grid (ceil(N / R), ceil(M / XM)), block (32, W); every argument 8 bytes.
// Rows past N or M are clamped for loads and never stored.
template <typename T, int TYPE, int R, int XM>
__global__ void __launch_bounds__(256) gguf_gemv(const T* __restrict__ x, const unsigned char* __restrict__ p0,
                                                 const unsigned char* __restrict__ p1,
                                                 const unsigned char* __restrict__ p2,
                                                 const unsigned char* __restrict__ p3, const T* __restrict__ bias,
                                                 T* __restrict__ y, long long M, long long K, long long N,
                                                 long long sx, long long sy) {
  using namespace qg;
  typedef Step<TYPE> S;
  const int lane = threadIdx.x, warp = threadIdx.y, W = blockDim.y;
  const long long n0 = (long long)blockIdx.x * R, m0 = (long long)blockIdx.y * XM;
  const unsigned char* p[4] = {p0, p1, p2, p3};
  long long rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = n0 + r < N ? n0 + r : N - 1;
  const T* xr[XM];
#pragma unroll
  for (int m = 0; m < XM; ++m) xr[m] = x + (m0 + m < M ? m0 + m : M - 1) * sx;
  float acc[XM][R];
#pragma unroll
  for (int m = 0; m < XM; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = 0.f;
  const long long steps = (K + S::WEIGHTS - 1) / S::WEIGHTS;
  for (long long s = warp; s < steps; s += W) S::template run<T, R, XM>((int)s, lane, K, xr, p, rows, acc);
#pragma unroll
  for (int m = 0; m < XM; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v = acc[m][r];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
      acc[m][r] = v;
    }
  __shared__ float red[8][XM * R];
  if (lane == 0) {
#pragma unroll
    for (int m = 0; m < XM; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r) red[warp][m * R + r] = acc[m][r];
  }
  __syncthreads();
  const int t = warp * 32 + lane;
  if (t < XM * R) {
    const int m = t / R, r = t % R;
    if (m0 + m < M && n0 + r < N) {
      float v = 0.f;
      for (int w = 0; w < W; ++w) v += red[w][t];
      if (bias != nullptr) v += Act<T>::to_float(bias[n0 + r]);
      y[(m0 + m) * sy + n0 + r] = Act<T>::from_float(v);
    }
  }
}
