// The per-vector steps of the lightning indexer's query and key preparation
// (docs/indexer.md §1, §2; src/indexer.rs), shared by indexer.cu and by the
// compressor's indexer keys (compressor.cu): one warp per 128-dim vector,
// lane l owning dims 4l..4l+3, so lanes 16..31 hold the rotated dims, two
// (re, im) pairs each with one float4 of the table row. The transform's
// strides 1 and 2 stay inside a lane; strides 4..64 are xor shuffles with
// masks 1..16, where the lane with the mask bit clear keeps a + b and its
// partner a - b (a the lower element), exactly the host's butterflies.
// Products and sums are ukv_mul_rn / ukv_add_rn / ukv_sub_rn (never
// contracted into FMAs).
#pragma once

#include "fp8.cuh"
#include "row_math.cuh"
#include "warp.cuh"

namespace ukv_indexer_rows {

constexpr int kDims = 128;
constexpr int kRopeLane = 16;  // lanes 16..31: dims 64..127
// 1 / sqrt(128) rounded to float, src/indexer.rs HADAMARD_SCALE.
constexpr uint32_t kHadamardScaleBits = 0x3DB504F3u;

// The lane's 4 values of a bf16 row (one 8-byte load).
__device__ __forceinline__ void load4(const ukv_bf16* row, int lane, float (&x)[4]) {
  const uint2 v = reinterpret_cast<const uint2*>(row)[lane];
  x[0] = ukv_fp8_bits_float(v.x << 16);
  x[1] = ukv_fp8_bits_float(v.x & 0xFFFF0000u);
  x[2] = ukv_fp8_bits_float(v.y << 16);
  x[3] = ukv_fp8_bits_float(v.y & 0xFFFF0000u);
}
__device__ __forceinline__ void load4(const float* row, int lane, float (&x)[4]) {
  const float4 v = reinterpret_cast<const float4*>(row)[lane];
  x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
}

// RoPE of the lane's two (re, im) pairs (rope lanes only).
__device__ __forceinline__ void rope4(float (&x)[4], const float* table_row, int lane) {
  if (lane < kRopeLane) return;
  const float4 cs = reinterpret_cast<const float4*>(table_row)[lane - kRopeLane];
  ukv_rope_rotate(x[0], x[1], cs.x, cs.y);
  ukv_rope_rotate(x[2], x[3], cs.z, cs.w);
}

// The normalized transform over the warp's 128 values (whole warp).
__device__ __forceinline__ void hadamard4(float (&x)[4], int lane) {
  float a = x[0], b = x[1];
  x[0] = ukv_add_rn(a, b), x[1] = ukv_sub_rn(a, b);
  a = x[2], b = x[3];
  x[2] = ukv_add_rn(a, b), x[3] = ukv_sub_rn(a, b);
  a = x[0], b = x[2];
  x[0] = ukv_add_rn(a, b), x[2] = ukv_sub_rn(a, b);
  a = x[1], b = x[3];
  x[1] = ukv_add_rn(a, b), x[3] = ukv_sub_rn(a, b);
#pragma unroll
  for (int mask = 1; mask < UKV_WARP; mask *= 2) {
    const bool upper = (lane & mask) != 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float other = ukv_shfl_xor(x[e], mask, UKV_WARP);
      x[e] = upper ? ukv_sub_rn(other, x[e]) : ukv_add_rn(x[e], other);
    }
  }
  const float scale = ukv_fp8_bits_float(kHadamardScaleBits);
#pragma unroll
  for (int e = 0; e < 4; ++e) x[e] = ukv_mul_rn(x[e], scale);
}

// The vector's fp32 scale, max(amax, 1e-4) / fp8_max (IEEE division; fmaxf
// drops NaN as the host's f32::max does), and this lane's 4 codes of
// x * (1 / scale) (whole warp).
__device__ __forceinline__ float quantize4(const float (&x)[4], ukv_fp8_format fmt, uint32_t* codes) {
  float amax = 0.f;
#pragma unroll
  for (int e = 0; e < 4; ++e) amax = fmaxf(amax, fabsf(x[e]));
  amax = ukv_xor_max<16, 1>(amax);
  const float scale = fmaxf(amax, 1e-4f) / ukv_fp8_max(fmt);
  const float inv = 1.0f / scale;
  float q[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) q[e] = ukv_mul_rn(x[e], inv);
  *codes = ukv_fp8x4_encode(q, fmt);
  return scale;
}

// A loaded key (lane: dims 4 lane ..; whole warp) prepared and stored as key
// `loc` of the paged indexer cache: RMSNorm with weight w (the sum of squares
// in double, row_math.cuh), RoPE at `table_row`, the Hadamard transform, FP8
// codes and the key's fp32 scale after the page's codes.
__device__ __forceinline__ void store_key4(float (&x)[4], const float (&w)[4], const float* table_row, int lane,
                                           float eps, ukv_fp8_format fmt, uint8_t* cache, int64_t bytes_per_page,
                                           int page_shift, int64_t loc) {
  double sum = 0.0;
#pragma unroll
  for (int e = 0; e < 4; ++e) sum += (double)x[e] * (double)x[e];
  const float f = ukv_rms_factor(ukv_xor_sum<16, 1>(sum), kDims, eps);
#pragma unroll
  for (int e = 0; e < 4; ++e) x[e] = ukv_mul_rn(ukv_mul_rn(x[e], f), w[e]);
  rope4(x, table_row, lane);
  hadamard4(x, lane);
  uint32_t codes;
  const float scale = quantize4(x, fmt, &codes);
  const int64_t page = loc >> page_shift, slot = loc & ((1 << page_shift) - 1);
  uint8_t* page_base = cache + page * bytes_per_page;
  reinterpret_cast<uint32_t*>(page_base + slot * kDims)[lane] = codes;
  if (lane == 0) *reinterpret_cast<float*>(page_base + ((int64_t)kDims << page_shift) + slot * 4) = scale;
}

}  // namespace ukv_indexer_rows
