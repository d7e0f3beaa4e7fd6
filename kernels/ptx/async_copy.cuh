// Asynchronous global->shared copies: 16-byte cp.async (sm_80+; a plain copy
// elsewhere, HIP included) and bulk copies completing on an mbarrier (sm_90+,
// NVIDIA only; kernels/ptx/mbarrier.cuh waits for them).
#pragma once

#include "../vendor/map.cuh"

// Async-copy feature macro: kernel files test it, not vendors.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define UKV_HAS_CP_ASYNC 1
#endif

// 16-byte asynchronous global->shared copy; `valid == false` fills zeros and
// reads nothing (the source must still be a mapped address). The copy and the
// waits clobber memory, so the compiler keeps plain shared-memory accesses on
// their side of them.
__device__ __forceinline__ void ukv_cp_async16(void* smem, const void* gmem, bool valid) {
#if defined(UKV_HAS_CP_ASYNC)
  uint32_t dst = (uint32_t)__cvta_generic_to_shared(smem);
  int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(bytes) : "memory");
#else
  *reinterpret_cast<uint4*>(smem) = valid ? *reinterpret_cast<const uint4*>(gmem) : make_uint4(0, 0, 0, 0);
#endif
}
// 8-byte asynchronous global->shared copy (both addresses 8-byte aligned),
// in the same commit groups as ukv_cp_async16.
__device__ __forceinline__ void ukv_cp_async8(void* smem, const void* gmem) {
#if defined(UKV_HAS_CP_ASYNC)
  uint32_t dst = (uint32_t)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(gmem) : "memory");
#else
  *reinterpret_cast<uint2*>(smem) = *reinterpret_cast<const uint2*>(gmem);
#endif
}
__device__ __forceinline__ void ukv_cp_async_commit() {
#if defined(UKV_HAS_CP_ASYNC)
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void ukv_cp_async_wait() {
#if defined(UKV_HAS_CP_ASYNC)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
// Waits for every cp.async this thread issued, committed or not: wait_group
// counts committed groups only and leaves uncommitted copies in flight.
__device__ __forceinline__ void ukv_cp_async_wait_all() {
#if defined(UKV_HAS_CP_ASYNC)
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// Bulk copies (sm_90+): one instruction moves a contiguous run of bytes from
// global into shared memory through the copy engine and completes on an
// mbarrier, without the per-SM cap on outstanding 16-byte cp.async requests.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define UKV_HAS_BULK_COPY 1
#endif

#if !defined(__HIPCC__)
// A shared-memory address as the 32-bit offset PTX instructions take.
__device__ __forceinline__ uint32_t ukv_smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global `src`
// to shared `dst`, completing on `bar`.
__device__ __forceinline__ void ukv_bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(UKV_HAS_BULK_COPY)
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          ukv_smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(ukv_smem_addr(bar))
      : "memory");
#endif
}
#endif  // !__HIPCC__
