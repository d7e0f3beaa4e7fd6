// The layout of every kernels/params.h struct as the kernels' compiler lays
// it out, for tests/param_layout.rs: it compares each field's offset and size
// with the #[repr(C)] mirror in src/backend/gpu/shim.rs (std::mem::offset_of!),
// where unikv_gpu_params_size compares whole sizes only. Host code only.
#include <cstddef>

#include "../params.h"

// One line per field, each struct's fields together and in declaration order.
#define UKV_PARAM_FIELDS(X)                       \
  X(ukv_pool_rows, data)                          \
  X(ukv_pool_rows, rope)                          \
  X(ukv_pool_rows, fp8)                           \
  X(ukv_pool_rows, fp8_format)                    \
  X(ukv_store_swa_params, kv)                     \
  X(ukv_store_swa_params, batch_id)               \
  X(ukv_store_swa_params, req_slots)              \
  X(ukv_store_swa_params, positions)              \
  X(ukv_store_swa_params, final_pos)              \
  X(ukv_store_swa_params, pool)                   \
  X(ukv_store_swa_params, kv_stride)              \
  X(ukv_store_swa_params, pool_rows)              \
  X(ukv_store_swa_params, num_tokens)             \
  X(ukv_store_swa_params, num_requests)           \
  X(ukv_store_swa_params, window)                 \
  X(ukv_store_swa_params, ring)                   \
  X(ukv_store_swa_params, num_slots)              \
  X(ukv_store_swa_params, reserved)               \
  X(ukv_store_compressed_params, kv)              \
  X(ukv_store_compressed_params, loc)             \
  X(ukv_store_compressed_params, pool)            \
  X(ukv_store_compressed_params, kv_stride)       \
  X(ukv_store_compressed_params, swa_rows)        \
  X(ukv_store_compressed_params, compressed_rows) \
  X(ukv_store_compressed_params, num_rows)        \
  X(ukv_store_compressed_params, reserved)        \
  X(ukv_cache_store_params, rows)                 \
  X(ukv_cache_store_params, loc)                  \
  X(ukv_cache_store_params, cache)                \
  X(ukv_cache_store_params, row_stride)           \
  X(ukv_cache_store_params, bytes_per_page)       \
  X(ukv_cache_store_params, token_slots)          \
  X(ukv_cache_store_params, num_tokens)           \
  X(ukv_cache_store_params, page_shift)           \
  X(ukv_cache_store_params, format)               \
  X(ukv_cache_store_params, loc_i64)              \
  X(ukv_cache_store_params, rows_f32)             \
  X(ukv_scaled_store_params, rows)                \
  X(ukv_scaled_store_params, loc)                 \
  X(ukv_scaled_store_params, codes)               \
  X(ukv_scaled_store_params, scales)              \
  X(ukv_scaled_store_params, row_stride)          \
  X(ukv_scaled_store_params, codes_stride)        \
  X(ukv_scaled_store_params, scales_stride)       \
  X(ukv_scaled_store_params, num_rows)            \
  X(ukv_scaled_store_params, num_tokens)          \
  X(ukv_scaled_store_params, divisor)             \
  X(ukv_scaled_store_params, format)              \
  X(ukv_scaled_store_params, loc_i64)             \
  X(ukv_scaled_store_params, reserved)            \
  X(ukv_prepare_qkv_params, q_in)                 \
  X(ukv_prepare_qkv_params, q_out)                \
  X(ukv_prepare_qkv_params, kv_in)                \
  X(ukv_prepare_qkv_params, kv_weight)            \
  X(ukv_prepare_qkv_params, kv_out)               \
  X(ukv_prepare_qkv_params, rope_table)           \
  X(ukv_prepare_qkv_params, positions)            \
  X(ukv_prepare_qkv_params, rows)                 \
  X(ukv_prepare_qkv_params, pool)                 \
  X(ukv_prepare_qkv_params, q_in_stride_token)    \
  X(ukv_prepare_qkv_params, q_in_stride_head)     \
  X(ukv_prepare_qkv_params, q_out_stride_token)   \
  X(ukv_prepare_qkv_params, q_out_stride_head)    \
  X(ukv_prepare_qkv_params, kv_in_stride)         \
  X(ukv_prepare_qkv_params, kv_out_stride)        \
  X(ukv_prepare_qkv_params, table_stride)         \
  X(ukv_prepare_qkv_params, max_pos)              \
  X(ukv_prepare_qkv_params, pool_rows)            \
  X(ukv_prepare_qkv_params, num_tokens)           \
  X(ukv_prepare_qkv_params, num_heads)            \
  X(ukv_prepare_qkv_params, q_eps)                \
  X(ukv_prepare_qkv_params, kv_eps)               \
  X(ukv_prepare_qkv_params, positions_i64)        \
  X(ukv_prepare_qkv_params, rows_i64)             \
  X(ukv_stream_out, indptr)                       \
  X(ukv_stream_out, indices)                      \
  X(ukv_stream_out, capacity)                     \
  X(ukv_decode_streams_params, batch_id)          \
  X(ukv_decode_streams_params, req_slots)         \
  X(ukv_decode_streams_params, positions)         \
  X(ukv_decode_streams_params, c128)              \
  X(ukv_decode_streams_params, swa)               \
  X(ukv_decode_streams_params, hca)               \
  X(ukv_decode_streams_params, csa)               \
  X(ukv_decode_streams_params, c128_stride)       \
  X(ukv_decode_streams_params, c128_width)        \
  X(ukv_decode_streams_params, num_tokens)        \
  X(ukv_decode_streams_params, num_requests)      \
  X(ukv_decode_streams_params, window)            \
  X(ukv_decode_streams_params, ring)              \
  X(ukv_decode_streams_params, num_slots)         \
  X(ukv_decode_streams_params, swa_rows)          \
  X(ukv_decode_streams_params, hca_rows)          \
  X(ukv_decode_streams_params, csa_topk)          \
  X(ukv_decode_streams_params, reserved)          \
  X(ukv_csa_tail_params, batch_id)                \
  X(ukv_csa_tail_params, positions)               \
  X(ukv_csa_tail_params, table)                   \
  X(ukv_csa_tail_params, indptr)                  \
  X(ukv_csa_tail_params, indices)                 \
  X(ukv_csa_tail_params, table_stride)            \
  X(ukv_csa_tail_params, capacity)                \
  X(ukv_csa_tail_params, width)                   \
  X(ukv_csa_tail_params, num_tokens)              \
  X(ukv_csa_tail_params, window)                  \
  X(ukv_csa_tail_params, swa_rows)                \
  X(ukv_csa_tail_params, csa_rows)                \
  X(ukv_csa_tail_params, reserved)                \
  X(ukv_prefill_streams_params, batch_id)         \
  X(ukv_prefill_streams_params, req_slots)        \
  X(ukv_prefill_streams_params, positions)        \
  X(ukv_prefill_streams_params, chunk_start)      \
  X(ukv_prefill_streams_params, extend_start)     \
  X(ukv_prefill_streams_params, table)            \
  X(ukv_prefill_streams_params, prefix)           \
  X(ukv_prefill_streams_params, extend)           \
  X(ukv_prefill_streams_params, table_stride)     \
  X(ukv_prefill_streams_params, width)            \
  X(ukv_prefill_streams_params, ratio)            \
  X(ukv_prefill_streams_params, num_tokens)       \
  X(ukv_prefill_streams_params, num_requests)     \
  X(ukv_prefill_streams_params, window)           \
  X(ukv_prefill_streams_params, ring)             \
  X(ukv_prefill_streams_params, num_slots)        \
  X(ukv_prefill_streams_params, swa_rows)         \
  X(ukv_prefill_streams_params, compressed_rows)  \
  X(ukv_prefill_streams_params, reserved)         \
  X(ukv_kv_source, kv)                            \
  X(ukv_kv_source, indices)                       \
  X(ukv_kv_source, indptr)                        \
  X(ukv_kv_source, kv_stride)                     \
  X(ukv_kv_source, rows)                          \
  X(ukv_kv_source, capacity)                      \
  X(ukv_kv_source, scales)                        \
  X(ukv_kv_source, scales_stride)                 \
  X(ukv_kv_source, layout)                        \
  X(ukv_kv_source, page_shift)                    \
  X(ukv_attention_params, q)                      \
  X(ukv_attention_params, out)                    \
  X(ukv_attention_params, lse)                    \
  X(ukv_attention_params, sink)                   \
  X(ukv_attention_params, workspace)              \
  X(ukv_attention_params, src)                    \
  X(ukv_attention_params, q_stride_token)         \
  X(ukv_attention_params, q_stride_head)          \
  X(ukv_attention_params, out_stride_token)       \
  X(ukv_attention_params, out_stride_head)        \
  X(ukv_attention_params, lse_stride_token)       \
  X(ukv_attention_params, workspace_bytes)        \
  X(ukv_attention_params, num_sources)            \
  X(ukv_attention_params, num_tokens)             \
  X(ukv_attention_params, num_heads)              \
  X(ukv_attention_params, skip_negative)          \
  X(ukv_attention_params, softmax_scale)          \
  X(ukv_attention_params, reserved)               \
  X(ukv_attention_params, rope_table)             \
  X(ukv_attention_params, positions)              \
  X(ukv_attention_params, rope_rows)              \
  X(ukv_attention_params, positions_i64)          \
  X(ukv_attention_params, reserved2)              \
  X(ukv_merge_params, parts_out)                  \
  X(ukv_merge_params, parts_lse)                  \
  X(ukv_merge_params, sink)                       \
  X(ukv_merge_params, out)                        \
  X(ukv_merge_params, lse)                        \
  X(ukv_merge_params, part_stride_out)            \
  X(ukv_merge_params, part_stride_lse)            \
  X(ukv_merge_params, out_stride_token)           \
  X(ukv_merge_params, out_stride_head)            \
  X(ukv_merge_params, in_stride_token)            \
  X(ukv_merge_params, in_stride_head)             \
  X(ukv_merge_params, lse_stride_token)           \
  X(ukv_merge_params, in_lse_stride_token)        \
  X(ukv_merge_params, num_parts)                  \
  X(ukv_merge_params, num_tokens)                 \
  X(ukv_merge_params, num_heads)                  \
  X(ukv_merge_params, reserved)                   \
  X(ukv_inverse_rope_params, x)                   \
  X(ukv_inverse_rope_params, positions)           \
  X(ukv_inverse_rope_params, table)               \
  X(ukv_inverse_rope_params, x_stride_token)      \
  X(ukv_inverse_rope_params, x_stride_head)       \
  X(ukv_inverse_rope_params, table_stride)        \
  X(ukv_inverse_rope_params, max_pos)             \
  X(ukv_inverse_rope_params, num_tokens)          \
  X(ukv_inverse_rope_params, num_heads)           \
  X(ukv_inverse_rope_params, positions_i64)       \
  X(ukv_inverse_rope_params, reserved)            \
  X(ukv_attention_plan, max_tokens)               \
  X(ukv_attention_plan, num_heads)                \
  X(ukv_attention_plan, head_blocks)              \
  X(ukv_attention_plan, block_m_tiles)            \
  X(ukv_attention_plan, sm_count)                 \
  X(ukv_attention_plan, max_splits)               \
  X(ukv_attention_plan, workspace_bytes)          \
  X(ukv_attention_plan, dependent_launch)         \
  X(ukv_attention_plan, stages)                   \
  X(ukv_attention_plan, wgmma)                    \
  X(ukv_attention_plan, cluster)                  \
  X(ukv_attention_plan, kv_fp8)                   \
  X(ukv_attention_plan, portable)                 \
  X(ukv_attention_plan, pair)                     \
  X(ukv_attention_plan, long_splits)              \
  X(ukv_attention_plan, long_keys)                \
  X(ukv_attention_plan, reserved)                 \
  X(ukv_fp8_check_params, x)                      \
  X(ukv_fp8_check_params, sw)                     \
  X(ukv_fp8_check_params, hw)                     \
  X(ukv_fp8_check_params, scale)                  \
  X(ukv_fp8_check_params, decoded)                \
  X(ukv_fp8_check_params, n)                      \
  X(ukv_fp8_check_params, format)                 \
  X(ukv_fp8_check_params, reserved)               \
  X(ukv_hash_topk_params, logits)                 \
  X(ukv_hash_topk_params, input_ids)              \
  X(ukv_hash_topk_params, tid2eid)                \
  X(ukv_hash_topk_params, weights)                \
  X(ukv_hash_topk_params, ids)                    \
  X(ukv_hash_topk_params, num_real)               \
  X(ukv_hash_topk_params, logits_stride)          \
  X(ukv_hash_topk_params, table_stride)           \
  X(ukv_hash_topk_params, weights_stride)         \
  X(ukv_hash_topk_params, ids_stride)             \
  X(ukv_hash_topk_params, vocab)                  \
  X(ukv_hash_topk_params, num_tokens)             \
  X(ukv_hash_topk_params, num_experts)            \
  X(ukv_hash_topk_params, routed)                 \
  X(ukv_hash_topk_params, shared)                 \
  X(ukv_hash_topk_params, num_real_host)          \
  X(ukv_hash_topk_params, input_ids_i64)          \
  X(ukv_hash_topk_params, num_real_i64)           \
  X(ukv_hash_topk_params, routed_scaling_factor)  \
  X(ukv_indexer_q_params, q)                      \
  X(ukv_indexer_q_params, weights)                \
  X(ukv_indexer_q_params, table)                  \
  X(ukv_indexer_q_params, positions)              \
  X(ukv_indexer_q_params, q_fp8)                  \
  X(ukv_indexer_q_params, weights_out)            \
  X(ukv_indexer_q_params, q_stride_token)         \
  X(ukv_indexer_q_params, q_stride_head)          \
  X(ukv_indexer_q_params, out_stride_token)       \
  X(ukv_indexer_q_params, out_stride_head)        \
  X(ukv_indexer_q_params, weights_stride)         \
  X(ukv_indexer_q_params, weights_out_stride)     \
  X(ukv_indexer_q_params, table_stride)           \
  X(ukv_indexer_q_params, max_pos)                \
  X(ukv_indexer_q_params, num_tokens)             \
  X(ukv_indexer_q_params, num_heads)              \
  X(ukv_indexer_q_params, positions_i64)          \
  X(ukv_indexer_q_params, format)                 \
  X(ukv_indexer_q_params, weight_scale)           \
  X(ukv_indexer_q_params, reserved)               \
  X(ukv_indexer_k_params, key)                    \
  X(ukv_indexer_k_params, norm_weight)            \
  X(ukv_indexer_k_params, table)                  \
  X(ukv_indexer_k_params, positions)              \
  X(ukv_indexer_k_params, loc)                    \
  X(ukv_indexer_k_params, cache)                  \
  X(ukv_indexer_k_params, key_stride)             \
  X(ukv_indexer_k_params, table_stride)           \
  X(ukv_indexer_k_params, max_pos)                \
  X(ukv_indexer_k_params, bytes_per_page)         \
  X(ukv_indexer_k_params, token_slots)            \
  X(ukv_indexer_k_params, page_shift)             \
  X(ukv_indexer_k_params, num_tokens)             \
  X(ukv_indexer_k_params, key_f32)                \
  X(ukv_indexer_k_params, positions_i64)          \
  X(ukv_indexer_k_params, loc_i64)                \
  X(ukv_indexer_k_params, format)                 \
  X(ukv_indexer_k_params, eps)                    \
  X(ukv_indexer_k_params, reserved)               \
  X(ukv_indexer_topk_params, q_fp8)               \
  X(ukv_indexer_topk_params, weights)             \
  X(ukv_indexer_topk_params, cache)               \
  X(ukv_indexer_topk_params, page_table)          \
  X(ukv_indexer_topk_params, batch_id)            \
  X(ukv_indexer_topk_params, positions)           \
  X(ukv_indexer_topk_params, logits)              \
  X(ukv_indexer_topk_params, topk_indices)        \
  X(ukv_indexer_topk_params, q_stride_token)      \
  X(ukv_indexer_topk_params, q_stride_head)       \
  X(ukv_indexer_topk_params, weights_stride)      \
  X(ukv_indexer_topk_params, page_table_stride)   \
  X(ukv_indexer_topk_params, logits_stride)       \
  X(ukv_indexer_topk_params, topk_stride)         \
  X(ukv_indexer_topk_params, bytes_per_page)      \
  X(ukv_indexer_topk_params, cache_pages)         \
  X(ukv_indexer_topk_params, requests)            \
  X(ukv_indexer_topk_params, max_pages)           \
  X(ukv_indexer_topk_params, logits_width)        \
  X(ukv_indexer_topk_params, topk_width)          \
  X(ukv_indexer_topk_params, num_tokens)          \
  X(ukv_indexer_topk_params, num_heads)           \
  X(ukv_indexer_topk_params, topk)                \
  X(ukv_indexer_topk_params, positions_i64)       \
  X(ukv_indexer_topk_params, format)              \
  X(ukv_indexer_topk_params, score)               \
  X(ukv_indexer_topk_params, csa_indices)         \
  X(ukv_indexer_topk_params, csa_indptr)          \
  X(ukv_indexer_topk_params, csa_capacity)        \
  X(ukv_indexer_topk_params, csa_window)          \
  X(ukv_indexer_topk_params, csa_row_base)        \
  X(ukv_indexer_topk_params, csa_rows)            \
  X(ukv_indexer_topk_params, csa_reserved)        \
  X(ukv_compress_params, kv_score)         \
  X(ukv_compress_params, ape)              \
  X(ukv_compress_params, norm_weight)      \
  X(ukv_compress_params, rope_table)       \
  X(ukv_compress_params, batch_id)         \
  X(ukv_compress_params, req_slots)        \
  X(ukv_compress_params, positions)        \
  X(ukv_compress_params, loc)              \
  X(ukv_compress_params, state)            \
  X(ukv_compress_params, cache)            \
  X(ukv_compress_params, pool)             \
  X(ukv_compress_params, kv_stride)        \
  X(ukv_compress_params, ape_stride)       \
  X(ukv_compress_params, table_stride)     \
  X(ukv_compress_params, max_pos)          \
  X(ukv_compress_params, capacity)         \
  X(ukv_compress_params, swa_rows)         \
  X(ukv_compress_params, bytes_per_page)   \
  X(ukv_compress_params, page_shift)       \
  X(ukv_compress_params, num_tokens)       \
  X(ukv_compress_params, num_requests)     \
  X(ukv_compress_params, num_slots)        \
  X(ukv_compress_params, ring)             \
  X(ukv_compress_params, ratio)            \
  X(ukv_compress_params, dim)              \
  X(ukv_compress_params, target)           \
  X(ukv_compress_params, prefill)          \
  X(ukv_compress_params, kv_f32)           \
  X(ukv_compress_params, weight_f32)       \
  X(ukv_compress_params, positions_i64)    \
  X(ukv_compress_params, loc_i64)          \
  X(ukv_compress_params, format)           \
  X(ukv_compress_params, eps)              \
  X(ukv_compress_params, reserved)         \
  X(ukv_compress_clear_params, rows)       \
  X(ukv_compress_clear_params, num_rows)   \
  X(ukv_compress_clear_params, row_floats) \
  X(ukv_compress_clear_params, reserved)

