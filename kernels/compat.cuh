// The only file that names the GPU vendor's runtime, types and intrinsics.
// Kernel files use the ukv_* names below; a HIP build maps them to hip* here.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(UKV_WAVE_EMULATION)
// Host build of the logical-warp helpers (warp.cuh) for
// cpp-tests/wave_emulation.cpp, which supplies the HIP builtins on emulated
// lanes: only the HIP warp intrinsics, nothing of the runtime or of the rest.
#include "compat_hip_warp.cuh"
#elif defined(__HIPCC__)
#include <hip/hip_runtime.h>

typedef hipStream_t ukv_stream_t;
typedef hipError_t ukv_error_t;
// bf16 as its 16 bits: ROCm 5.x ships hip_bfloat16.h and 6.x hip_bf16.h with
// different types, and kernels only move bf16 bits and convert them through
// the ukv_* helpers below, which round exactly as the CUDA intrinsics do.
struct ukv_bf16 {
  uint16_t bits;
};
struct ukv_bf16x2 {
  ukv_bf16 lo, hi;
};

#define UKV_SUCCESS hipSuccess
#define ukv_get_device hipGetDevice
#define ukv_set_device hipSetDevice
#define ukv_get_device_count hipGetDeviceCount
#define ukv_malloc hipMalloc
#define ukv_free hipFree
#define ukv_memcpy_async hipMemcpyAsync
#define ukv_memset_async hipMemsetAsync
#define ukv_stream_synchronize hipStreamSynchronize
#define ukv_get_last_error hipGetLastError
#define ukv_peek_at_last_error hipPeekAtLastError
#define ukv_get_error_string hipGetErrorString
#define ukv_func_set_max_dynamic_smem(f, bytes) \
  hipFuncSetAttribute((const void*)(f), hipFuncAttributeMaxDynamicSharedMemorySize, (bytes))
// No L1/shared carveout or cluster settings on AMD GPUs.
#define ukv_func_set_max_smem_carveout(f) (((void)(f)), hipSuccess)
#define ukv_device_get_attribute hipDeviceGetAttribute
#define ukv_func_allow_large_clusters(f) (((void)(f)), hipSuccess)
#define UKV_ATTR_SM_COUNT hipDeviceAttributeMultiprocessorCount
#define UKV_ATTR_MAX_SMEM_OPTIN hipDeviceAttributeSharedMemPerBlockOptin
#define UKV_ATTR_CC_MAJOR hipDeviceAttributeComputeCapabilityMajor

// A plain launch: HIP has neither programmatic dependent launch nor clusters,
// so `enable` is ignored and `cluster_z` must be 1.
template <typename... Params, typename... Args>
inline ukv_error_t ukv_launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                                        hipStream_t stream, bool enable, int cluster_z, Args... args) {
  (void)enable;
  if (cluster_z != 1) return hipErrorInvalidValue;
  hipLaunchKernelGGL(kernel, grid, block, smem_bytes, stream, args...);
  return hipGetLastError();
}
template <typename... Params>
inline ukv_error_t ukv_max_active_clusters(void (*kernel)(Params...), dim3 block, size_t smem_bytes, int cluster_z,
                                           int* clusters) {
  (void)kernel;
  (void)block;
  (void)smem_bytes;
  (void)cluster_z;
  *clusters = 0;
  return hipSuccess;
}
// Whether the device runs v_mfma_f32_16x16x16bf16_1k (matrix_core.cuh's
// UKV_MFMA targets), from its ISA name ("gfx942:sramecc+:xnack-").
inline ukv_error_t ukv_device_has_mfma(int device, bool* has) {
  hipDeviceProp_t prop;
  const hipError_t e = hipGetDeviceProperties(&prop, device);
  if (e != hipSuccess) return e;
  *has = false;
  for (const char* isa : {"gfx90a", "gfx940", "gfx941", "gfx942", "gfx950"})
    *has = *has || std::strncmp(prop.gcnArchName, isa, std::strlen(isa)) == 0;
  return hipSuccess;
}
#define UKV_MEMCPY_HOST_TO_DEVICE hipMemcpyHostToDevice
#define UKV_MEMCPY_DEVICE_TO_HOST hipMemcpyDeviceToHost
#define UKV_MEMCPY_DEVICE_TO_DEVICE hipMemcpyDeviceToDevice
#define UKV_ERROR_MEMORY_ALLOCATION hipErrorOutOfMemory
#define UKV_ERROR_NO_DEVICE hipErrorNoDevice
#define UKV_ERROR_INSUFFICIENT_DRIVER hipErrorInsufficientDriver
#define UKV_STREAM_CAPTURE_GLOBAL hipStreamCaptureModeGlobal
#define ukv_memset hipMemset
#define ukv_memcpy_from_symbol(dst, symbol, bytes) hipMemcpyFromSymbol((dst), HIP_SYMBOL(symbol), (bytes))
typedef hipGraph_t ukv_graph_t;
typedef hipGraphExec_t ukv_graph_exec_t;
typedef hipEvent_t ukv_event_t;
#define ukv_stream_create hipStreamCreate
#define ukv_stream_destroy hipStreamDestroy
#define ukv_stream_begin_capture hipStreamBeginCapture
#define ukv_stream_end_capture hipStreamEndCapture
#define ukv_graph_instantiate(exec, graph) hipGraphInstantiate((exec), (graph), nullptr, nullptr, 0)
#define ukv_graph_destroy hipGraphDestroy
#define ukv_graph_launch hipGraphLaunch
#define ukv_graph_exec_destroy hipGraphExecDestroy
#define ukv_event_create hipEventCreate
#define ukv_event_destroy hipEventDestroy
#define ukv_event_record hipEventRecord
#define ukv_event_synchronize hipEventSynchronize
#define ukv_event_elapsed_time hipEventElapsedTime
typedef hipMemcpyKind ukv_memcpy_kind;

