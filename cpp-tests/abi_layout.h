/* The x86_64 (LP64) layout of every public struct, pinned field by field:
 * shared by header_only.c (C11) and header_only.cpp (C++17). Include after
 * <unikv.h>; it needs nothing else. */
#ifndef UNIKV_ABI_LAYOUT_H
#define UNIKV_ABI_LAYOUT_H

/* Natural alignment with 8-byte pointers and int64_t: x86_64 (and aarch64). */
#if defined(__LP64__)
#if defined(__cplusplus)
#define PIN_ASSERT static_assert
#else
#define PIN_ASSERT _Static_assert
#endif
#define PIN_SIZE(type, size) PIN_ASSERT(sizeof(type) == (size), "sizeof " #type)
#define PIN_AT(type, field, off) PIN_ASSERT(offsetof(type, field) == (off), "offsetof " #type "." #field)

PIN_SIZE(unikv_tensor, 80);
PIN_AT(unikv_tensor, data, 0);
PIN_AT(unikv_tensor, dtype, 8);
PIN_AT(unikv_tensor, ndim, 12);
PIN_AT(unikv_tensor, shape, 16);
PIN_AT(unikv_tensor, strides, 48);

PIN_SIZE(unikv_context_options, 24);
PIN_AT(unikv_context_options, struct_size, 0);
PIN_AT(unikv_context_options, backend, 8);
PIN_AT(unikv_context_options, device, 12);
PIN_AT(unikv_context_options, cpu_threads, 16);
PIN_AT(unikv_context_options, validate, 20);

PIN_SIZE(unikv_context_info, 24);
PIN_AT(unikv_context_info, struct_size, 0);
PIN_AT(unikv_context_info, backend, 8);
PIN_AT(unikv_context_info, device, 12);
PIN_AT(unikv_context_info, cpu_threads, 16);
PIN_AT(unikv_context_info, validate, 20);

PIN_SIZE(unikv_pool_params, 80);
PIN_AT(unikv_pool_params, struct_size, 0);
PIN_AT(unikv_pool_params, compress_ratios, 8);
PIN_AT(unikv_pool_params, layer_buffers, 16);
PIN_AT(unikv_pool_params, num_layers, 24);
PIN_AT(unikv_pool_params, max_requests, 28);
PIN_AT(unikv_pool_params, window, 32);
PIN_AT(unikv_pool_params, spec_extra, 36);
PIN_AT(unikv_pool_params, c128_blocks, 40);
PIN_AT(unikv_pool_params, kv_dtype, 44);
PIN_AT(unikv_pool_params, rope_buffers, 48);
PIN_AT(unikv_pool_params, compressor_state, 56);
PIN_AT(unikv_pool_params, c4_state_ring, 60);
PIN_AT(unikv_pool_params, c128_state_ring, 64);
PIN_AT(unikv_pool_params, reserved, 68);
PIN_AT(unikv_pool_params, state_buffers, 72);

PIN_SIZE(unikv_pool_info, 64);
PIN_AT(unikv_pool_info, struct_size, 0);
PIN_AT(unikv_pool_info, swa_rows, 8);
PIN_AT(unikv_pool_info, row_bytes, 16);
PIN_AT(unikv_pool_info, num_layers, 24);
PIN_AT(unikv_pool_info, max_requests, 28);
PIN_AT(unikv_pool_info, window, 32);
PIN_AT(unikv_pool_info, ring, 36);
PIN_AT(unikv_pool_info, c128_blocks, 40);
PIN_AT(unikv_pool_info, slots_in_use, 44);
PIN_AT(unikv_pool_info, kv_dtype, 48);
PIN_AT(unikv_pool_info, owns_memory, 52);
PIN_AT(unikv_pool_info, c4_state_ring, 56);
PIN_AT(unikv_pool_info, c128_state_ring, 60);

