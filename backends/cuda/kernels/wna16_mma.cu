// quantrt: integer weight-only matmul (W4A16, W8A16) on tensor cores, for small batches.
//
// y[M, N] = x[M, K] @ dequant(W)[N, K]^T (+ bias), with x and y in fp16 or bf16 and fp32
// accumulation through mma.sync m16n8k16. Decode-sized M is bound by streaming the weights,
// and (measured with ncu on the H200) by the instructions spent per weight byte, so:
//  * the weights are repacked once at load (quantrt/backends/cuda/wna16_layout.py) so that lane
//    (g, t) of a warp holds, in 16 bytes, the codes of column g for KC/4 consecutive inputs.
//    The mma only needs each lane's inputs to be the same for x and W, so the four lanes t of a
//    k16 tile take inputs t*KC/4 + 4*tile + {0..3}: x then arrives as 16-byte vectors too;
//  * codes become fp16/bf16 pairs by bit tricks (a nibble or byte OR-ed into the mantissa of a
//    power of two); with one group per chunk, zero point and scale are applied once per group
//    on the fp32 sums (s * (sum x(magic + q) - (magic + z) sum x), sum x from an mma against
//    ones), otherwise per pair as (v - zb) * s;
//  * for small M the operands swap (W is the 16-row A operand, x the 8-column B operand), so one
//    mma covers 16 output columns and the lane that loaded a column's codes also holds its sums;
//  * each warp streams its share of K (codes and group parameters) through a ring of asynchronous
//    copies; warps side by side over N share the ring's x slices, so x is read once per block;
//    the block's K groups reduce through shared memory, so one launch writes the output: no
//    workspace, no atomics, deterministic, graph-safe. 32-bit index math only.
#include "wna16_common.cuh"

// One block: WN warps side by side over N, each with NT n8 tiles (8*NT*WN output columns of the
// block), times WK groups of them splitting K; grid (row blocks, column blocks). The WN warps of
// a group share one copy of each chunk's x slice, so x is read from L2 once per 8*NT*WN columns:
// at M = 32..64 the x traffic, not the weights, otherwise fills the L2-to-SM path.
// SWAP: up to XR rows of x (XR <= 8, or a multiple of 8 up to 64: XR/8 n8 parts) as the mma's B
// operand, W as A (NT even). Otherwise MT m16 tiles of rows (XR = 16*MT) as A, W as B. FOLD: zero
// point and scale applied per group on the sums (needs one group per chunk). GPC: groups per
// chunk (1 when a group spans whole chunks, chunk c then uses group c >> cpg_log2). Layouts:
// w [Npad/8/TG][chunks][TG][32] uint4, sz [groups][Npad]; x rows 16-byte aligned (ldx % 8 == 0).
// Column blocks may run past Npad (the last one, when 8*NT*WN does not divide it): those warps
// read tile 0 instead and their columns are never stored. cs (nullable): an fp32 factor per
// column applied to the sums before the bias (fp4 and code-book scales keep their range there);
// book: the LUT4 code book (see Book), null for other codes.
// ROUTED (the fused MoE entry, wna16_moe): the block's rows are expert-sorted assignments (Routing)
// instead of rows m0.. of x and y.
struct Routing {
  const int* __restrict__ sid;  // row r of block b is assignment sid[b * ROWS + r]; A or more: padding
  const float* __restrict__ tw;  // routing weight per assignment, multiplied into its row (nullable)
  int A, row_div;               // assignments; assignment a reads x row a / row_div, writes y row a
};

template <typename T, int CODE, int MT, int NT, int WN, int GPC, int STAGES, int XR, bool SWAP, bool FOLD,
          bool ROUTED>
