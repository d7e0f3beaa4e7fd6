// The pieces every compressor kernel (compressor.cu) shares: raw rows and the
// state ring, a token's fields, the pooling of one block of candidates with
// the fixed exp of src/compressor.rs, a group's epilogue (norm, RoPE,
// stores) and its window rows. Included by compressor.cu only.
#pragma once

#include "cache_rows.cuh"
#include "indexer_rows.cuh"
#include "pool_rows.cuh"
#include "row_math.cuh"
#include "shim.cuh"

namespace ukv_compressor {

constexpr int kThreads = 256;
// Candidates per pooling block (src/compressor.rs POOL_BLOCK).
constexpr int kBlock = 8;

// src/compressor.rs exp_f32, operation for operation. kBranchFree: without
// its early return, the result masked to +0 below -86 (or NaN) and x clamped
// so that the exponent arithmetic stays in range there (no live x changes):
// a branch per exp kept a ratio-4 prefill channel's exps from overlapping.
// Where the instruction count sets the time (the ratio-128 cluster kernel,
// the latent decode) the branch stays: it is rarely divergent and the clamp
// and mask cost 3 instructions per exp (bench/notes/v35.md).
template <bool kBranchFree>
__device__ __forceinline__ float pool_exp(float x) {
  const bool live = x > -86.0f;
  if constexpr (!kBranchFree) {
    if (!live) return 0.0f;
    x = fminf(x, 88.0f);
  } else {
    x = fmaxf(fminf(x, 88.0f), -87.0f);
  }
  const float k = rintf(ukv_mul_rn(x, ukv_fp8_bits_float(0x3FB8AA3Bu)));
  const float r = ukv_sub_rn(ukv_sub_rn(x, ukv_mul_rn(k, ukv_fp8_bits_float(0x3F317200u))),
                             ukv_mul_rn(k, ukv_fp8_bits_float(0x35BFBE8Eu)));
  float q = ukv_fp8_bits_float(0x3AB60B61u);                        // 1/720
  q = ukv_add_rn(ukv_mul_rn(q, r), ukv_fp8_bits_float(0x3C088889u));  // 1/120
  q = ukv_add_rn(ukv_mul_rn(q, r), ukv_fp8_bits_float(0x3D2AAAABu));  // 1/24
  q = ukv_add_rn(ukv_mul_rn(q, r), ukv_fp8_bits_float(0x3E2AAAABu));  // 1/6
  q = ukv_add_rn(ukv_mul_rn(q, r), ukv_fp8_bits_float(0x3F000000u));  // 1/2
  q = ukv_add_rn(ukv_mul_rn(q, r), 1.0f);
  q = ukv_add_rn(ukv_mul_rn(q, r), 1.0f);
  const float e = ukv_mul_rn(q, ukv_fp8_bits_float((uint32_t)((int)k + 127) << 23));
  if constexpr (!kBranchFree) return e;
  // A mask, not a select: the compiler turns `live ? e : 0` back into a branch.
  return ukv_fp8_bits_float(__float_as_uint(e) & (0u - (uint32_t)live));
}

// Raw rows (the call's kv_score, the ring rows) are global memory, also
// where the row pointer came through shared memory: said so, the loads are
// global loads, not generic ones. Not the read-only path (`__ldg`): it made
// the ratio-128 decode 1.4-3.5 us slower (bench/notes/v35.md).
template <typename T>
__device__ __forceinline__ const T* global_row(const T* row) {
#if !defined(__HIPCC__)
  __builtin_assume(__isGlobal(row));
#endif
  return row;
}
__device__ __forceinline__ float raw_value(const float* row, int64_t i) { return global_row(row)[i]; }
__device__ __forceinline__ float raw_value(const ukv_bf16* row, int64_t i) {
  return ukv_fp8_bits_float((uint32_t)reinterpret_cast<const unsigned short*>(global_row(row))[i] << 16);
}

// Element i of a window row: a caller row of type In, or a ring row (f32).
template <typename In>
__device__ __forceinline__ float raw_at(const void* row, int input, int64_t i) {
  return input ? raw_value(static_cast<const In*>(row), i) : raw_value(static_cast<const float*>(row), i);
}

// Four consecutive values of a raw row (16-byte aligned f32, 8-byte bf16).
__device__ __forceinline__ float4 load_quad(const float* row, int64_t i) {
  return reinterpret_cast<const float4*>(global_row(row))[i];
}
__device__ __forceinline__ float4 load_quad(const ukv_bf16* row, int64_t i) {
  const uint2 v = reinterpret_cast<const uint2*>(global_row(row))[i];
  return make_float4(ukv_fp8_bits_float(v.x << 16), ukv_fp8_bits_float(v.x & 0xFFFF0000u),
                     ukv_fp8_bits_float(v.y << 16), ukv_fp8_bits_float(v.y & 0xFFFF0000u));
}

// Floats of one raw row.
__device__ __forceinline__ int row_floats(const ukv_compress_params& p) {
  return 2 * (p.ratio == 4 ? 2 : 1) * p.dim;
}

// The state row of position `pos` (>= 0) of request slot `slot`: row
// pos % ring of the slot's ring. Rings are powers of two (8, 16, 128, 256;
// the launch checks), so the remainder is a mask, not a 64-bit division at
// the head of every group's chain.
__device__ __forceinline__ float* ring_row(const ukv_compress_params& p, int slot, int64_t pos, int floats) {
  return p.state + ((int64_t)slot * p.ring + (pos & (p.ring - 1))) * floats;
}

// Copies a caller row into its position's ring row (one warp).
template <typename In>
__device__ __forceinline__ void write_row(const ukv_compress_params& p, const In* src, int slot, int64_t pos) {
  const int floats = row_floats(p);
  float4* dst = reinterpret_cast<float4*>(ring_row(p, slot, pos, floats));
#pragma unroll 4
  for (int i = threadIdx.x % UKV_WARP; i < floats / 4; i += UKV_WARP) dst[i] = load_quad(src, i);
}

// A token's request slot, position and group location; false for padding and
// for a batch id, slot or position outside the call. The three per-token
// loads are issued together (none depends on another; token_fields), then
// the slot (token_slot).
__device__ __forceinline__ void token_fields(const ukv_compress_params& p, int64_t t, int& b, int64_t& pos,
                                             int64_t& loc) {
  b = p.batch_id[t];
  pos = ukv_index_at(p.positions, p.positions_i64 != 0, t);
  loc = ukv_index_at(p.loc, p.loc_i64 != 0, t);
}
__device__ __forceinline__ bool token_slot(const ukv_compress_params& p, int b, int64_t pos, int& slot) {
  if (b < 0 || b >= p.num_requests) return false;
  slot = p.req_slots[b];
  return slot >= 0 && slot < p.num_slots && pos >= 0;
}
__device__ __forceinline__ bool token(const ukv_compress_params& p, int64_t t, int& b, int& slot, int64_t& pos,
                                      int64_t& loc) {
  token_fields(p, t, b, pos, loc);
  return token_slot(p, b, pos, slot);
}

// Whether a token at `pos` closes a group the call stores: a position of
// the request, its group's first position inside the RoPE table, its
// location inside the target.
__device__ __forceinline__ bool stores_group(const ukv_compress_params& p, int ratio, int64_t pos, int64_t loc) {
  return pos >= 0 && (pos + 1) % ratio == 0 && pos + 1 - ratio < p.max_pos && loc >= 0 && loc < p.capacity;
}
__device__ __forceinline__ bool closes_group(const ukv_compress_params& p, int ratio, int64_t t, int& b, int& slot,
                                             int64_t& pos, int64_t& loc) {
  return token(p, t, b, slot, pos, loc) && stores_group(p, ratio, pos, loc);
}

// One pooling block of kBlock candidates (src/compressor.rs pool_block):
// the block's max m (over candidates from kFirstValid on; never all
// masked), the sum s of exp(l - m) and the weighted sum a. The mask is a
// compile-time count (a runtime one put a branch around every candidate).
template <int kFirstValid, bool kBranchFree = true>
__device__ __forceinline__ void pool_block(const float (&l)[kBlock], const float (&v)[kBlock], float& m, float& s,
                                           float& a) {
  // Compile-time indices with a predicate keep l and v in registers.
  m = 0.f;
  bool seen = false;
#pragma unroll
  for (int j = 0; j < kBlock; ++j) {
    if (j < kFirstValid) continue;
    m = !seen || l[j] > m ? l[j] : m;
    seen = true;
  }
  s = 0.f, a = 0.f;
#pragma unroll
  for (int j = 0; j < kBlock; ++j) {
    if (j < kFirstValid) continue;
    const float e = pool_exp<kBranchFree>(ukv_sub_rn(l[j], m));
    s = ukv_add_rn(s, e);
    a = ukv_add_rn(a, ukv_mul_rn(e, v[j]));
  }
}

// The blocks' partial results combined in block order (pool_group).
template <bool kBranchFree = true, int kBlocks>
__device__ __forceinline__ float combine_blocks(const float (&bm)[kBlocks], const float (&bs)[kBlocks],
                                                const float (&ba)[kBlocks]) {
  float big = bm[0];
#pragma unroll
  for (int k = 1; k < kBlocks; ++k) big = bm[k] > big ? bm[k] : big;
  float s = 0.f, a = 0.f;
#pragma unroll
  for (int k = 0; k < kBlocks; ++k) {
    // One block (ratio 4): exp(bm - bm) is exp_f32(0) = 1 exactly for a
    // finite bm and exp_f32(NaN) = 0 otherwise, without the polynomial.
    const float e = kBlocks == 1 ? (fabsf(bm[k]) < INFINITY ? 1.0f : 0.0f)
                                 : pool_exp<kBranchFree>(ukv_sub_rn(bm[k], big));
    s = ukv_add_rn(s, ukv_mul_rn(bs[k], e));
    a = ukv_add_rn(a, ukv_mul_rn(ba[k], e));
  }
  return a / s;
}

// The `ape` element candidate i of channel d adds to its score: ratio 4's
// candidates 0..3 are the previous group's overlap channel, 4..7 the own
// channel (offset Dim in ape's row).
template <int Ratio, int Dim>
__device__ __forceinline__ float ape_at(const ukv_compress_params& p, int i, int d) {
  if constexpr (Ratio == 4) return p.ape[(i & 3) * p.ape_stride + (i >= 4 ? Dim : 0) + d];
  return p.ape[i * p.ape_stride + d];
}

// One channel's pooled value (src/compressor.rs pool_channel / pool_group):
// window row i's candidate, masked below kFirstValid (ratio 4, group 0: 4),
// its score plus bias(i) (ape_at, or its value loaded earlier).
template <int Ratio, int Dim, typename In, int kFirstValid, bool kBranchFree, typename Bias>
__device__ __forceinline__ float pool_channel(const void* const* rows, const int* input, Bias bias, int d) {
  constexpr int kWindow = Ratio == 4 ? 8 : Ratio;
  constexpr int kValues = (Ratio == 4 ? 2 : 1) * Dim;
  constexpr int kBlocks = kWindow / kBlock;
  static_assert(kFirstValid == 0 || kBlocks == 1, "only ratio 4's one block has masked candidates");
  float bm[kBlocks], bs[kBlocks], ba[kBlocks];
#pragma unroll
  for (int k = 0; k < kBlocks; ++k) {
    float l[kBlock], v[kBlock];
#pragma unroll
    for (int j = 0; j < kBlock; ++j) {
      const int i = k * kBlock + j;
      l[j] = v[j] = 0.f;
      if (i < kFirstValid) continue;
      // Ratio 4: candidates 4..7 are the own channel, offset Dim in the row.
      const int64_t ch = Ratio == 4 && i >= 4 ? Dim + d : d;
      v[j] = raw_at<In>(rows[i], input[i], ch);
      l[j] = ukv_add_rn(raw_at<In>(rows[i], input[i], kValues + ch), bias(i));
    }
    pool_block<kFirstValid, kBranchFree>(l, v, bm[k], bs[k], ba[k]);
  }
  return combine_blocks<kBranchFree>(bm, bs, ba);
}

// The norm weight of dim d.
__device__ __forceinline__ float weight_at(const ukv_compress_params& p, int d) {
  return p.weight_f32 ? static_cast<const float*>(p.norm_weight)[d]
                      : ukv_bf16_to_float(static_cast<const ukv_bf16*>(p.norm_weight)[d]);
}

// Indexer keys (one warp): RMSNorm, RoPE, Hadamard, FP8, as indexer_k_kernel.
__device__ __forceinline__ void store_key(const ukv_compress_params& p, const float* pooled, const float* table_row,
                                          int64_t loc) {
  using namespace ukv_indexer_rows;
  const int lane = threadIdx.x % UKV_WARP;
  float x[4], w[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) x[e] = pooled[4 * lane + e];
  if (p.weight_f32) {
    load4(static_cast<const float*>(p.norm_weight), lane, w);
  } else {
    load4(static_cast<const ukv_bf16*>(p.norm_weight), lane, w);
  }
  store_key4(x, w, table_row, lane, p.eps, (ukv_fp8_format)p.format, p.cache, p.bytes_per_page, p.page_shift, loc);
}

// Latent rows, step 1 (one warp, lane l: dims 16l..16l+15): RMSNorm with the
// weight and RoPE of dims 448..511 in f32, in place in `pooled`.
__device__ __forceinline__ void norm_rope_latent(const ukv_compress_params& p, float* pooled, const float* table_row) {
  constexpr int kPer = 16, kRopeLane = 28;  // lanes 28..31: dims 448..511
  const int lane = threadIdx.x % UKV_WARP;
  float x[kPer];
  double sum = 0.0;
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    x[e] = pooled[kPer * lane + e];
    sum += (double)x[e] * (double)x[e];
  }
  const float f = ukv_rms_factor(ukv_xor_sum<16, 1>(sum), 512, p.eps);
#pragma unroll
  for (int e = 0; e < kPer; ++e) x[e] = ukv_mul_rn(ukv_mul_rn(x[e], f), weight_at(p, kPer * lane + e));
  if (lane >= kRopeLane) {
    const float* cs = table_row + kPer * (lane - kRopeLane);
#pragma unroll
    for (int i = 0; i < kPer / 2; ++i) ukv_rope_rotate(x[2 * i], x[2 * i + 1], cs[2 * i], cs[2 * i + 1]);
  }
#pragma unroll
  for (int e = 0; e < kPer; ++e) pooled[kPer * lane + e] = x[e];
}