PIN_SIZE(unikv_pool_layer_info, 88);
PIN_AT(unikv_pool_layer_info, struct_size, 0);
PIN_AT(unikv_pool_layer_info, data, 8);
PIN_AT(unikv_pool_layer_info, rows, 16);
PIN_AT(unikv_pool_layer_info, swa_rows, 24);
PIN_AT(unikv_pool_layer_info, compressed_rows, 32);
PIN_AT(unikv_pool_layer_info, bytes, 40);
PIN_AT(unikv_pool_layer_info, compress_ratio, 48);
PIN_AT(unikv_pool_layer_info, reserved, 52);
PIN_AT(unikv_pool_layer_info, rope_data, 56);
PIN_AT(unikv_pool_layer_info, rope_bytes, 64);
PIN_AT(unikv_pool_layer_info, state_data, 72);
PIN_AT(unikv_pool_layer_info, state_bytes, 80);

PIN_SIZE(unikv_attention_plan_params, 40);
PIN_AT(unikv_attention_plan_params, struct_size, 0);
PIN_AT(unikv_attention_plan_params, max_tokens, 8);
PIN_AT(unikv_attention_plan_params, num_heads, 12);
PIN_AT(unikv_attention_plan_params, head_dim, 16);
PIN_AT(unikv_attention_plan_params, q_dtype, 20);
PIN_AT(unikv_attention_plan_params, kv_dtype, 24);
PIN_AT(unikv_attention_plan_params, out_dtype, 28);
PIN_AT(unikv_attention_plan_params, kv_layout, 32);
PIN_AT(unikv_attention_plan_params, reserved, 36);

/* Argument structs: struct_size, then 80-byte tensors, then scalars. */
PIN_SIZE(unikv_kv_cache, 176);
PIN_AT(unikv_kv_cache, layout, 0);
PIN_AT(unikv_kv_cache, fp8_dtype, 4);
PIN_AT(unikv_kv_cache, page_size, 8);
PIN_AT(unikv_kv_cache, reserved, 12);
PIN_AT(unikv_kv_cache, data, 16);
PIN_AT(unikv_kv_cache, scales, 96);

PIN_SIZE(unikv_decode_args, 1176);
PIN_AT(unikv_decode_args, struct_size, 0);
PIN_AT(unikv_decode_args, q, 8);
PIN_AT(unikv_decode_args, indices, 88);
PIN_AT(unikv_decode_args, indptr, 168);
PIN_AT(unikv_decode_args, sink, 248);
PIN_AT(unikv_decode_args, out, 328);
PIN_AT(unikv_decode_args, lse, 408);
PIN_AT(unikv_decode_args, layer, 488);
PIN_AT(unikv_decode_args, num_tokens, 492);
PIN_AT(unikv_decode_args, softmax_scale, 496);
PIN_AT(unikv_decode_args, reserved, 500);
PIN_AT(unikv_decode_args, rope_table, 504);
PIN_AT(unikv_decode_args, positions, 584);
PIN_AT(unikv_decode_args, kv, 664);
PIN_AT(unikv_decode_args, extra_kv, 840);
PIN_AT(unikv_decode_args, extra_indices, 1016);
PIN_AT(unikv_decode_args, extra_indptr, 1096);

PIN_SIZE(unikv_prefill_args, 1096);
PIN_AT(unikv_prefill_args, struct_size, 0);
PIN_AT(unikv_prefill_args, q, 8);
PIN_AT(unikv_prefill_args, indices, 88);
PIN_AT(unikv_prefill_args, indptr, 168);
PIN_AT(unikv_prefill_args, sink, 248);
PIN_AT(unikv_prefill_args, out, 328);
PIN_AT(unikv_prefill_args, lse, 408);
PIN_AT(unikv_prefill_args, extend_kv, 488);
PIN_AT(unikv_prefill_args, extend_indices, 568);
PIN_AT(unikv_prefill_args, extend_indptr, 648);
PIN_AT(unikv_prefill_args, layer, 728);
PIN_AT(unikv_prefill_args, num_tokens, 732);
PIN_AT(unikv_prefill_args, softmax_scale, 736);
PIN_AT(unikv_prefill_args, reserved, 740);
PIN_AT(unikv_prefill_args, kv, 744);
PIN_AT(unikv_prefill_args, extend_cache, 920);