extern "C" {
// One row of the table; mirrored by src/backend/gpu/devtools.rs.
typedef struct ukv_param_field {
  const char* type;    // the struct's name in params.h
  const char* field;   // the field's name
  size_t offset;       // offsetof(type, field)
  size_t size;         // sizeof the field
  size_t type_size;    // sizeof(type)
} ukv_param_field;
}

namespace {

#define UKV_FIELD_ROW(T, f) {#T, #f, offsetof(T, f), sizeof(T::f), sizeof(T)},
constexpr ukv_param_field kFields[] = {UKV_PARAM_FIELDS(UKV_FIELD_ROW)};
#undef UKV_FIELD_ROW

#define UKV_FIELD_INDEX(T, f) k_##T##_##f,
enum : size_t { UKV_PARAM_FIELDS(UKV_FIELD_INDEX) kFieldCount };
#undef UKV_FIELD_INDEX

constexpr bool same_name(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) ++a, ++b;
  return *a == *b;
}
constexpr bool same_struct(size_t i, size_t j) { return same_name(kFields[i].type, kFields[j].type); }
// Where row i must start: at 0 for a struct's first row, else where the row
// before it ends.
constexpr size_t expected_offset(size_t i) {
  return i > 0 && same_struct(i - 1, i) ? kFields[i - 1].offset + kFields[i - 1].size : 0;
}
constexpr bool ends_struct(size_t i) {
  return (i + 1 < kFieldCount && same_struct(i, i + 1)) || kFields[i].offset + kFields[i].size == kFields[i].type_size;
}

}  // namespace

// The params structs have no padding (explicit reserved fields keep every
// member aligned), so the listed fields of each must cover it back to back:
// a field missing from the list, or listed out of order, fails to compile.
#define UKV_FIELD_CHECK(T, f)                                                                       \
  static_assert(kFields[k_##T##_##f].offset == expected_offset(k_##T##_##f),                        \
                #T "." #f " does not start where the field listed before it ends: a field is missing, " \
                   "out of order, or the struct gained padding");                                   \
  static_assert(ends_struct(k_##T##_##f), #T "." #f " is listed last but does not end the struct: a field is missing");
UKV_PARAM_FIELDS(UKV_FIELD_CHECK)
#undef UKV_FIELD_CHECK

// The table (`*count` rows, static storage).
extern "C" const ukv_param_field* unikv_gpu_dev_param_layout(size_t* count) {
  *count = kFieldCount;
  return kFields;
}
