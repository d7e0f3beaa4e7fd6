// The HIP mapping of the logical-warp intrinsics, in a file of its own so that
// cpp-tests/wave_emulation.cpp can compile it on the host against emulated
// HIP builtins (__shfl_xor, __shfl_up, __shfl, __ballot, the wave barrier and
// fences, threadIdx, __AMDGCN_WAVEFRONT_SIZE). Included by vendor/map.cuh only.
#pragma once

// Logical warp: 32 lanes everywhere. The physical wave is 64 lanes on gfx9
// (CDNA) and 32 on gfx10+; code that depends on it uses UKV_WAVE_SIZE.
#define UKV_WARP 32
#if defined(__AMDGCN_WAVEFRONT_SIZE)
#define UKV_WAVE_SIZE __AMDGCN_WAVEFRONT_SIZE
#else
#define UKV_WAVE_SIZE 64
#endif

// Shuffles always name their width (32: a logical warp is half a wave64, and
// a shuffle of width 32 stays inside its half).
__device__ __forceinline__ float ukv_shfl_xor(float v, int mask, int width) { return __shfl_xor(v, mask, width); }
__device__ __forceinline__ int ukv_shfl_xor(int v, int mask, int width) { return __shfl_xor(v, mask, width); }
__device__ __forceinline__ double ukv_shfl_xor(double v, int mask, int width) { return __shfl_xor(v, mask, width); }
__device__ __forceinline__ int ukv_shfl_up(int v, int delta, int width) { return __shfl_up(v, delta, width); }
__device__ __forceinline__ int ukv_shfl(int v, int src, int width) { return __shfl(v, src, width); }
// A wave runs its lanes in lockstep; the fence orders their shared-memory
// accesses (what __syncwarp guarantees on NVIDIA).
__device__ __forceinline__ void ukv_syncwarp() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
}
// The bits of this logical warp's lanes (bit l: lane l of the warp), taken
// out of the physical wave's 64-bit ballot (blocks are one-dimensional, so a
// wave64 holds threads 64w..64w+63: logical warps 2w and 2w+1).
__device__ __forceinline__ uint64_t ukv_ballot(bool pred) {
  const uint64_t wave = __ballot(pred);
  return UKV_WAVE_SIZE == 64 ? (wave >> (threadIdx.x % 64u / 32u * 32u)) & 0xFFFFFFFFull : wave & 0xFFFFFFFFull;
}
__device__ __forceinline__ int ukv_ffs64(uint64_t x) { return __ffsll((unsigned long long)x); }
// Number of set bits.
__device__ __forceinline__ int ukv_popc64(uint64_t x) { return __popcll((unsigned long long)x); }