// Latent rows, step 2: one bf16 rounding, then half `half` of the pool row
// (256 dims, 8 per lane, as ukv_store_pool_row needs) or the whole FlashMLA
// slot (16 dims per lane; half 0 only).
__device__ __forceinline__ void store_latent(const ukv_compress_params& p, const float* pooled, int64_t loc, int half) {
  const int lane = threadIdx.x % UKV_WARP;
  if (p.target == 0) {
    const int dim = 256 * half + 8 * lane;
    uint32_t bits[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) bits[i] = ukv_pack_bf16x2(pooled[dim + 2 * i], pooled[dim + 2 * i + 1]);
    ukv_store_pool_row<8>(p.pool, p.swa_rows + loc, dim, bits);
    return;
  }
  if (half != 0) return;
  uint32_t w[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) w[i] = ukv_pack_bf16x2(pooled[16 * lane + 2 * i], pooled[16 * lane + 2 * i + 1]);
  const uint4 a = make_uint4(w[0], w[1], w[2], w[3]), b = make_uint4(w[4], w[5], w[6], w[7]);
  if (p.format == UKV_FP8_E4M3FNUZ) {
    ukv_cache_rows::store_flashmla_row<UKV_FP8_E4M3FNUZ>(p.cache, p.bytes_per_page, p.page_shift, loc, a, b, lane);
  } else {
    ukv_cache_rows::store_flashmla_row<UKV_FP8_E4M3FN>(p.cache, p.bytes_per_page, p.page_shift, loc, a, b, lane);
  }
}

