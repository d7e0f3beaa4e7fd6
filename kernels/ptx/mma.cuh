// Tensor-core matrix products of one warp (mma.sync, ldmatrix; sm_80+, NVIDIA
// only). HIP builds use the MFMA wrappers of kernels/attention/matrix_core.cuh instead.
#pragma once

#include "../vendor/map.cuh"

// Tensor-core feature macro: kernel files test it, not vendors.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define UKV_HAS_MMA_BF16 1
#endif

// Tensor-core fragments (m16n8k16, bf16 in, f32 accumulate). Layouts follow the
// PTX ISA: A row-major 16x16 (4 regs), B column-major 16x8 (2 regs), C/D 16x8 f32.
#if !defined(__HIPCC__)
__device__ __forceinline__ void ukv_ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ukv_ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ukv_mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// The same with f16 inputs (every FP8 value is an f16, and f16 products are
// exact in the f32 accumulation).
__device__ __forceinline__ void ukv_mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif  // !__HIPCC__