PIN_SIZE(unikv_decode_streams_args, 816);
PIN_AT(unikv_decode_streams_args, struct_size, 0);
PIN_AT(unikv_decode_streams_args, batch_id, 8);
PIN_AT(unikv_decode_streams_args, req_slots, 88);
PIN_AT(unikv_decode_streams_args, positions, 168);
PIN_AT(unikv_decode_streams_args, c128_page_indices, 248);
PIN_AT(unikv_decode_streams_args, swa_indptr, 328);
PIN_AT(unikv_decode_streams_args, swa_indices, 408);
PIN_AT(unikv_decode_streams_args, hca_indptr, 488);
PIN_AT(unikv_decode_streams_args, hca_indices, 568);
PIN_AT(unikv_decode_streams_args, csa_indptr, 648);
PIN_AT(unikv_decode_streams_args, csa_indices, 728);
PIN_AT(unikv_decode_streams_args, num_tokens, 808);
PIN_AT(unikv_decode_streams_args, csa_topk, 812);

PIN_SIZE(unikv_csa_tail_args, 416);
PIN_AT(unikv_csa_tail_args, struct_size, 0);
PIN_AT(unikv_csa_tail_args, batch_id, 8);
PIN_AT(unikv_csa_tail_args, positions, 88);
PIN_AT(unikv_csa_tail_args, csa_page_indices, 168);
PIN_AT(unikv_csa_tail_args, csa_indptr, 248);
PIN_AT(unikv_csa_tail_args, csa_indices, 328);
PIN_AT(unikv_csa_tail_args, num_tokens, 408);
PIN_AT(unikv_csa_tail_args, reserved, 412);

PIN_SIZE(unikv_prefill_streams_args, 816);
PIN_AT(unikv_prefill_streams_args, struct_size, 0);
PIN_AT(unikv_prefill_streams_args, batch_id, 8);
PIN_AT(unikv_prefill_streams_args, req_slots, 88);
PIN_AT(unikv_prefill_streams_args, positions, 168);
PIN_AT(unikv_prefill_streams_args, chunk_start, 248);
PIN_AT(unikv_prefill_streams_args, extend_start, 328);
PIN_AT(unikv_prefill_streams_args, page_indices, 408);
PIN_AT(unikv_prefill_streams_args, prefix_indptr, 488);
PIN_AT(unikv_prefill_streams_args, prefix_indices, 568);
PIN_AT(unikv_prefill_streams_args, extend_indptr, 648);
PIN_AT(unikv_prefill_streams_args, extend_indices, 728);
PIN_AT(unikv_prefill_streams_args, num_tokens, 808);
PIN_AT(unikv_prefill_streams_args, compress_ratio, 812);

PIN_SIZE(unikv_store_swa_args, 416);
PIN_AT(unikv_store_swa_args, struct_size, 0);
PIN_AT(unikv_store_swa_args, kv, 8);
PIN_AT(unikv_store_swa_args, batch_id, 88);
PIN_AT(unikv_store_swa_args, req_slots, 168);
PIN_AT(unikv_store_swa_args, positions, 248);
PIN_AT(unikv_store_swa_args, final_pos, 328);
PIN_AT(unikv_store_swa_args, layer, 408);
PIN_AT(unikv_store_swa_args, num_tokens, 412);

PIN_SIZE(unikv_store_compressed_args, 176);
PIN_AT(unikv_store_compressed_args, struct_size, 0);
PIN_AT(unikv_store_compressed_args, kv, 8);
PIN_AT(unikv_store_compressed_args, loc, 88);
PIN_AT(unikv_store_compressed_args, layer, 168);
PIN_AT(unikv_store_compressed_args, num_rows, 172);

PIN_SIZE(unikv_store_flashmla_args, 264);
PIN_AT(unikv_store_flashmla_args, struct_size, 0);
PIN_AT(unikv_store_flashmla_args, cache, 8);
PIN_AT(unikv_store_flashmla_args, kv, 88);
PIN_AT(unikv_store_flashmla_args, loc, 168);
PIN_AT(unikv_store_flashmla_args, page_size, 248);
PIN_AT(unikv_store_flashmla_args, cache_dtype, 252);
PIN_AT(unikv_store_flashmla_args, num_tokens, 256);
PIN_AT(unikv_store_flashmla_args, reserved, 260);

