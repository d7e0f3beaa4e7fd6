// Lightning indexer query and key preparation (docs/indexer.md §1, §2),
// the operations of src/indexer.rs in the same order: RoPE of dims 64..127
// (keys first get RMSNorm with the compressor's weight), the 128-point
// Walsh-Hadamard transform, FP8 with one fp32 scale.
//
// One warp per 128-dim vector (a query head, or a key); lane l owns dims
// 4l..4l+3, so lanes 16..31 hold the rotated dims, two (re, im) pairs each
// with one float4 of the table row. The transform's strides 1 and 2 stay
// inside a lane; strides 4..64 are xor shuffles with masks 1..16, where the
// lane with the mask bit clear keeps a + b and its partner a - b (a the lower
// element), exactly the host's butterflies. Products and sums are
// ukv_mul_rn / ukv_add_rn / ukv_sub_rn (never contracted into FMAs), so query
// codes, scales and weights are the CPU backend's bit for bit; a key's RMSNorm
// factor is a reduction (row_math.cuh) and may differ by an ulp.
//
// Device values are never trusted: a position outside the table skips the
// vector; a key location that is negative or past the cache skips its store.
#include "fp8.cuh"
#include "row_math.cuh"
#include "shim.cuh"
#include "warp.cuh"

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * UKV_WARP;
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

__global__ void __launch_bounds__(kThreads) indexer_q_kernel(ukv_indexer_q_params p) {
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int lane = threadIdx.x % UKV_WARP;
  const int64_t item = ((int64_t)blockIdx.x * kThreads + threadIdx.x) / UKV_WARP;
  if (item >= (int64_t)p.num_tokens * p.num_heads) return;  // whole warps
  const int64_t t = item / p.num_heads, h = item % p.num_heads;
  const int64_t pos = ukv_index_at(p.positions, p.positions_i64 != 0, t);
  if (pos < 0 || pos >= p.max_pos) return;
  float x[4];
  load4(static_cast<const ukv_bf16*>(p.q) + t * p.q_stride_token + h * p.q_stride_head, lane, x);
  rope4(x, p.table + pos * p.table_stride, lane);
  hadamard4(x, lane);
  uint32_t codes;
  const float scale = quantize4(x, (ukv_fp8_format)p.format, &codes);
  reinterpret_cast<uint32_t*>(p.q_fp8 + t * p.out_stride_token + h * p.out_stride_head)[lane] = codes;
  if (lane == 0) {
    const ukv_bf16 w = static_cast<const ukv_bf16*>(p.weights)[t * p.weights_stride + h];
    p.weights_out[t * p.weights_out_stride + h] =
        ukv_mul_rn(ukv_mul_rn(ukv_bf16_to_float(w), p.weight_scale), scale);
  }
}

template <typename In>
__global__ void __launch_bounds__(kThreads) indexer_k_kernel(ukv_indexer_k_params p) {
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int lane = threadIdx.x % UKV_WARP;
  const int64_t t = ((int64_t)blockIdx.x * kThreads + threadIdx.x) / UKV_WARP;
  if (t >= p.num_tokens) return;  // whole warps
  const int64_t pos = ukv_index_at(p.positions, p.positions_i64 != 0, t);
  const int64_t loc = ukv_index_at(p.loc, p.loc_i64 != 0, t);
  if (pos < 0 || pos >= p.max_pos || loc < 0 || loc >= p.token_slots) return;
  float x[4], w[4];
  load4(static_cast<const In*>(p.key) + t * p.key_stride, lane, x);
  load4(static_cast<const ukv_bf16*>(p.norm_weight), lane, w);
  double sum = 0.0;
#pragma unroll
  for (int e = 0; e < 4; ++e) sum += (double)x[e] * (double)x[e];
  const float f = ukv_rms_factor(ukv_xor_sum<16, 1>(sum), kDims, p.eps);
#pragma unroll
  for (int e = 0; e < 4; ++e) x[e] = ukv_mul_rn(ukv_mul_rn(x[e], f), w[e]);
  rope4(x, p.table + pos * p.table_stride, lane);
  hadamard4(x, lane);
  uint32_t codes;
  const float scale = quantize4(x, (ukv_fp8_format)p.format, &codes);
  const int64_t page = loc >> p.page_shift, slot = loc & ((1 << p.page_shift) - 1);
  uint8_t* page_base = p.cache + page * p.bytes_per_page;
  reinterpret_cast<uint32_t*>(page_base + slot * kDims)[lane] = codes;
  if (lane == 0) *reinterpret_cast<float*>(page_base + ((int64_t)kDims << p.page_shift) + slot * 4) = scale;
}

}  // namespace

extern "C" {

int unikv_gpu_indexer_prepare_q(int device, const ukv_indexer_q_params* p, void* stream) {
  UKV_ENTRY(device, {
    const int64_t items = (int64_t)p->num_tokens * p->num_heads;
    if (items == 0) return UKV_SHIM_OK;
    const unsigned blocks = (unsigned)ukv::cdiv(items, kWarps);
    return ukv::launch_early(device, indexer_q_kernel, dim3(blocks), dim3(kThreads), stream, "indexer_q_kernel", *p);
  })
}

int unikv_gpu_indexer_prepare_k(int device, const ukv_indexer_k_params* p, void* stream) {
  UKV_ENTRY(device, {
    if (p->num_tokens == 0) return UKV_SHIM_OK;
    const unsigned blocks = (unsigned)ukv::cdiv(p->num_tokens, kWarps);
    return ukv::launch_early(device, p->key_f32 ? indexer_k_kernel<float> : indexer_k_kernel<ukv_bf16>, dim3(blocks),
                             dim3(kThreads), stream, "indexer_k_kernel", *p);
  })
}

}  // extern "C"