// Warms L1 with the lines the epilogue reads after the pooling (warp 0): the
// norm weight and the group's RoPE table row. No-op on HIP.
__device__ __forceinline__ void prefetch_epilogue(const ukv_compress_params& p, int64_t first) {
#if !defined(__HIPCC__)
  const int lane = threadIdx.x % UKV_WARP;
  const int weight_lines = p.dim * (p.weight_f32 ? 4 : 2) / 128, table_lines = 64 * 4 / 128;
  const char* line = nullptr;
  if (lane < weight_lines) {
    line = static_cast<const char*>(p.norm_weight) + 128 * lane;
  } else if (lane < weight_lines + table_lines) {
    line = reinterpret_cast<const char*>(p.rope_table + first * p.table_stride) + 128 * (lane - weight_lines);
  }
  if (line != nullptr) asm volatile("prefetch.global.L1 [%0];\n" ::"l"(line));
#else
  (void)p;
  (void)first;
#endif
}

// A pooled group (block-shared `pooled`, whole block): indexer keys by warp 0,
// latent rows normalized and rotated by warp 0, then stored.
__device__ __forceinline__ void finish_group(const ukv_compress_params& p, float* pooled, int64_t first,
                                             int64_t loc) {
  const float* table_row = p.rope_table + first * p.table_stride;
  if (p.target == 2) {
    if (threadIdx.x < UKV_WARP) store_key(p, pooled, table_row, loc);
    return;
  }
  if (threadIdx.x < UKV_WARP) norm_rope_latent(p, pooled, table_row);
  __syncthreads();
  if (threadIdx.x < 2 * UKV_WARP) store_latent(p, pooled, loc, (int)threadIdx.x / UKV_WARP);
}

