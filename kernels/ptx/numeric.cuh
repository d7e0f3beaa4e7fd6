// Number-format conversions and packed arithmetic in single PTX instructions
// (NVIDIA only): the approximate 2^x, f16 pairs, and e4m3 codes (sm_89+).
#pragma once

#include "../vendor/map.cuh"

#if !defined(__HIPCC__)
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
#endif  // !__HIPCC__

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