__device__ __forceinline__ void mma_block(const T* __restrict__ x, const uint4* __restrict__ w,
                                          const void* __restrict__ sz, const T* __restrict__ bias,
                                          const float* __restrict__ cs, const unsigned int* __restrict__ book,
                                          T* __restrict__ y, long long M_, long long K_, long long ldx_,
                                          long long ldy_, long long N_, long long Npad_, long long chunks_,
                                          long long cpg_log2_, const Routing rt) {
  using namespace qrt;
  constexpr int BITS = code_bits(CODE);
  constexpr bool ZP = has_zero(CODE);
  typedef typename Param<T, CODE>::type P;
  constexpr int KC = BITS == 4 ? 128 : 64;
  constexpr int TILES = KC / 16;       // k16 tiles per chunk
  constexpr int LK = KC / 4;           // inputs per lane per chunk
  constexpr int XP = KC / 8;           // 16-byte pieces per row of a chunk of x
  constexpr int GL = KC / GPC;         // inputs per group, when groups are shorter than a chunk
  constexpr int NP = GPC * NT * 8;     // group parameters per warp and chunk
  constexpr int SW = NT * 32;          // uint4 of codes per warp and stage
  constexpr int SX = XR * XP;          // uint4 of x per stage (shared by the group's WN warps)
  constexpr int SP = (NP * (int)sizeof(P) + 15) / 16;  // uint4 of parameters per warp and stage
  constexpr int WST = SW + SP;
  constexpr int STAGE = SX + WN * WST;
  constexpr int ROWS = SWAP ? XR : 16 * MT;
  constexpr int PARTS = SWAP ? (XR + 7) / 8 : 1;  // n8 parts of x rows, swapped
  static_assert(!SWAP || (MT == 1 && NT % 2 == 0 && XR <= 64 && (XR <= 8 || XR % 8 == 0)), "swap shape");
  static_assert(SWAP || XR == 16 * MT, "x rows staged = rows covered");
  static_assert(!FOLD || GPC == 1, "folding needs one group per chunk");
  static_assert(STAGES >= 2 && WN >= 1 && WN <= 16, "ring depth, warps over N");
  const int M = (int)M_, K = (int)K_, ldx = (int)ldx_, ldy = (int)ldy_, N = (int)N_, Npad = (int)Npad_;
  const int chunks = (int)chunks_, cpg_log2 = (int)cpg_log2_;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, WK = blockDim.x / (32 * WN);
  const int wn = warp % WN, wk = warp / WN;
  const int gl = wn * 32 + lane;  // this thread in its K group (x is copied by the whole group)
  const int g = lane >> 2, t = lane & 3;
  // blockIdx.x walks the row blocks of one column block: blocks that read the same weights run
  // side by side, so all but the first read them from L2
  const int bt0 = blockIdx.y * NT * WN;  // the block's first n8 tile
  const int ntile0 = bt0 + wn * NT;      // this warp's
  const int src0 = ntile0 < Npad / 8 ? ntile0 : 0;
  const int m0 = blockIdx.x * ROWS;
  const int rows = ROUTED ? ROWS : min(ROWS, M - m0);  // rows of this block (ROUTED: some may be padding)

  extern __shared__ uint4 smem[];
  uint4* ring = smem + wk * STAGES * STAGE;
  Book<CODE> bk;
  bk.load(book);

  constexpr int ACC = SWAP ? NT / 2 * PARTS : MT * NT;
  constexpr int SXN = SWAP ? PARTS : MT;
  float acc[ACC][4];
#pragma unroll
  for (int i = 0; i < ACC; i++)
#pragma unroll
    for (int r = 0; r < 4; r++) acc[i][r] = 0.f;

  const int per = (chunks + WK - 1) / WK;  // this group's chunks: [c0, c1)
  const int c0 = wk * per;
  const int c1 = min(chunks, c0 + per);

  // Per-lane sources of the next chunk to copy: chunks are issued in order, so each copy only
  // advances its pointers by one chunk. The n8 tiles of a warp never straddle a TG group except
  // whole groups (NT divides TG or TG divides NT): tile j is group j / TG, offset j % TG.
  constexpr int NG = (NT + TG - 1) / TG;
  const uint4* wsrc[NG];
#pragma unroll
  for (int q = 0; q < NG; q++) wsrc[q] = w + tile_base(src0 + q * TG, chunks) + c0 * (TG * 32) + lane;
  constexpr int XU = (SX + 32 * WN - 1) / (32 * WN);  // x pieces per thread and chunk (rows past M: none)
  const T* xsrc[XU];
  int xdst[XU], xleft[XU];  // xleft: inputs of this piece's row left from the piece on
  bool xok[XU];
#pragma unroll
  for (int u = 0; u < XU; u++) {
    const int p = gl + 32 * WN * u, r = p / XP, L = p % XP;
    long long xrow = m0 + r;
    xok[u] = r < rows;
    if constexpr (ROUTED) {
      const int a = xok[u] ? rt.sid[m0 + r] : rt.A;
      xok[u] = a < rt.A;
      xrow = xok[u] ? a / rt.row_div : 0;
    }
    xsrc[u] = x + (xok[u] ? xrow : 0) * ldx + c0 * KC + L * 8;
    xdst[u] = r * XP + xslot<BITS>(r, L);
    xleft[u] = K - c0 * KC - L * 8;
  }
  constexpr int PG = NT * 8 * (int)sizeof(P) / 16;  // uint4 per group's row of parameters
  static_assert(PG >= 1 && 32 % PG == 0, "whole 16-byte pieces per group row (byte scales: NT >= 2); lane p "
                "and p + 32 copy the same column piece");
  constexpr int PU = (SP + 31) / 32;
  const uint4* psrc = reinterpret_cast<const uint4*>(reinterpret_cast<const P*>(sz) + src0 * 8) + lane % PG;
  const long long prow = (long long)Npad * (int)sizeof(P) / 16;  // uint4 per group row
  int cnext = c0;

  auto issue = [&](int slot) {
    uint4* st = ring + slot * STAGE;
    uint4* mine = st + SX + wn * WST;
#pragma unroll
    for (int j = 0; j < NT; j++) cp_async16(mine + j * 32 + lane, wsrc[j / TG] + (j % TG) * 32);
#pragma unroll
    for (int q = 0; q < NG; q++) wsrc[q] += TG * 32;
#pragma unroll
    for (int u = 0; u < XU; u++) {
      const int bytes = max(0, min(16, xleft[u] * (int)sizeof(T)));
      if (xok[u]) cp_async16_fill(st + xdst[u], bytes ? xsrc[u] : x, bytes);
      xsrc[u] += KC;
      xleft[u] -= KC;
    }
#pragma unroll
    for (int u = 0; u < PU; u++) {
      const int p = lane + 32 * u;
      const int gi = GPC == 1 ? (cnext >> cpg_log2) : cnext * GPC + p / PG;
      if (p < SP) cp_async16(mine + SW + p, psrc + gi * prow);
    }
    cnext++;
  };

#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    if (c0 + s < c1) issue(s);
    cp_async_commit();
  }
  int slot = 0;
  for (int c = c0; c < c1; c++) {
    // chunk c has landed (this thread's copies); the barrier makes the group's copies visible
    // and says every warp of the group is done with chunk c - 1, whose slot is refilled next
    cp_async_wait<STAGES - 2>();
    group_sync<WN>(wk);
    {
      int ns = slot + STAGES - 1;
      if (ns >= STAGES) ns -= STAGES;
      if (c + STAGES - 1 < c1) issue(ns);
      cp_async_commit();
    }
    const uint4* xs = ring + slot * STAGE;
    const uint4* st = xs + SX + wn * WST;
    const P* prm = reinterpret_cast<const P*>(st + SW);
    uint4 wv[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) wv[j] = st[j * 32 + lane];

    float tmp[FOLD ? ACC : 1][4];  // this chunk's sums, before zero point and scale
    float sx[SXN][4];              // sums of x over the chunk, per row (FOLD, codes with a zero point)
    if constexpr (!ZP) {
#pragma unroll
      for (int i = 0; i < SXN; i++)
#pragma unroll
        for (int r = 0; r < 4; r++) sx[i][r] = 0.f;  // zb is 0 too: the fix-up adds nothing
    }

#pragma unroll
    for (int kp = 0; kp < TILES / 2; kp++) {  // pairs of k16 tiles: one 16-byte piece of x per row
      constexpr int XROWS = SWAP ? PARTS : 2 * MT;
      uint4 xv[XROWS];
#pragma unroll
      for (int h = 0; h < XROWS; h++) {
        const int r = SWAP ? (XR >= 8 ? 8 * h + g : (g < XR ? g : 0)) : 16 * (h >> 1) + g + 8 * (h & 1);
        const int L = t * (LK / 8) + kp;
        xv[h] = xs[r * XP + xslot<BITS>(r, L)];
      }
#pragma unroll
      for (int kh = 0; kh < 2; kh++) {
        const int kt = 2 * kp + kh;
        const bool first = kp == 0 && kh == 0;
        if constexpr (SWAP) {
          u32 xlo[PARTS], xhi[PARTS];
#pragma unroll
          for (int pi = 0; pi < PARTS; pi++) {
            xlo[pi] = kh ? xv[pi].z : xv[pi].x;
            xhi[pi] = kh ? xv[pi].w : xv[pi].y;
          }
          if constexpr (FOLD) {
#pragma unroll
            for (int pi = 0; pi < (ZP ? PARTS : 0); pi++)
              mma<T>(sx[pi], first, Kind<T>::ones2(), Kind<T>::ones2(), Kind<T>::ones2(), Kind<T>::ones2(),
                     xlo[pi], xhi[pi]);
#pragma unroll
            for (int v = 0; v < virtual_tiles<T, CODE>(); v++) {
              u32 xb0[PARTS], xb1[PARTS];
#pragma unroll
              for (int pi = 0; pi < PARTS; pi++) folded_x<T, CODE>(xlo[pi], xhi[pi], v, xb0[pi], xb1[pi]);
              const int vt = kt * virtual_tiles<T, CODE>() + v;
#pragma unroll
              for (int j2 = 0; j2 < NT / 2; j2++) {
                u32 a0, a1, a2, a3;
                folded_codes<T, CODE>(wv[2 * j2], vt, a0, a2);
                folded_codes<T, CODE>(wv[2 * j2 + 1], vt, a1, a3);
#pragma unroll
                for (int pi = 0; pi < PARTS; pi++)
                  mma<T>(tmp[j2 * PARTS + pi], first && v == 0, a0, a1, a2, a3, xb0[pi], xb1[pi]);
              }
            }
          } else {
            const int q = GPC == 1 ? 0 : (t * LK + kt * 4) / GL;
#pragma unroll
            for (int j2 = 0; j2 < NT / 2; j2++) {
              u32 a0, a1, a2, a3;
              Deq<T, CODE>::run(wv[2 * j2], kt, prm[q * NT * 8 + 16 * j2 + g], c, a0, a2, bk);
              Deq<T, CODE>::run(wv[2 * j2 + 1], kt, prm[q * NT * 8 + 16 * j2 + 8 + g], c, a1, a3, bk);
#pragma unroll
              for (int pi = 0; pi < PARTS; pi++) mma<T>(acc[j2 * PARTS + pi], false, a0, a1, a2, a3, xlo[pi], xhi[pi]);
            }
          }
        } else {
          u32 lo[MT][2], hi[MT][2];  // rows g, g+8 of each m16 tile: inputs (4kt, +1) and (+2, +3)
#pragma unroll
          for (int i = 0; i < MT; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
              lo[i][h] = kh ? xv[2 * i + h].z : xv[2 * i + h].x;
              hi[i][h] = kh ? xv[2 * i + h].w : xv[2 * i + h].y;
            }
          if constexpr (FOLD) {
#pragma unroll
            for (int i = 0; i < (ZP ? MT : 0); i++)
              mma<T>(sx[i], first, lo[i][0], lo[i][1], hi[i][0], hi[i][1], Kind<T>::ones2(), Kind<T>::ones2());
#pragma unroll
            for (int v = 0; v < virtual_tiles<T, CODE>(); v++) {
              u32 A[MT][4];
#pragma unroll
              for (int i = 0; i < MT; i++) {
                folded_x<T, CODE>(lo[i][0], hi[i][0], v, A[i][0], A[i][2]);
                folded_x<T, CODE>(lo[i][1], hi[i][1], v, A[i][1], A[i][3]);
              }
              const int vt = kt * virtual_tiles<T, CODE>() + v;
#pragma unroll
              for (int j = 0; j < NT; j++) {
                u32 b0, b1;
                folded_codes<T, CODE>(wv[j], vt, b0, b1);
#pragma unroll
                for (int i = 0; i < MT; i++)
                  mma<T>(tmp[i * NT + j], first && v == 0, A[i][0], A[i][1], A[i][2], A[i][3], b0, b1);
              }
            }
          } else {
            const int q = GPC == 1 ? 0 : (t * LK + kt * 4) / GL;
#pragma unroll
            for (int j = 0; j < NT; j++) {
              u32 b0, b1;
              Deq<T, CODE>::run(wv[j], kt, prm[q * NT * 8 + 8 * j + g], c, b0, b1, bk);
#pragma unroll
              for (int i = 0; i < MT; i++)
                mma<T>(acc[i * NT + j], false, lo[i][0], lo[i][1], hi[i][0], hi[i][1], b0, b1);
            }
          }
        }
      }
    }
    if constexpr (FOLD) {  // acc += s * (tmp - zb * sum x) for this chunk's group
      if constexpr (SWAP) {  // c0, c1: column g of tile 2j2 (x rows 2t, 2t+1 of the part); c2, c3: of tile 2j2+1
#pragma unroll
        for (int j2 = 0; j2 < NT / 2; j2++) {
          float za, sa, zb2, sb;
          zb_s<T>(prm[16 * j2 + g], za, sa);
          zb_s<T>(prm[16 * j2 + 8 + g], zb2, sb);
#pragma unroll
          for (int pi = 0; pi < PARTS; pi++) {
            float* a = acc[j2 * PARTS + pi];
            const float* tp = tmp[j2 * PARTS + pi];
            a[0] = fmaf(sa, fmaf(-za, sx[pi][0], tp[0]), a[0]);
            a[1] = fmaf(sa, fmaf(-za, sx[pi][1], tp[1]), a[1]);
            a[2] = fmaf(sb, fmaf(-zb2, sx[pi][0], tp[2]), a[2]);
            a[3] = fmaf(sb, fmaf(-zb2, sx[pi][1], tp[3]), a[3]);
          }
        }
      } else {  // c0, c2: column 2t (rows g, g+8); c1, c3: column 2t+1
#pragma unroll
        for (int j = 0; j < NT; j++) {
          float z0, s0, z1, s1;
          zb_s<T>(prm[8 * j + 2 * t], z0, s0);
          zb_s<T>(prm[8 * j + 2 * t + 1], z1, s1);
#pragma unroll
          for (int i = 0; i < MT; i++) {
            float* a = acc[i * NT + j];
            const float* tp = tmp[i * NT + j];
            a[0] = fmaf(s0, fmaf(-z0, sx[i][0], tp[0]), a[0]);
            a[1] = fmaf(s1, fmaf(-z1, sx[i][1], tp[1]), a[1]);
            a[2] = fmaf(s0, fmaf(-z0, sx[i][2], tp[2]), a[2]);
            a[3] = fmaf(s1, fmaf(-z1, sx[i][3], tp[3]), a[3]);
          }
        }
      }
    }
    if (++slot == STAGES) slot = 0;
  }
  cp_async_wait<0>();

  // reduce the K groups' partial sums through shared memory (reusing the rings), then write y
  constexpr int COLS = 8 * NT * WN;
  float* red = reinterpret_cast<float*>(smem);  // [WK][ROWS][COLS]
  __syncthreads();
  float* mine = red + wk * ROWS * COLS + wn * 8 * NT;
  if constexpr (SWAP) {
#pragma unroll
    for (int j2 = 0; j2 < NT / 2; j2++)
#pragma unroll
      for (int pi = 0; pi < PARTS; pi++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
          const int m = 8 * pi + 2 * t + (r & 1), n = 16 * j2 + g + 8 * (r >> 1);
          if (m < ROWS) mine[m * COLS + n] = acc[j2 * PARTS + pi][r];
        }
  } else {
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int r = 0; r < 4; r++)
          mine[(16 * i + g + 8 * (r >> 1)) * COLS + 8 * j + 2 * t + (r & 1)] = acc[i * NT + j][r];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < rows * COLS; e += blockDim.x) {
    const int n = bt0 * 8 + e % COLS;
    long long yrow = m0 + e / COLS;
    if constexpr (ROUTED) yrow = rt.sid[yrow];
    if (n < N && (!ROUTED || yrow < rt.A)) {
      float v = 0.f;
      for (int u = 0; u < WK; u++) v += red[u * ROWS * COLS + e];
      if (cs) v *= cs[n];
      if (bias) v += Kind<T>::to_float(bias[n]);
      if (ROUTED && rt.tw) v *= rt.tw[yrow];
      y[yrow * ldy + n] = Kind<T>::from_float(v);
    }
  }
}

