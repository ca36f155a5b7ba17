// quantrt: integer weight-only matmul (W4A16, W8A16) on Hopper's warpgroup MMA (wgmma, sm_90a),
// for M = 16..256, where mma.sync runs out of tensor throughput (ncu on the H200: at M=64 the
// mma.sync kernel kept the tensor pipe 43% busy for 1.0x cuBLAS; wgmma drives it at about twice
// the rate per instruction issued).
//
// The operands are swapped as in wna16_mma.cu: W is the 64-row A operand of
// wgmma.m64nXRk16, dequantized in registers by the four warps of a warpgroup (warp w: columns
// 16w..16w+15, n8 tiles 2w and 2w+1 of the repacked layout, exactly the mma.sync A fragment),
// and XR rows of x are the B operand, read by the tensor cores from shared memory. The repacked
// layout gives lane t of a k16 tile the inputs t*KC/4 + 4kt + {0, 1} (register a0, a1) and
// {2, 3} (a2, a3); wgmma reads B in its canonical order (k = 2t + e, 2t + 8 + e), so the caller
// passes x with each chunk's inputs in that order (wna16_layout.wgmma_x_order), zero-padded to
// whole chunks. Codes, group parameters and x slices stream through a cp.async ring per K group
// as in wna16_mma.cu; K groups reduce through shared memory; one launch, no workspace.
//
// Each warpgroup keeps one chunk's wgmmas in flight while it dequantizes the next (wait_group 1),
// so the tensor cores run during the dequantization. The chunk loop is unrolled by two over two
// fragment buffers, each written only by its own chunk's dequantization, after the wait that
// retired the wgmmas that last read it; the accumulators are fenced around each chunk's wgmmas.
// A ring slot is refilled only once every warpgroup of the K group retired the wgmmas reading it,
// which costs the ring one slot of lead (see the main loop).
#include "wna16_common.cuh"