// __launch_bounds__'s second argument is the minimum waves per execution unit
// on HIP, not blocks per multiprocessor: the register caps the CUDA values
// encode are NVIDIA tuning, so HIP builds keep only the block size.
#define UKV_LAUNCH_BOUNDS(threads, min_blocks) __launch_bounds__(threads)

// Errors after which the device context is unusable (a kernel faulted).
inline bool ukv_error_is_sticky(ukv_error_t e) {
  switch (e) {
    case hipErrorIllegalAddress:
    case hipErrorLaunchFailure:
    case hipErrorAssert:
    case hipErrorUnknown:
      return true;
    default:
      return false;
  }
}

#include "compat_hip_warp.cuh"

__device__ __forceinline__ float ukv_bf16_to_float(ukv_bf16 x) { return __uint_as_float((uint32_t)x.bits << 16); }
// Round to nearest even; NaN -> 0x7FFF with the sign, as __float2bfloat16_rn.
__device__ __forceinline__ ukv_bf16 ukv_float_to_bf16(float x) {
  const uint32_t u = __float_as_uint(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return ukv_bf16{(uint16_t)((u >> 16) | 0x7FFFu)};
  return ukv_bf16{(uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)};
}
__device__ __forceinline__ float ukv_bf16_round(float x) { return ukv_bf16_to_float(ukv_float_to_bf16(x)); }
__device__ __forceinline__ float ukv_mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float ukv_add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float ukv_sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ uint32_t ukv_pack_bf16x2(float lo, float hi) {
  return (uint32_t)ukv_float_to_bf16(lo).bits | (uint32_t)ukv_float_to_bf16(hi).bits << 16;
}
// Two bf16 products, each the bf16 nearest the exact product: two bf16 values
// multiply exactly in fp32 (8 + 8 significant bits), so one rounding remains.
__device__ __forceinline__ uint32_t ukv_bf16x2_mul(uint32_t a, uint32_t b) {
  const float lo = __uint_as_float(a << 16) * __uint_as_float(b << 16);
  const float hi = __uint_as_float(a & 0xFFFF0000u) * __uint_as_float(b & 0xFFFF0000u);
  return ukv_pack_bf16x2(lo, hi);
}
__device__ __forceinline__ uint32_t ukv_byte_perm(uint32_t a, uint32_t b, uint32_t sel) { return __byte_perm(a, b, sel); }
#else
#include <cuda_bf16.h>
#include <cuda_runtime.h>

typedef cudaStream_t ukv_stream_t;
typedef cudaError_t ukv_error_t;
typedef __nv_bfloat16 ukv_bf16;
typedef __nv_bfloat162 ukv_bf16x2;

#define UKV_SUCCESS cudaSuccess
#define ukv_get_device cudaGetDevice
#define ukv_set_device cudaSetDevice
#define ukv_get_device_count cudaGetDeviceCount
#define ukv_malloc cudaMalloc
#define ukv_free cudaFree
#define ukv_memcpy_async cudaMemcpyAsync
#define ukv_memset_async cudaMemsetAsync
#define ukv_stream_synchronize cudaStreamSynchronize
#define ukv_get_last_error cudaGetLastError
#define ukv_peek_at_last_error cudaPeekAtLastError
#define ukv_get_error_string cudaGetErrorString
#define ukv_func_set_max_dynamic_smem(f, bytes) \
  cudaFuncSetAttribute((const void*)(f), cudaFuncAttributeMaxDynamicSharedMemorySize, (bytes))
#define ukv_func_set_max_smem_carveout(f) \
  cudaFuncSetAttribute((const void*)(f), cudaFuncAttributePreferredSharedMemoryCarveout, 100)
#define ukv_device_get_attribute cudaDeviceGetAttribute
#define ukv_func_allow_large_clusters(f) \
  cudaFuncSetAttribute((const void*)(f), cudaFuncAttributeNonPortableClusterSizeAllowed, 1)
#define UKV_ATTR_SM_COUNT cudaDevAttrMultiProcessorCount
#define UKV_ATTR_MAX_SMEM_OPTIN cudaDevAttrMaxSharedMemoryPerBlockOptin
#define UKV_ATTR_CC_MAJOR cudaDevAttrComputeCapabilityMajor

// Launches `kernel` so it may start while the previous kernel in the stream is
// still running (programmatic dependent launch, sm_90+; the kernel must call
// ukv_pdl_wait() before reading what that kernel wrote), optionally as thread-
// block clusters of `cluster_z` blocks along z (sm_90+; 1 = no clusters).
template <typename... Params, typename... Args>
inline ukv_error_t ukv_launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                                        cudaStream_t stream, bool enable, int cluster_z, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = enable ? 1 : 0;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = 1;
  attr[1].val.clusterDim.y = 1;
  attr[1].val.clusterDim.z = (unsigned)cluster_z;
  config.attrs = attr;
  config.numAttrs = cluster_z > 1 ? 2 : 1;
  return cudaLaunchKernelEx(&config, kernel, args...);
}
// How many clusters of `cluster_z` blocks of `kernel` the device can hold at
// once (0: such clusters cannot be scheduled with this shared memory).
template <typename... Params>
inline ukv_error_t ukv_max_active_clusters(void (*kernel)(Params...), dim3 block, size_t smem_bytes, int cluster_z,
                                           int* clusters) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(1, 1, (unsigned)cluster_z);
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = (unsigned)cluster_z;
  config.attrs = attr;
  config.numAttrs = 1;
  return cudaOccupancyMaxActiveClusters(clusters, kernel, &config);
}
#define UKV_MEMCPY_HOST_TO_DEVICE cudaMemcpyHostToDevice
#define UKV_MEMCPY_DEVICE_TO_HOST cudaMemcpyDeviceToHost
#define UKV_MEMCPY_DEVICE_TO_DEVICE cudaMemcpyDeviceToDevice
#define UKV_ERROR_MEMORY_ALLOCATION cudaErrorMemoryAllocation
#define UKV_ERROR_NO_DEVICE cudaErrorNoDevice
#define UKV_ERROR_INSUFFICIENT_DRIVER cudaErrorInsufficientDriver
#define UKV_STREAM_CAPTURE_GLOBAL cudaStreamCaptureModeGlobal
#define ukv_memset cudaMemset
#define ukv_memcpy_from_symbol(dst, symbol, bytes) cudaMemcpyFromSymbol((dst), (symbol), (bytes))
typedef cudaGraph_t ukv_graph_t;
typedef cudaGraphExec_t ukv_graph_exec_t;
typedef cudaEvent_t ukv_event_t;
#define ukv_stream_create cudaStreamCreate
#define ukv_stream_destroy cudaStreamDestroy
#define ukv_stream_begin_capture cudaStreamBeginCapture
#define ukv_stream_end_capture cudaStreamEndCapture
#define ukv_graph_instantiate(exec, graph) cudaGraphInstantiate((exec), (graph), 0)
#define ukv_graph_destroy cudaGraphDestroy
#define ukv_graph_launch cudaGraphLaunch
#define ukv_graph_exec_destroy cudaGraphExecDestroy
#define ukv_event_create cudaEventCreate
#define ukv_event_destroy cudaEventDestroy
#define ukv_event_record cudaEventRecord
#define ukv_event_synchronize cudaEventSynchronize
#define ukv_event_elapsed_time cudaEventElapsedTime
typedef cudaMemcpyKind ukv_memcpy_kind;

