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

// Distributed shared memory of a thread-block cluster: the address of `p`'s
// offset in block `rank`'s shared memory, in the shared::cluster window.
__device__ __forceinline__ uint32_t ukv_cluster_smem_addr(const void* p, int rank) {
  uint32_t out = 0;
#if defined(UKV_HAS_BULK_COPY)
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(ukv_smem_addr(p)), "r"(rank));
#else
  (void)p;
  (void)rank;
#endif
  return out;
}
// This block's rank in its cluster.
__device__ __forceinline__ int ukv_cluster_rank() {
  uint32_t r = 0;
#if defined(UKV_HAS_BULK_COPY)
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
  return (int)r;
}
// st.async: 16 (or 4) bytes into the shared memory of another block of the
// cluster (addresses from ukv_cluster_smem_addr), completing their bytes on
// that block's mbarrier at `remote_bar`. The completion releases the store at
// cluster scope, so the receiving block's plain wait on its own barrier sees
// it: no cluster-scope fence or acquire on either side.
__device__ __forceinline__ void ukv_st_async16(uint32_t addr, uint4 v, uint32_t remote_bar) {
#if defined(UKV_HAS_BULK_COPY)
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(
                   addr),
               "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(remote_bar)
               : "memory");
#else
  (void)addr;
  (void)v;
  (void)remote_bar;
#endif
}
__device__ __forceinline__ void ukv_st_async4(uint32_t addr, uint32_t v, uint32_t remote_bar) {
#if defined(UKV_HAS_BULK_COPY)
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(addr), "r"(v),
               "r"(remote_bar)
               : "memory");
#else
  (void)addr;
  (void)v;
  (void)remote_bar;
#endif
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) of this block's
// shared memory at `src` into another block of the cluster (`dst` from
// ukv_cluster_smem_addr) by the copy engine, completing on that block's
// mbarrier at `remote_bar`. The writing threads' generic stores to `src` must
// be ordered before it by ukv_fence_async_shared and a barrier.
__device__ __forceinline__ void ukv_bulk_copy_to_peer(uint32_t dst, const void* src, uint32_t bytes,
                                                      uint32_t remote_bar) {
#if defined(UKV_HAS_BULK_COPY)
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   dst),
               "r"(ukv_smem_addr(src)), "r"(bytes), "r"(remote_bar)
               : "memory");
#else
  (void)dst;
  (void)src;
  (void)bytes;
  (void)remote_bar;
#endif
}
// One relaxed arrival, by the threads with `arrive` set, on the mbarrier at
// `bar`'s offset in block `rank` of the cluster. It orders nothing: it serves
// to say that reads this thread has completed (a finished wgmma's) are done,
// and a release at cluster scope costs a MEMBAR.GPU + ERRBAR per arrival (7%
// of the 128-head pair's consumer samples, bench/notes/v36.md). A predicated
// instruction rather than a branch: a branch around it in a loop holding
// accumulators made ptxas spill them.
__device__ __forceinline__ void ukv_mbar_arrive_cluster_if(uint64_t* bar, int rank, bool arrive) {
#if defined(UKV_HAS_BULK_COPY)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.u32 p, %1, 0;\n"
      "@p mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [%0];\n}\n" ::"r"(ukv_cluster_smem_addr(bar, rank)),
      "r"((uint32_t)arrive)
      : "memory");
#endif
}
#endif  // !__HIPCC__
