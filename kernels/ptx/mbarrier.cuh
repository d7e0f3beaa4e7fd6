// mbarriers (sm_90+, NVIDIA only): the barriers bulk copies and cp.async
// arrivals complete on (kernels/ptx/async_copy.cuh).
#pragma once

#include "../vendor/map.cuh"
#include "async_copy.cuh"

#if !defined(__HIPCC__)
// mbarrier: one phase per fill of a buffer; its arrivals (some announcing the
// bytes a bulk copy will deliver) and those bytes complete a phase.
__device__ __forceinline__ void ukv_mbar_init(uint64_t* bar, int arrivals) {
#if defined(UKV_HAS_BULK_COPY)
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(ukv_smem_addr(bar)), "r"(arrivals) : "memory");
#endif
}
// Makes initialized barriers visible to the async proxy (and the cluster).
__device__ __forceinline__ void ukv_mbar_init_fence() {
#if defined(UKV_HAS_BULK_COPY)
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void ukv_mbar_arrive_expect(uint64_t* bar, uint32_t bytes) {
#if defined(UKV_HAS_BULK_COPY)
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(ukv_smem_addr(bar)), "r"(bytes)
               : "memory");
#endif
}
// The waiting thread sleeps until the phase completes (or the 10 ms suspend
// hint runs out, then it tries again) instead of spinning on the barrier,
// which would take issue slots and shared-memory bandwidth from the warps it
// waits for.
__device__ __forceinline__ void ukv_mbar_wait(uint64_t* bar, uint32_t parity) {
#if defined(UKV_HAS_BULK_COPY)
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1, %2;\n"
      "@!done bra WAIT;\n}\n" ::"r"(ukv_smem_addr(bar)),
      "r"(parity), "r"(10000000u)
      : "memory");
#endif
}
__device__ __forceinline__ void ukv_mbar_arrive(uint64_t* bar) {
#if defined(UKV_HAS_BULK_COPY)
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(ukv_smem_addr(bar)) : "memory");
#endif
}
// One of `bar`'s expected arrivals, made once every cp.async this thread has
// issued so far has landed (a phase then also covers those copies).
__device__ __forceinline__ void ukv_cp_async_mbar_arrive(uint64_t* bar) {
#if defined(UKV_HAS_BULK_COPY)
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(ukv_smem_addr(bar)) : "memory");
#endif
}
#endif  // !__HIPCC__