PIN_SIZE(unikv_store_scaled_fp8_args, 344);
PIN_AT(unikv_store_scaled_fp8_args, struct_size, 0);
PIN_AT(unikv_store_scaled_fp8_args, codes, 8);
PIN_AT(unikv_store_scaled_fp8_args, scales, 88);
PIN_AT(unikv_store_scaled_fp8_args, kv, 168);
PIN_AT(unikv_store_scaled_fp8_args, loc, 248);
PIN_AT(unikv_store_scaled_fp8_args, cache_dtype, 328);
PIN_AT(unikv_store_scaled_fp8_args, scale_divisor, 332);
PIN_AT(unikv_store_scaled_fp8_args, num_tokens, 336);
PIN_AT(unikv_store_scaled_fp8_args, reserved, 340);

PIN_SIZE(unikv_store_indexer_args, 264);
PIN_AT(unikv_store_indexer_args, struct_size, 0);
PIN_AT(unikv_store_indexer_args, cache, 8);
PIN_AT(unikv_store_indexer_args, key, 88);
PIN_AT(unikv_store_indexer_args, loc, 168);
PIN_AT(unikv_store_indexer_args, page_size, 248);
PIN_AT(unikv_store_indexer_args, cache_dtype, 252);
PIN_AT(unikv_store_indexer_args, num_tokens, 256);
PIN_AT(unikv_store_indexer_args, reserved, 260);

PIN_SIZE(unikv_prepare_qkv_args, 672);
PIN_AT(unikv_prepare_qkv_args, struct_size, 0);
PIN_AT(unikv_prepare_qkv_args, q_in, 8);
PIN_AT(unikv_prepare_qkv_args, q_out, 88);
PIN_AT(unikv_prepare_qkv_args, kv_in, 168);
PIN_AT(unikv_prepare_qkv_args, kv_weight, 248);
PIN_AT(unikv_prepare_qkv_args, kv_out, 328);
PIN_AT(unikv_prepare_qkv_args, rope_table, 408);
PIN_AT(unikv_prepare_qkv_args, positions, 488);
PIN_AT(unikv_prepare_qkv_args, rows, 568);
PIN_AT(unikv_prepare_qkv_args, layer, 648);
PIN_AT(unikv_prepare_qkv_args, num_tokens, 652);
PIN_AT(unikv_prepare_qkv_args, num_heads, 656);
PIN_AT(unikv_prepare_qkv_args, q_eps, 660);
PIN_AT(unikv_prepare_qkv_args, kv_eps, 664);
PIN_AT(unikv_prepare_qkv_args, reserved, 668);

PIN_SIZE(unikv_merge_args, 416);
PIN_AT(unikv_merge_args, struct_size, 0);
PIN_AT(unikv_merge_args, parts_out, 8);
PIN_AT(unikv_merge_args, parts_lse, 88);
PIN_AT(unikv_merge_args, sink, 168);
PIN_AT(unikv_merge_args, out, 248);
PIN_AT(unikv_merge_args, lse, 328);
PIN_AT(unikv_merge_args, num_tokens, 408);
PIN_AT(unikv_merge_args, reserved, 412);

PIN_SIZE(unikv_rope_yarn, 32);
PIN_AT(unikv_rope_yarn, factor, 0);
PIN_AT(unikv_rope_yarn, original_max_position, 8);
PIN_AT(unikv_rope_yarn, beta_fast, 16);
PIN_AT(unikv_rope_yarn, beta_slow, 24);

PIN_SIZE(unikv_rope_params, 48);
PIN_AT(unikv_rope_params, struct_size, 0);
PIN_AT(unikv_rope_params, base, 8);
PIN_AT(unikv_rope_params, yarn, 16);

PIN_SIZE(unikv_inverse_rope_args, 256);
PIN_AT(unikv_inverse_rope_args, struct_size, 0);
PIN_AT(unikv_inverse_rope_args, x, 8);
PIN_AT(unikv_inverse_rope_args, positions, 88);
PIN_AT(unikv_inverse_rope_args, rope_table, 168);
PIN_AT(unikv_inverse_rope_args, num_tokens, 248);
PIN_AT(unikv_inverse_rope_args, num_heads, 252);

