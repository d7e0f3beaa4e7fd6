// One indexer query head (docs/indexer.md §1): RoPE, the Hadamard transform
// and FP8 codes of head h of token t, with its folded weight, for one warp.
// Run by indexer.cu's kernel and, beside the Q/KV preparation, by
// prepare.cu's (unikv_prepare_qkv_indexer_q).
#pragma once

#include "indexer_rows.cuh"
#include "shim.cuh"

// Item t * num_heads + h (whole warps). A position outside the table skips
// the head.
__device__ __forceinline__ void ukv_indexer_query(const ukv_indexer_q_params& p, int64_t item, int lane) {
  using namespace ukv_indexer_rows;
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
