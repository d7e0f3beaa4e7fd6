// Collective operations of one logical warp (UKV_WARP = 32 lanes; a wave64
// holds two), written once on the compat.cuh intrinsics. Every kernel's
// wave-size-dependent reduction, vote and scan goes through here, so that
// cpp-tests/wave_emulation.cpp can run these same functions on a host
// emulation of a 64- and a 32-lane wave (kernels/README.md).
#pragma once

#include "compat.cuh"

struct UkvMaxOp {
  // fmaxf drops a NaN operand (like Rust's f32::max).
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct UkvSumOp {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};

// Butterfly over the lanes whose indices differ in the mask bits kFirst,
// then each power of two up or down to kLast: every lane of that group ends
// with `op` over the group, combined in this fixed order (so floating-point
// sums agree bit for bit between vendors and with hosts that follow it).
template <int kFirst, int kLast, class T, class Op>
__device__ __forceinline__ T ukv_butterfly(T v, Op op) {
  static_assert(kFirst > 0 && kFirst < UKV_WARP && (kFirst & (kFirst - 1)) == 0, "masks are powers of two < 32");
  v = op(v, ukv_shfl_xor(v, kFirst, UKV_WARP));
  if constexpr (kFirst != kLast) {
    return ukv_butterfly<(kFirst < kLast ? kFirst * 2 : kFirst / 2), kLast>(v, op);
  } else {
    return v;
  }
}
template <int kFirst, int kLast>
__device__ __forceinline__ float ukv_xor_max(float v) {
  return ukv_butterfly<kFirst, kLast>(v, UkvMaxOp{});
}
template <int kFirst, int kLast, class T>
__device__ __forceinline__ T ukv_xor_sum(T v) {
  return ukv_butterfly<kFirst, kLast>(v, UkvSumOp{});
}

// Whether `pred` holds on every lane of the logical warp.
__device__ __forceinline__ bool ukv_warp_all(bool pred) { return ukv_ballot(!pred) == 0; }

// The lowest lane of the logical warp where `pred` holds, or -1.
__device__ __forceinline__ int ukv_first_lane(bool pred) {
  const uint64_t lanes = ukv_ballot(pred);
  return lanes == 0 ? -1 : ukv_ffs64(lanes) - 1;
}

// Inclusive prefix sum over the logical warp's lanes.
__device__ __forceinline__ int ukv_warp_inclusive_sum(int v) {
  const int lane = threadIdx.x % UKV_WARP;
  for (int d = 1; d < UKV_WARP; d *= 2) {
    const int up = ukv_shfl_up(v, d, UKV_WARP);
    if (lane >= d) v += up;
  }
  return v;
}