PIN_SIZE(unikv_hash_topk_args, 504);
PIN_AT(unikv_hash_topk_args, struct_size, 0);
PIN_AT(unikv_hash_topk_args, router_logits, 8);
PIN_AT(unikv_hash_topk_args, input_ids, 88);
PIN_AT(unikv_hash_topk_args, tid2eid, 168);
PIN_AT(unikv_hash_topk_args, topk_weights, 248);
PIN_AT(unikv_hash_topk_args, topk_ids, 328);
PIN_AT(unikv_hash_topk_args, num_real_tokens, 408);
PIN_AT(unikv_hash_topk_args, num_real_tokens_host, 488);
PIN_AT(unikv_hash_topk_args, num_tokens, 492);
PIN_AT(unikv_hash_topk_args, num_shared, 496);
PIN_AT(unikv_hash_topk_args, routed_scaling_factor, 500);

PIN_SIZE(unikv_indexer_prepare_q_args, 504);
PIN_AT(unikv_indexer_prepare_q_args, struct_size, 0);
PIN_AT(unikv_indexer_prepare_q_args, q, 8);
PIN_AT(unikv_indexer_prepare_q_args, weights, 88);
PIN_AT(unikv_indexer_prepare_q_args, rope_table, 168);
PIN_AT(unikv_indexer_prepare_q_args, positions, 248);
PIN_AT(unikv_indexer_prepare_q_args, q_fp8, 328);
PIN_AT(unikv_indexer_prepare_q_args, weights_out, 408);
PIN_AT(unikv_indexer_prepare_q_args, q_dtype, 488);
PIN_AT(unikv_indexer_prepare_q_args, num_tokens, 492);
PIN_AT(unikv_indexer_prepare_q_args, num_heads, 496);
PIN_AT(unikv_indexer_prepare_q_args, weight_scale, 500);

PIN_SIZE(unikv_indexer_prepare_k_args, 512);
PIN_AT(unikv_indexer_prepare_k_args, struct_size, 0);
PIN_AT(unikv_indexer_prepare_k_args, cache, 8);
PIN_AT(unikv_indexer_prepare_k_args, key, 88);
PIN_AT(unikv_indexer_prepare_k_args, norm_weight, 168);
PIN_AT(unikv_indexer_prepare_k_args, rope_table, 248);
PIN_AT(unikv_indexer_prepare_k_args, positions, 328);
PIN_AT(unikv_indexer_prepare_k_args, loc, 408);
PIN_AT(unikv_indexer_prepare_k_args, page_size, 488);
PIN_AT(unikv_indexer_prepare_k_args, cache_dtype, 492);
PIN_AT(unikv_indexer_prepare_k_args, num_tokens, 496);
PIN_AT(unikv_indexer_prepare_k_args, eps, 500);
PIN_AT(unikv_indexer_prepare_k_args, reserved, 504);

PIN_SIZE(unikv_indexer_topk_args, 664);
PIN_AT(unikv_indexer_topk_args, struct_size, 0);
PIN_AT(unikv_indexer_topk_args, q_fp8, 8);
PIN_AT(unikv_indexer_topk_args, weights, 88);
PIN_AT(unikv_indexer_topk_args, cache, 168);
PIN_AT(unikv_indexer_topk_args, page_table, 248);
PIN_AT(unikv_indexer_topk_args, batch_id, 328);
PIN_AT(unikv_indexer_topk_args, positions, 408);
PIN_AT(unikv_indexer_topk_args, logits, 488);
PIN_AT(unikv_indexer_topk_args, topk_indices, 568);
PIN_AT(unikv_indexer_topk_args, cache_dtype, 648);
PIN_AT(unikv_indexer_topk_args, num_tokens, 652);
PIN_AT(unikv_indexer_topk_args, num_heads, 656);
PIN_AT(unikv_indexer_topk_args, topk, 660);

PIN_SIZE(unikv_csa_stream, 168);
PIN_AT(unikv_csa_stream, struct_size, 0);
PIN_AT(unikv_csa_stream, csa_indptr, 8);
PIN_AT(unikv_csa_stream, csa_indices, 88);

