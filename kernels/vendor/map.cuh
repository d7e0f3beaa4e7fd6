// The vendor map: the GPU vendor's runtime, types and warp/bf16 intrinsics
// under ukv_* names, for CUDA, for HIP (hip* here), or for the host emulation
// of a HIP wave (UKV_WAVE_EMULATION). The PTX wrappers (kernels/ptx/) build on
// it; kernels include both through compat.cuh.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(UKV_WAVE_EMULATION)
// Host build of the logical-warp helpers (warp.cuh) for
// cpp-tests/wave_emulation.cpp, which supplies the HIP builtins on emulated
// lanes: only the HIP warp intrinsics, nothing of the runtime or of the rest.
#include "hip_warp.cuh"
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
// Whether the device runs v_mfma_f32_16x16x16bf16_1k (attention/matrix_core.cuh's
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

#include "hip_warp.cuh"

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
// The same barrier reached from different instructions by different warps
// (the non-aligned form: `bar.sync` requires every participating thread to
// execute the same one).
__device__ __forceinline__ void ukv_named_sync_unaligned(int id, int threads) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
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
// Number of set bits.
__device__ __forceinline__ int ukv_popc64(uint64_t x) { return __popcll((unsigned long long)x); }
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
