// Grid-level features of sm_90+: programmatic dependent launch and thread-block
// clusters. Elsewhere (older GPUs, HIP) the calls compile to nothing.
#pragma once

#include "../vendor/map.cuh"

// Programmatic dependent launch: the primary lets dependents start early; the
// dependent waits for the primary's completion and memory before reading it.
__device__ __forceinline__ void ukv_pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void ukv_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Thread-block clusters (sm_90+): a barrier over every thread of the cluster's
// blocks (release/acquire: shared-memory writes before it are visible to the
// other blocks after it), and the address of a variable in block `rank`'s
// shared memory (distributed shared memory, read with ordinary loads).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define UKV_HAS_CLUSTER 1
#endif
__device__ __forceinline__ void ukv_cluster_sync() {
#if defined(UKV_HAS_CLUSTER)
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}
// The two halves of an execution-only cluster barrier, apart: a block arrives
// early (after initializing an mbarrier other blocks signal, behind
// ukv_mbar_init_fence) and waits only before it first signals another block.
__device__ __forceinline__ void ukv_cluster_arrive_relaxed() {
#if defined(UKV_HAS_CLUSTER)
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void ukv_cluster_wait() {
#if defined(UKV_HAS_CLUSTER)
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
#endif
}
// The cluster barrier before a block exits, after the blocks have read each
// other's shared memory (the loaded values already used, so the reads are
// done): an execution barrier only. ukv_cluster_sync's release issues a GPU-scope
// fence (MEMBAR.ALL.GPU in SASS), which waits for the block's output stores
// to complete: about 2 of a 20 us batch-1 decode (bench/notes/v34.md).
__device__ __forceinline__ void ukv_cluster_sync_exit() {
  ukv_cluster_arrive_relaxed();
  ukv_cluster_wait();
}
template <typename T>
__device__ __forceinline__ const T* ukv_cluster_map(const T* smem, int rank) {
#if defined(UKV_HAS_CLUSTER)
  uint64_t out;
  asm volatile("mapa.u64 %0, %1, %2;\n" : "=l"(out) : "l"(smem), "r"(rank));
  return reinterpret_cast<const T*>(out);
#else
  (void)rank;
  return smem;
#endif
}