PIN_SIZE(unikv_compress_args, 752);
PIN_AT(unikv_compress_args, struct_size, 0);
PIN_AT(unikv_compress_args, kv_score, 8);
PIN_AT(unikv_compress_args, ape, 88);
PIN_AT(unikv_compress_args, norm_weight, 168);
PIN_AT(unikv_compress_args, rope_table, 248);
PIN_AT(unikv_compress_args, batch_id, 328);
PIN_AT(unikv_compress_args, req_slots, 408);
PIN_AT(unikv_compress_args, positions, 488);
PIN_AT(unikv_compress_args, loc, 568);
PIN_AT(unikv_compress_args, cache, 648);
PIN_AT(unikv_compress_args, layer, 728);
PIN_AT(unikv_compress_args, compressor, 732);
PIN_AT(unikv_compress_args, num_tokens, 736);
PIN_AT(unikv_compress_args, cache_dtype, 740);
PIN_AT(unikv_compress_args, page_size, 744);
PIN_AT(unikv_compress_args, eps, 748);

PIN_SIZE(unikv_compressor_info, 72);
PIN_AT(unikv_compressor_info, struct_size, 0);
PIN_AT(unikv_compressor_info, state, 8);
PIN_AT(unikv_compressor_info, offset_bytes, 16);
PIN_AT(unikv_compressor_info, bytes, 24);
PIN_AT(unikv_compressor_info, slot_bytes, 32);
PIN_AT(unikv_compressor_info, row_floats, 40);
PIN_AT(unikv_compressor_info, score_offset, 44);
PIN_AT(unikv_compressor_info, ring, 48);
PIN_AT(unikv_compressor_info, head_dim, 52);
PIN_AT(unikv_compressor_info, compress_ratio, 56);
PIN_AT(unikv_compressor_info, num_slots, 60);
PIN_AT(unikv_compressor_info, max_rollback, 64);
PIN_AT(unikv_compressor_info, reserved, 68);

PIN_SIZE(unikv_capabilities, 88);
PIN_AT(unikv_capabilities, struct_size, 0);
PIN_AT(unikv_capabilities, backends, 8);
PIN_AT(unikv_capabilities, gpu_devices, 12);
PIN_AT(unikv_capabilities, kv_dtypes, 16);
PIN_AT(unikv_capabilities, fp8_formats, 20);
PIN_AT(unikv_capabilities, ptx_embedded, 24);
PIN_AT(unikv_capabilities, max_heads, 28);
PIN_AT(unikv_capabilities, head_dim, 32);
PIN_AT(unikv_capabilities, max_tokens, 72);
PIN_AT(unikv_capabilities, reserved, 76);
PIN_AT(unikv_capabilities, gpu_archs, 80);

PIN_SIZE(unikv_plan_info, 80);
PIN_AT(unikv_plan_info, struct_size, 0);
PIN_AT(unikv_plan_info, kind, 8);
PIN_AT(unikv_plan_info, backend, 12);
PIN_AT(unikv_plan_info, kernel_family, 16);
PIN_AT(unikv_plan_info, max_tokens, 20);
PIN_AT(unikv_plan_info, num_heads, 24);
PIN_AT(unikv_plan_info, kv_dtype, 28);
PIN_AT(unikv_plan_info, head_block, 32);
PIN_AT(unikv_plan_info, head_blocks, 36);
PIN_AT(unikv_plan_info, max_splits, 40);
PIN_AT(unikv_plan_info, cluster_merge, 44);
PIN_AT(unikv_plan_info, stages, 48);
PIN_AT(unikv_plan_info, dependent_launch, 52);
PIN_AT(unikv_plan_info, raw_fp8_variant, 56);
PIN_AT(unikv_plan_info, sm_count, 60);
PIN_AT(unikv_plan_info, workspace_bytes, 64);
PIN_AT(unikv_plan_info, long_key_splits, 72);
PIN_AT(unikv_plan_info, long_keys, 76);
#else
#error "the pinned layout is for LP64 targets; add this target's numbers"
#endif

#endif
