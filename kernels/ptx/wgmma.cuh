// Hopper warpgroup MMA (wgmma, sm_90a, NVIDIA only) with its descriptors,
// fences and the warpgroup register reallocation.
#pragma once

#include "../vendor/map.cuh"
#include "async_copy.cuh"

#if !defined(__HIPCC__)
// Warpgroup MMA (Hopper wgmma, sm_90a only): a 128-thread warpgroup multiplies
// operands read straight from shared memory through 64-bit descriptors.
// Kernels test UKV_HAS_WGMMA; the host asks ukv::device_facts (shim.cuh).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define UKV_HAS_WGMMA 1
#endif

// Warpgroup register reallocation (sm_90a): every thread of a warpgroup
// executes it together; `inc` waits until the block's pool, which a `dec`
// elsewhere in the block refills, holds the registers. N is the new per-thread
// count (24..256, a multiple of 8); the kernel needs launch bounds so ptxas
// knows the count at entry.
template <int N>
__device__ __forceinline__ void ukv_setmaxnreg_inc() {
#if defined(UKV_HAS_WGMMA)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void ukv_setmaxnreg_dec() {
#if defined(UKV_HAS_WGMMA)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

// Descriptor of a 128-byte-swizzled operand (PTX "matrix descriptor"): start
// address, leading- and stride-dimension byte offsets, swizzle mode 1. The
// swizzle XORs address bits 4-6 with bits 7-9, so operand tiles must start on
// 1024-byte boundaries; stepping the start by 32 bytes inside an atom selects
// the next 16 k-elements of a K-major operand.
__device__ __forceinline__ uint64_t ukv_wgmma_desc(const void* smem, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
  return (uint64_t)((a & 0x3FFFFu) >> 4) | ((uint64_t)((lbo_bytes >> 4) & 0x3FFFu) << 16) |
         ((uint64_t)((sbo_bytes >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}
// Orders this thread's earlier register and shared-memory accesses before the
// warpgroup's next wgmma (needed after touching accumulators or operands).
__device__ __forceinline__ void ukv_wgmma_fence() {
#if defined(UKV_HAS_WGMMA)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void ukv_wgmma_commit() {
#if defined(UKV_HAS_WGMMA)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void ukv_wgmma_wait() {
#if defined(UKV_HAS_WGMMA)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Makes this thread's generic-proxy shared-memory writes (st.shared, cp.async)
// visible to the async proxy that wgmma reads operands through.
__device__ __forceinline__ void ukv_fence_async_shared() {
#if defined(UKV_HAS_BULK_COPY)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Keeps the compiler from moving accumulator accesses across an in-flight wgmma.
template <int N>
__device__ __forceinline__ void ukv_wgmma_fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D[64 x 64] (+)= A[64 x 16] . B[64 x 16]^T, both K-major in shared memory.
__device__ __forceinline__ void ukv_wgmma_m64n64k16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
#if defined(UKV_HAS_WGMMA)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#endif
}
// D[64 x 64] (+)= A[64 x 32] . B[64 x 32]^T on e4m3 codes, both K-major in
// shared memory (the only FP8 operand layout). The tensor core keeps a
// narrower sum than f32 inside the instruction and across accumulating calls
// (about 13 mantissa bits on Hopper), so callers bound their error by it.
__device__ __forceinline__ void ukv_wgmma_m64n64k32_e4m3(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
#if defined(UKV_HAS_WGMMA)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#endif
}
// D[64 x 128] (+)= A[64 x 16] . B[16 x 128]: A K-major, B MN-major (transposed).
__device__ __forceinline__ void ukv_wgmma_m64n128k16_bt(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
#if defined(UKV_HAS_WGMMA)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#endif
}
// D[64 x N] (+)= A[64 x 16] . B[N x 16]^T, N = 16 or 32: A in registers
// (each warp's 16 rows as the mma.sync m16k16 fragment), B K-major in shared
// memory; bf16 operands, or f16 with kF16. (The operand type is part of the
// instruction's text, hence one asm statement per type from one macro.)
#define UKV_WGMMA_RA_M64N16(type)                                                                           \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"                                                \
               "wgmma.mma_async.sync.aligned.m64n16k16.f32." type "." type                                  \
               " {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"                         \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))
#define UKV_WGMMA_RA_M64N32(type)                                                                             \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                                  \
               "wgmma.mma_async.sync.aligned.m64n32k16.f32." type "." type                                    \
               " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),   \
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),        \
                 "+f"(d[15])                                                                                  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))
template <bool kF16 = false>
__device__ __forceinline__ void ukv_wgmma_m64n16k16_ra(float (&d)[8], const uint32_t (&a)[4], uint64_t desc_b,
                                                       int accumulate = 1) {
#if defined(UKV_HAS_WGMMA)
  if constexpr (kF16) {
    UKV_WGMMA_RA_M64N16("f16");
  } else {
    UKV_WGMMA_RA_M64N16("bf16");
  }
#endif
}
template <bool kF16 = false>
__device__ __forceinline__ void ukv_wgmma_m64n32k16_ra(float (&d)[16], const uint32_t (&a)[4], uint64_t desc_b,
                                                       int accumulate = 1) {
#if defined(UKV_HAS_WGMMA)
  if constexpr (kF16) {
    UKV_WGMMA_RA_M64N32("f16");
  } else {
    UKV_WGMMA_RA_M64N32("bf16");
  }
#endif
}
#undef UKV_WGMMA_RA_M64N16
#undef UKV_WGMMA_RA_M64N32
#endif  // !__HIPCC__