template <typename T, int CODE, int MT, int NT, int WN, int GPC, int STAGES, int XR, bool SWAP, bool FOLD>
__global__ void wna16_mma(const T* __restrict__ x, const uint4* __restrict__ w, const void* __restrict__ sz,
                          const T* __restrict__ bias, const float* __restrict__ cs,
                          const unsigned int* __restrict__ book, T* __restrict__ y, long long M_, long long K_,
                          long long ldx_, long long ldy_, long long N_, long long Npad_, long long chunks_,
                          long long cpg_log2_) {
  mma_block<T, CODE, MT, NT, WN, GPC, STAGES, XR, SWAP, FOLD, false>(
      x, w, sz, bias, cs, book, y, M_, K_, ldx_, ldy_, N_, Npad_, chunks_, cpg_log2_, Routing{});
}

// Fused MoE: every expert of one projection in one launch, y[a] = (x[a / row_div] . W[e]^T + bias[e])
// * tw[a], for the assignments of the routing sorted by expert and padded per expert to tiles of ROWS
// (quantrt.moe.ExpertBatch.aligned): block row b multiplies the ROWS assignments sid[b * ROWS ..] by
// expert bexp[b]'s weights (w, sz, cs, bias offset by that expert's strides); rows from npad[0] on
// have nothing to do. The last block row stores zeros into the rows of assignments to experts held
// elsewhere, order[offs[E]] .. order[A - 1] (the tail of the expert-sorted order), so y needs no memset.
template <typename T, int CODE, int MT, int NT, int WN, int GPC, int STAGES, int XR, bool SWAP, bool FOLD>
__global__ void wna16_moe(const T* __restrict__ x, const uint4* __restrict__ w, const void* __restrict__ sz,
                          const T* __restrict__ bias, const float* __restrict__ cs,
                          const unsigned int* __restrict__ book, T* __restrict__ y, long long K_, long long ldx_,
                          long long ldy_, long long N_, long long Npad_, long long chunks_, long long cpg_log2_,
                          const int* __restrict__ sid, const int* __restrict__ bexp, const int* __restrict__ npad,
                          const float* __restrict__ tw, const long long* __restrict__ order,
                          const long long* __restrict__ offs, long long A_, long long E_, long long row_div_,
                          long long w_stride, long long sz_stride) {
  constexpr int ROWS = SWAP ? XR : 16 * MT;
  constexpr int COLS = 8 * NT * WN;
  const int N = (int)N_, A = (int)A_;
  if (blockIdx.x == gridDim.x - 1) {  // zero the rows of unheld assignments, this block's columns
    const int n0 = blockIdx.y * COLS;
    for (long long i = offs[E_] * COLS + threadIdx.x; i < (long long)A * COLS; i += blockDim.x) {
      const int n = n0 + (int)(i % COLS);
      if (n < N) y[order[i / COLS] * ldy_ + n] = qrt::Kind<T>::from_float(0.f);
    }
    return;
  }
  if ((int)blockIdx.x * ROWS >= npad[0]) return;
  const long long e = bexp[blockIdx.x];
  mma_block<T, CODE, MT, NT, WN, GPC, STAGES, XR, SWAP, FOLD, true>(
      x, w + e * w_stride, static_cast<const unsigned char*>(sz) + e * sz_stride, bias ? bias + e * N_ : bias,
      cs ? cs + e * N_ : cs, book, y, (long long)A, K_, ldx_, ldy_, N_, Npad_, chunks_, cpg_log2_,
      Routing{sid, tw, A, (int)row_div_});
}

