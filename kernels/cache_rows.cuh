// Writing one row into the FlashMLA FP8 KV cache (docs/fp8.md §5), and the
// per-lane helpers of the cache stores, shared by cache_store.cu and the
// compressor (compressor.cu): each lane owns 16 consecutive dims of a row, the
// amax of its 64-dim tile (FlashMLA, 4 lanes) or 128-dim key (indexer, 8
// lanes) is a shuffle reduction inside its lane group, and its 16 codes go
// out as one 16-byte store; bit-identical to src/cache_layouts/.
#pragma once

#include <cstdint>

#include "fp8.cuh"
#include "warp.cuh"

namespace ukv_cache_rows {

constexpr int kDimsPerLane = 16;

// FlashMLA value slot: 448 codes (lanes 0..27), then 64 bf16 RoPE dims copied
// by lanes 28..31 (32 bytes each); scale slot: 7 UE8M0 bytes and a pad byte.
constexpr int kNopeDims = 448;
constexpr int kNopeLanes = kNopeDims / kDimsPerLane;
constexpr int64_t kValueSlotBytes = 576;
constexpr int64_t kScaleSlotBytes = 8;
constexpr int kTileLanes = 64 / kDimsPerLane;
static_assert(kNopeLanes == 28 && kNopeLanes + 4 == UKV_WARP, "one warp per 512-dim token");

// Indexer: 128 codes per key (8 lanes), then one fp32 scale per key.
constexpr int kKeyDims = 128;
constexpr int kKeyLanes = kKeyDims / kDimsPerLane;
static_assert(UKV_WARP % kKeyLanes == 0, "whole keys per warp");

// A bf16 pair's two values (little-endian: the first in the low half); the
// widening is exact.
__device__ __forceinline__ void unpack_bf16x2(uint32_t w, float& lo, float& hi) {
  lo = ukv_fp8_bits_float(w << 16);
  hi = ukv_fp8_bits_float(w & 0xFFFF0000u);
}

// 16 consecutive bf16 dims held in two 16-byte vectors.
__device__ __forceinline__ void unpack16(const uint4& a, const uint4& b, float (&x)[kDimsPerLane]) {
  const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) unpack_bf16x2(w[i], x[2 * i], x[2 * i + 1]);
}

// 16 consecutive dims from two 16-byte loads (bf16) or four (f32).
__device__ __forceinline__ void load16(const ukv_bf16* src, float (&x)[kDimsPerLane]) {
  const uint4* v = reinterpret_cast<const uint4*>(src);
  unpack16(v[0], v[1], x);
}
__device__ __forceinline__ void load16(const float* src, float (&x)[kDimsPerLane]) {
  const float4* v = reinterpret_cast<const float4*>(src);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 q = v[i];
    x[4 * i] = q.x;
    x[4 * i + 1] = q.y;
    x[4 * i + 2] = q.z;
    x[4 * i + 3] = q.w;
  }
}

// NaN-ignoring max of |x| over this lane's dims and the `Lanes` lanes of its
// group (fmaxf drops a NaN operand, like Rust's f32::max).
template <int Lanes>
__device__ __forceinline__ float group_amax(const float (&x)[kDimsPerLane]) {
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) m = fmaxf(m, fabsf(x[i]));
  m = ukv_xor_max<1, Lanes / 2>(m);
  return m;
}

// The 16 codes of x * inv, dim order = byte order.
template <ukv_fp8_format F>
__device__ __forceinline__ uint4 encode16(const float (&x)[kDimsPerLane], float inv) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float* q = x + 4 * i;
    if (F == UKV_FP8_E4M3FN) {
      w[i] = (uint32_t)ukv_fp8x2_encode_e4m3fn(q[0] * inv, q[1] * inv) |
             ((uint32_t)ukv_fp8x2_encode_e4m3fn(q[2] * inv, q[3] * inv) << 16);
    } else {
      w[i] = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) w[i] |= (uint32_t)ukv_fp8_encode_sw(q[j] * inv, F) << (8 * j);
    }
  }
  uint4 out;
  out.x = w[0];
  out.y = w[1];
  out.z = w[2];
  out.w = w[3];
  return out;
}

// One token (its row as two 16-byte vectors per lane, `loc` already
// checked). Tile k is lanes 4k..4k+3; its scale is the UE8M0 byte of the tile
// amax and codes are encode(x * 2^(127-byte)), which rounds like the CPU's
// x / 2^(byte-127).
template <ukv_fp8_format F>
__device__ __forceinline__ void store_flashmla_row(uint8_t* cache, int64_t bytes_per_page, int page_shift,
                                                   int64_t loc, const uint4& a, const uint4& b, int lane) {
  float x[kDimsPerLane];
  unpack16(a, b, x);
  // Lanes 28..31 reduce among themselves too (the RoPE dims); unused.
  const float amax = group_amax<kTileLanes>(x);

  const int64_t page = loc >> page_shift, slot = loc & ((1 << page_shift) - 1);
  uint8_t* page_base = cache + page * bytes_per_page;
  uint8_t* value = page_base + slot * kValueSlotBytes;
  if (lane < kNopeLanes) {
    const uint8_t byte = ukv_ue8m0_scale_byte(amax, F);
    *reinterpret_cast<uint4*>(value + lane * kDimsPerLane) = encode16<F>(x, ukv_ue8m0_inverse(byte));
    if (lane % kTileLanes == 0) {
      page_base[(kValueSlotBytes << page_shift) + slot * kScaleSlotBytes + lane / kTileLanes] = byte;
    }
  } else {
    // The RoPE dims' bf16 bits as loaded: 32 bytes per lane, 16-byte aligned.
    uint4* dst = reinterpret_cast<uint4*>(value + kNopeDims + (lane - kNopeLanes) * 2 * kDimsPerLane);
    dst[0] = a;
    dst[1] = b;
  }
}

}  // namespace ukv_cache_rows