// Block size and the minimum resident blocks per SM (the register cap).
#define UKV_LAUNCH_BOUNDS(threads, min_blocks) __launch_bounds__(threads, min_blocks)

// Errors after which the device context is unusable (a kernel faulted).
inline bool ukv_error_is_sticky(ukv_error_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorUnknown:
      return true;
    default:
      return false;
  }
}

// Logical warp: 32 lanes everywhere. Code that depends on the physical wave
// (64 on CDNA) uses UKV_WAVE_SIZE.
#define UKV_WARP 32
#define UKV_WAVE_SIZE 32

// Shuffles always name their width.
__device__ __forceinline__ float ukv_shfl_xor(float v, int mask, int width) {
  return __shfl_xor_sync(0xffffffffu, v, mask, width);
}
__device__ __forceinline__ int ukv_shfl_xor(int v, int mask, int width) {
  return __shfl_xor_sync(0xffffffffu, v, mask, width);
}
__device__ __forceinline__ double ukv_shfl_xor(double v, int mask, int width) {
  return __shfl_xor_sync(0xffffffffu, v, mask, width);
}
__device__ __forceinline__ int ukv_shfl_up(int v, int delta, int width) {
  return __shfl_up_sync(0xffffffffu, v, delta, width);
}
__device__ __forceinline__ int ukv_shfl(int v, int src, int width) {
  return __shfl_sync(0xffffffffu, v, src, width);
}
__device__ __forceinline__ void ukv_syncwarp() { __syncwarp(0xffffffffu); }
// Barrier `id` (1..15; 0 is __syncthreads) of `threads` threads (a multiple of
// the warp): lets one group of warps synchronize while others run on.
__device__ __forceinline__ void ukv_named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives at barrier `id` without waiting: the warps that bar.sync on it wait
// for these arrivals too.
__device__ __forceinline__ void ukv_named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ uint64_t ukv_ballot(bool pred) {
  return (uint64_t)__ballot_sync(0xffffffffu, pred);
}
// Barrier `id` of `threads` threads that also returns whether `pred` held in
// any of them (one bar.red instead of a ballot and a shared-memory exchange).
__device__ __forceinline__ bool ukv_named_sync_or(int id, int threads, bool pred) {
  uint32_t any;
  asm volatile(
      "{\n.reg .pred in, out;\nsetp.ne.u32 in, %1, 0;\nbar.red.or.pred out, %2, %3, in;\nselp.u32 %0, 1, 0, out;\n}\n"
      : "=r"(any)
      : "r"((uint32_t)pred), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
}

// 1-based index of the lowest set bit, 0 when none.
__device__ __forceinline__ int ukv_ffs64(uint64_t x) { return __ffsll((long long)x); }

__device__ __forceinline__ float ukv_bf16_to_float(ukv_bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ ukv_bf16 ukv_float_to_bf16(float x) { return __float2bfloat16_rn(x); }
// The bf16 nearest to x (ties to even), widened back.
__device__ __forceinline__ float ukv_bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
// Correctly rounded fp32 operations the compiler may not contract into an FMA:
// kernels that reproduce the host's operation order bit for bit use them.
__device__ __forceinline__ float ukv_mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float ukv_add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float ukv_sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ uint32_t ukv_pack_bf16x2(float lo, float hi) {
  ukv_bf16x2 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
// Two bf16 products (round to nearest; subnormal operands and results are
// kept: bf16 arithmetic has no flush-to-zero mode).
__device__ __forceinline__ uint32_t ukv_bf16x2_mul(uint32_t a, uint32_t b) {
  ukv_bf16x2 x, y;
  memcpy(&x, &a, sizeof(x));
  memcpy(&y, &b, sizeof(y));
  const ukv_bf16x2 r = __hmul2(x, y);
  uint32_t out;
  memcpy(&out, &r, sizeof(out));
  return out;
}
// Byte permute: byte i of the result is byte (sel >> 4i) & 7 of {b:a}.
__device__ __forceinline__ uint32_t ukv_byte_perm(uint32_t a, uint32_t b, uint32_t sel) { return __byte_perm(a, b, sel); }
// As ukv_byte_perm, except that where bit 3 of a selector nibble is set the
// result byte is the selected byte's sign bit replicated (prmt's default
// mode; __byte_perm ignores that bit). NVIDIA only: its one user is the raw
// FP8 attention variant (sm_90a).
__device__ __forceinline__ uint32_t ukv_byte_perm_sext(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}
#endif

#if !defined(UKV_WAVE_EMULATION)
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

// Tensor-core and async-copy feature macros: kernel files test these, not vendors.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define UKV_HAS_MMA_BF16 1
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

// Tensor-core fragments (m16n8k16, bf16 in, f32 accumulate). Layouts follow the
// PTX ISA: A row-major 16x16 (4 regs), B column-major 16x8 (2 regs), C/D 16x8 f32.
// NVIDIA-only, like everything after the mbarrier comment below.
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
// 2^x by the hardware approximation (MUFU.EX2, the one exp2f uses), results
// below 2^-126 flushed to zero: exp2f keeps subnormal results with a range
// test and two multiplies around it, three instructions more per call.
__device__ __forceinline__ float ukv_exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// Two f32 values to an f16 pair (`lo` in the low half), rounded to nearest.
__device__ __forceinline__ uint32_t ukv_pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  uint32_t bits;
  memcpy(&bits, &h, sizeof(bits));
  return bits;
}
#endif

// fp32 pair -> two e4m3fn codes (round to nearest even, finite saturation, any
// NaN -> 0x7F) in one instruction on sm_89+; `lo` lands in the low byte. Kernel
// code goes through fp8.cuh, which falls back to its software codec elsewhere.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define UKV_HAS_E4M3_CVT 1
__device__ __forceinline__ uint16_t ukv_cvt_e4m3x2(float lo, float hi) {
  uint16_t packed;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(packed) : "f"(hi), "f"(lo));
  return packed;
}
// The two e4m3fn codes in half kHalf of w (0: bits 0..15, 1: bits 16..31;
// the lower byte goes to the low half) to their exact f16 values. The half is
// an operand of the instruction: taking the upper one costs no shift.
template <int kHalf = 0>
__device__ __forceinline__ uint32_t ukv_cvt_e4m3x2_to_half2(uint32_t w) {
  static_assert(kHalf == 0 || kHalf == 1, "a 32-bit word has two halves");
  uint32_t halves;
  if constexpr (kHalf == 0) {
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}\n" : "=r"(halves) : "r"(w));
  } else {
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}\n" : "=r"(halves) : "r"(w));
  }
  return halves;
}
// Per-half maximum of two pairs of unsigned 16-bit integers.
__device__ __forceinline__ uint32_t ukv_max_u16x2(uint32_t a, uint32_t b) { return __vmaxu2(a, b); }
// f16x2 products, rounded to nearest.
__device__ __forceinline__ uint32_t ukv_f16x2_mul(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
// Two e4m3fn codes (`lo` in the low byte) to their exact values: e4m3 -> f16
// is exact (NaN stays NaN), and so is f16 -> f32.
__device__ __forceinline__ void ukv_cvt_e4m3x2_to_float2(uint16_t codes, float& lo, float& hi) {
  uint32_t halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(halves) : "h"(codes));
  __half2 h;
  memcpy(&h, &halves, sizeof(h));
  const float2 f = __half22float2(h);
  lo = f.x;
  hi = f.y;
}
#endif

// Bulk copies (sm_90+): one instruction moves a contiguous run of bytes from
// global into shared memory through the copy engine and completes on an
// mbarrier, without the per-SM cap on outstanding 16-byte cp.async requests.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define UKV_HAS_BULK_COPY 1
#endif

// From here on NVIDIA-only (mbarriers, bulk copies, proxy fences, wgmma): only
// the sm_90 paths of attention.cu use them.
#if !defined(__HIPCC__)
// mbarrier: one phase per fill of a buffer; its arrivals (some announcing the
// bytes a bulk copy will deliver) and those bytes complete a phase.
__device__ __forceinline__ uint32_t ukv_smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
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
// The lane index from its special register: ptxas can re-read it where a
// value derived from threadIdx.x would have to stay live (or spill).
__device__ __forceinline__ int ukv_lane_id() {
  int lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}
// Lane `src`'s pointer.
__device__ __forceinline__ const char* ukv_shfl_ptr(const char* p, int src) {
  return reinterpret_cast<const char*>(__shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(p), src));
}
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
#endif  // !UKV_WAVE_EMULATION