// Large M: write chunks [c_begin, c_begin + c_count) of the dequantized weight, [N, ldo] in T,
// for a dense GEMM after. One warp per 8 columns x one chunk (8 warps per block): lane (g, t)
// decodes KC/4 consecutive inputs of column g; the warp then stores whole rows, lanes in order.
template <typename T, int CODE, int GPC>
__global__ void wna16_dequant(const uint4* __restrict__ w, const void* __restrict__ sz, const unsigned int* __restrict__ book,
                              T* __restrict__ out,
                              long long N_, long long K_, long long Npad_, long long chunks_, long long c_begin_,
                              long long c_count_, long long ldo_, long long cpg_log2_) {
  using namespace qrt;
  constexpr int BITS = code_bits(CODE);
  typedef typename Param<T, CODE>::type P;
  constexpr int KC = BITS == 4 ? 128 : 64;
  constexpr int TILES = KC / 16;
  constexpr int LK = KC / 4;
  constexpr int GL = KC / GPC;
  const int N = (int)N_, Npad = (int)Npad_, chunks = (int)chunks_, c_begin = (int)c_begin_;
  const int c_count = (int)c_count_, cpg_log2 = (int)cpg_log2_;
  constexpr int RP = KC / 8;  // 16-byte pieces per row of a chunk
  __shared__ uint4 stage[8][8 * RP];  // [warp][row * RP + piece]: 8 warps per block
  const int wid = threadIdx.x >> 5;
  const int item = blockIdx.x * (blockDim.x >> 5) + wid;
  Book<CODE> bk;
  bk.load(book);  // before any thread leaves
  if (item >= (N + 7) / 8 * c_count) return;  // whole warps only
  const int ntile = item / c_count, c = c_begin + item % c_count;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int n = ntile * 8 + g;  // rows past N (up to Npad) hold padding: decoded, never stored
  const uint4 v = ldg_stream(w + tile_base(ntile, chunks) + c * (TG * 32) + lane);
  const P* szc = reinterpret_cast<const P*>(sz) + n;
  u32 o[2 * TILES];
#pragma unroll
  for (int kt = 0; kt < TILES; kt++) {
    const int gi = GPC == 1 ? (c >> cpg_log2) : c * GPC + (t * LK + kt * 4) / GL;
    Deq<T, CODE>::run(v, kt, __ldg(szc + (long long)gi * Npad), c, o[2 * kt], o[2 * kt + 1], bk);
  }
  // lane (g, t) holds pieces t*TILES/2 .. of row g; regroup through shared memory so that
  // consecutive lanes store consecutive 16-byte pieces of a row (whole sectors)
#pragma unroll
  for (int e = 0; e < TILES / 2; e++)
    stage[wid][g * RP + t * (TILES / 2) + e] = make_uint4(o[4 * e], o[4 * e + 1], o[4 * e + 2], o[4 * e + 3]);
  __syncwarp();
#pragma unroll
  for (int e = 0; e < 8 * RP / 32; e++) {
    const int q = lane + 32 * e, row = q / RP, piece = q % RP;
    const int nr = ntile * 8 + row;
    if (nr < N)
      reinterpret_cast<uint4*>(out + (long long)nr * ldo_ + (c - c_begin) * KC)[piece] = stage[wid][q];
  }
}
