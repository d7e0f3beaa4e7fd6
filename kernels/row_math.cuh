// Per-row fp32 math of src/rope.rs on the device, shared by prepare.cu and
// indexer.cu: the RMSNorm factor (the sum of squares in double,
// 1 / sqrt(mean + eps) rounded to float once, so it is almost always the
// host's factor bit for bit) and the RoPE rotation of one (re, im) pair.
#pragma once

#include "compat.cuh"

// 1 / sqrt(m) for m >= 2^-149 to within a few double ulps: m scaled by an
// even power of two into float's range (exact), the float estimate refined by
// two Newton steps in double, the result scaled back. As a float it is the
// host's (float)(1.0 / sqrt(m)) unless that lies within those ulps of a float
// rounding midpoint (odds near 2^-27 per row). A correctly rounded double
// sqrt and division would cost registers, which set the occupancy.
__device__ __forceinline__ double ukv_rsqrt_refined(double m) {
  if (!(m < INFINITY)) return m == m ? 0.0 : m;  // 1/sqrt(inf) = 0; NaN stays NaN
  const bool big = m > 0x1p100, tiny = m < 0x1p-100;
  const double s = big ? m * 0x1p-200 : tiny ? m * 0x1p200 : m;
  double r = (double)rsqrtf((float)s);
  r = r * (1.5 - 0.5 * s * r * r);
  r = r * (1.5 - 0.5 * s * r * r);
  return big ? r * 0x1p-100 : tiny ? r * 0x1p100 : r;
}

// The factor of a row of `dims` values whose squares sum (in double) to `sum`.
__device__ __forceinline__ float ukv_rms_factor(double sum, int dims, float eps) {
  return (float)ukv_rsqrt_refined(sum / dims + (double)eps);
}

// src/rope.rs rotate: re' = re c - im s, im' = re s + im c, each product and
// sum rounded on its own (never fused), so the result is the host's bit for bit.
__device__ __forceinline__ void ukv_rope_rotate(float& re, float& im, float c, float s) {
  const float r = ukv_sub_rn(ukv_mul_rn(re, c), ukv_mul_rn(im, s));
  im = ukv_add_rn(ukv_mul_rn(re, s), ukv_mul_rn(im, c));
  re = r;
}