namespace qrt {

template <typename T, int N> struct Wgmma;  // d (N/2 fp32 per thread) += A (registers) x B (descriptor)
template <> struct Wgmma<__nv_bfloat16, 16> {
  static __device__ __forceinline__ void run(float* d, u32 a0, u32 a1, u32 a2, u32 a3, unsigned long long b) {
    asm volatile(
        "{.reg .pred p; setp.ne.b32 p, %13, 0; "
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
  }
};
template <> struct Wgmma<__half, 16> {
  static __device__ __forceinline__ void run(float* d, u32 a0, u32 a1, u32 a2, u32 a3, unsigned long long b) {
    asm volatile(
        "{.reg .pred p; setp.ne.b32 p, %13, 0; "
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
  }
};
template <> struct Wgmma<__nv_bfloat16, 32> {
  static __device__ __forceinline__ void run(float* d, u32 a0, u32 a1, u32 a2, u32 a3, unsigned long long b) {
    asm volatile(
        "{.reg .pred p; setp.ne.b32 p, %21, 0; "
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
  }
};
template <> struct Wgmma<__half, 32> {
  static __device__ __forceinline__ void run(float* d, u32 a0, u32 a1, u32 a2, u32 a3, unsigned long long b) {
    asm volatile(
        "{.reg .pred p; setp.ne.b32 p, %21, 0; "
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
  }
};
template <> struct Wgmma<__nv_bfloat16, 64> {
  static __device__ __forceinline__ void run(float* d, u32 a0, u32 a1, u32 a2, u32 a3, unsigned long long b) {
    asm volatile(
        "{.reg .pred p; setp.ne.b32 p, %37, 0; "
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
  }
};
template <> struct Wgmma<__half, 64> {
  static __device__ __forceinline__ void run(float* d, u32 a0, u32 a1, u32 a2, u32 a3, unsigned long long b) {
    asm volatile(
        "{.reg .pred p; setp.ne.b32 p, %37, 0; "
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
  }
};
template <> struct Wgmma<__nv_bfloat16, 128> {
  static __device__ __forceinline__ void run(float* d, u32 a0, u32 a1, u32 a2, u32 a3, unsigned long long b) {
    asm volatile(
        "{.reg .pred p; setp.ne.b32 p, %69, 0; "
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 0;}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
  }
};
template <> struct Wgmma<__half, 128> {
  static __device__ __forceinline__ void run(float* d, u32 a0, u32 a1, u32 a2, u32 a3, unsigned long long b) {
    asm volatile(
        "{.reg .pred p; setp.ne.b32 p, %69, 0; "
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 0;}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
  }
};
template <> struct Wgmma<__nv_bfloat16, 256> {
  static __device__ __forceinline__ void run(float* d, u32 a0, u32 a1, u32 a2, u32 a3, unsigned long long b) {
    asm volatile(
        "{.reg .pred p; setp.ne.b32 p, %133, 0; "
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, {%128,%129,%130,%131}, %132, p, 1, 1, 0;}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
  }
};
template <> struct Wgmma<__half, 256> {
  static __device__ __forceinline__ void run(float* d, u32 a0, u32 a1, u32 a2, u32 a3, unsigned long long b) {
    asm volatile(
        "{.reg .pred p; setp.ne.b32 p, %133, 0; "
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, {%128,%129,%130,%131}, %132, p, 1, 1, 0;}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
  }
};

// B descriptor, K-major without swizzle: core matrices of 8 rows x 16 bytes; the two k halves of
// a k16 tile 128 bytes apart (leading byte offset), consecutive 8-row groups 256 bytes apart
// (stride byte offset). Checked on the H200 against a dense product (ci/dev/wgmma_probe.py).
__device__ __forceinline__ unsigned long long kmajor_desc(const void* p) {
  return (unsigned long long)((smem_addr(p) & 0x3FFFF) >> 4) | (8ull << 16) | (16ull << 32);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// shared memory written by cp.async (the generic proxy) and read next by wgmma (the async proxy)
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// Pins the accumulators at this point (as CUTLASS's warpgroup_fence_operand): no instruction that
// reads or writes them moves into a stretch where wgmmas are in flight.
template <int N> __device__ __forceinline__ void fence_acc(float (&acc)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(acc[i])::"memory");
}

}  // namespace qrt

// One block: WGN warpgroups side by side over N (64 columns each), times WK groups of them
// splitting K; grid (row blocks of XR rows, column blocks of 64*WGN columns). x: [M][chunks*KC]
// in wgmma order (ldx % 8 == 0, 16-byte aligned); w, sz as in wna16_mma; y [M][ldy].
template <typename T, int BITS, int XR, int WGN, int GPC, int STAGES>
__global__ void wna16_wgmma(const T* __restrict__ x, const uint4* __restrict__ w, const void* __restrict__ sz,
                            const T* __restrict__ bias, T* __restrict__ y, long long M_, long long ldx_,
                            long long ldy_, long long N_, long long Npad_, long long chunks_, long long cpg_log2_) {
  using namespace qrt;
  typedef typename Param<T, BITS>::type P;
  constexpr int KC = BITS == 4 ? 128 : 64;
  constexpr int TILES = KC / 16;
  constexpr int LK = KC / 4;
  constexpr int XP = KC / 8;  // 16-byte pieces per row of a chunk of x
  constexpr int GL = KC / GPC;
  constexpr int NT = 2;        // n8 tiles per warp: the 16 rows of its part of the A operand
  constexpr int WN = 4 * WGN;  // warps side by side over N
  constexpr int NP = GPC * NT * 8;
  constexpr int SW = NT * 32;
  constexpr int SX = XR * XP;
  constexpr int SP = (NP * (int)sizeof(P) + 15) / 16;
  constexpr int WST = SW + SP;
  constexpr int STAGE = SX + WN * WST;
  constexpr int ACC = XR / 2;
  static_assert(XR % 16 == 0 && XR <= 256 && STAGES >= 2, "wgmma n, ring depth");
  const int M = (int)M_, ldx = (int)ldx_, ldy = (int)ldy_, N = (int)N_, Npad = (int)Npad_;
  const int chunks = (int)chunks_, cpg_log2 = (int)cpg_log2_;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, WK = blockDim.x / (32 * WN);
  const int wn = warp % WN, wk = warp / WN;
  const int gl = wn * 32 + lane;
  const int g = lane >> 2, t = lane & 3;
  const int bt0 = blockIdx.y * NT * WN;
  const int ntile0 = bt0 + wn * NT;
  const int src0 = ntile0 < Npad / 8 ? ntile0 : 0;
  const int m0 = blockIdx.x * XR;
  const int rows = min(XR, M - m0);

  extern __shared__ uint4 smem[];
  uint4* ring = smem + wk * STAGES * STAGE;

  float acc[ACC];
#pragma unroll
  for (int i = 0; i < ACC; i++) acc[i] = 0.f;

  const int per = (chunks + WK - 1) / WK;
  const int c0 = wk * per;
  const int c1 = min(chunks, c0 + per);

  const uint4* wsrc = w + tile_base(src0, chunks) + c0 * (TG * 32) + lane;
  // x: thread gl copies piece xl of rows xr0 + XRU u; XRU is a multiple of 8, so the pieces' slots
  // are a constant apart and one pointer with one stride stands for all of them (registers are
  // short with two fragment buffers beside the accumulators).
  constexpr int XU = (SX + 32 * WN - 1) / (32 * WN);
  constexpr int XRU = 32 * WN / XP;
  static_assert(XRU % 8 == 0, "rows xr0 + XRU u share xr0's place in its 8-row group");
  const int xr0 = gl / XP, xl = gl % XP;
  const T* xsrc = x + (long long)(m0 + (xr0 < rows ? xr0 : 0)) * ldx + c0 * KC + xl * 8;
  const long long xstep = (long long)XRU * ldx;
  // tile L/2, k half L%2, 8-row group r/8, row r%8: the canonical no-swizzle K-major layout
  const int xdst = (xl >> 1) * (XR * 2) + (xr0 >> 3) * 16 + (xl & 1) * 8 + (xr0 & 7);
  constexpr int PG = NT * 8 * (int)sizeof(P) / 16;
  static_assert(32 % PG == 0, "lane p and p + 32 copy the same column piece");
  constexpr int PU = (SP + 31) / 32;
  const uint4* psrc = reinterpret_cast<const uint4*>(reinterpret_cast<const P*>(sz) + src0 * 8) + lane % PG;
  const long long prow = (long long)Npad * (int)sizeof(P) / 16;
  int cnext = c0;

  auto issue = [&](int slot) {
    uint4* st = ring + slot * STAGE;
    uint4* mine = st + SX + wn * WST;
#pragma unroll
    for (int j = 0; j < NT; j++) cp_async16(mine + j * 32 + lane, wsrc + j * 32);
    wsrc += TG * 32;
#pragma unroll
    for (int u = 0; u < XU; u++)
      if (xr0 + XRU * u < rows) cp_async16(st + xdst + u * (XRU / 8) * 16, xsrc + u * xstep);
    xsrc += KC;
#pragma unroll
    for (int u = 0; u < PU; u++) {
      const int p = lane + 32 * u;
      const int gi = GPC == 1 ? (cnext >> cpg_log2) : cnext * GPC + p / PG;
      if (p < SP) cp_async16(mine + SW + p, psrc + gi * prow);
    }
    cnext++;
  };

  // Chunk j sits in ring slot (j - c0) % STAGES. One chunk's wgmmas stay in flight while the
  // next is dequantized, so at the top of chunk c (past the barrier, which every warp reaches
  // after chunk c - 1's wait_group 1) chunk c - 1's slot is still being read and chunk c - 2's is
  // the one free: it takes chunk c + STAGES - 2, so copies run STAGES - 2 chunks ahead. A ring of
  // two has no slot to spare there; it refills chunk c - 1's slot with chunk c + 1 after chunk c's
  // wait_group 1 and a second barrier (chunk c + 1's copies then overlap chunk c's wgmmas only).
  constexpr int AHEAD = STAGES > 2 ? STAGES - 2 : 1;
#pragma unroll
  for (int s = 0; s < AHEAD; s++) {
    if (c0 + s < c1) issue(s);
    cp_async_commit();
  }
  int slot = 0;
  // One chunk into fragments a, last read by the wgmmas of two chunks ago (retired by the previous
  // chunk's wait). Two buffers, never copied into each other: fragments moved between buffers are
  // non-wgmma writes to registers of wgmmas in flight, which ptxas serializes (C7513), and one
  // buffer rewritten by a rolled loop is a race that ptxas compiles without a word.
  auto chunk = [&](int c, u32(&a)[TILES][4]) {
    cp_async_wait<AHEAD - 1>();
    fence_async_smem();
    group_sync<WN>(wk);  // chunk c visible to the group (and to wgmma); chunk c - 2's slot is free
    if constexpr (STAGES > 2) {
      int ns = slot + STAGES - 2;
      if (ns >= STAGES) ns -= STAGES;
      if (c + AHEAD < c1) issue(ns);
      cp_async_commit();
    }
    const uint4* xs = ring + slot * STAGE;
    const uint4* st = xs + SX + wn * WST;
    const P* prm = reinterpret_cast<const P*>(st + SW);
    const uint4 w0 = st[lane], w1 = st[32 + lane];
#pragma unroll
    for (int kt = 0; kt < TILES; kt++) {
      const int q = GPC == 1 ? 0 : (t * LK + kt * 4) / GL;
      Deq<T, BITS>::run(w0, kt, prm[q * NT * 8 + g], c, a[kt][0], a[kt][2], Book<BITS>{});
      Deq<T, BITS>::run(w1, kt, prm[q * NT * 8 + 8 + g], c, a[kt][1], a[kt][3], Book<BITS>{});
    }
    // tile kt's descriptor: the address field (low bits, 16-byte units) moved by the tile's offset
    const unsigned long long xd = kmajor_desc(xs);
    fence_acc(acc);
    wgmma_fence();
#pragma unroll
    for (int kt = 0; kt < TILES; kt++)
      Wgmma<T, XR>::run(acc, a[kt][0], a[kt][1], a[kt][2], a[kt][3], xd + kt * XR * 2);
    wgmma_commit();
    wgmma_wait<1>();  // chunk c - 1's wgmmas retired: its fragments and its ring slot are free
    fence_acc(acc);
    if constexpr (STAGES == 2) {
      group_sync<WN>(wk);  // every warp of the group past chunk c - 1's wgmmas
      if (c + 1 < c1) issue(slot ^ 1);
      cp_async_commit();
    }
    if (++slot == STAGES) slot = 0;
  };
  u32 aA[TILES][4], aB[TILES][4];
  int c = c0;
  for (; c + 1 < c1; c += 2) {
    chunk(c, aA);
    chunk(c + 1, aB);
  }
  if (c < c1) chunk(c, aA);  // an odd count: chunk c - 1 (in aB) may still be in flight
  wgmma_wait<0>();
  fence_acc(acc);
  cp_async_wait<0>();

  // d[4j + r]: A row (column of y) 16w + g + 8(r >> 1), B column (row of x) 8j + 2t + (r & 1)
  constexpr int COLS = 8 * NT * WN;
  float* red = reinterpret_cast<float*>(smem);  // [WK][XR][COLS]
  __syncthreads();
  float* mine = red + wk * XR * COLS + wn * 8 * NT;
#pragma unroll
  for (int j = 0; j < XR / 8; j++)
#pragma unroll
    for (int r = 0; r < 4; r++) mine[(8 * j + 2 * t + (r & 1)) * COLS + g + 8 * (r >> 1)] = acc[4 * j + r];
  __syncthreads();
  for (int e = threadIdx.x; e < rows * COLS; e += blockDim.x) {
    const int n = bt0 * 8 + e % COLS;
    if (n < N) {
      float v = 0.f;
      for (int u = 0; u < WK; u++) v += red[u * XR * COLS + e];
      if (bias) v += Kind<T>::to_float(bias[n]);
      y[(long long)(m0 + e / COLS) * ldy + n] = Kind<T>::from_float(v);
    }
  }
}