// finish_group by one warp (its own `pooled`).
__device__ __forceinline__ void finish_group_warp(const ukv_compress_params& p, float* pooled, int64_t first,
                                                  int64_t loc) {
  const float* table_row = p.rope_table + first * p.table_stride;
  if (p.target == 2) {
    store_key(p, pooled, table_row, loc);
    return;
  }
  norm_rope_latent(p, pooled, table_row);
  ukv_syncwarp();
  store_latent(p, pooled, loc, 0);
  store_latent(p, pooled, loc, 1);
}

// The window rows of closing token t (threads `from`, `from` + `step`, ...
// up to kWindow: the block, or one warp's lanes): rows[i] the raw row of
// position start + i and input[i] whether it is a caller row (kv_score)
// rather than a ring row; null before position 0.
template <int kWindow, int kRow, typename In>
__device__ __forceinline__ void window_rows(const ukv_compress_params& p, int64_t t, int b, int slot, int64_t pos,
                                            int64_t start, const void** rows, int* input, int from, int step) {
  for (int i = from; i < kWindow; i += step) {
    const int64_t q = start + i;
    const void* row = nullptr;
    int from_input = 0;
    if (q >= 0) {
      // Prefill: the request's earlier tokens in this call sit right before
      // this one with consecutive positions; anything else is in the ring.
      const int64_t back = pos - q, u = t - back;
      from_input = back == 0 || (p.prefill && u >= 0 && p.batch_id[u] == b &&
                                 ukv_index_at(p.positions, p.positions_i64 != 0, u) == q);
      row = from_input ? static_cast<const void*>(static_cast<const In*>(p.kv_score) + u * p.kv_stride)
                       : static_cast<const void*>(ring_row(p, slot, q, kRow));
    }
    rows[i] = row;
    input[i] = from_input;
  }
}

}  // namespace ukv_compressor
