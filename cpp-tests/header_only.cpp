// header_only.c's checks compiled as C++17 (-pedantic -Werror): the header
// compiles on its own, the public structs have the LP64 layout the ABI
// promises, and the version macros agree with each other and with the library.
// Keep the two files in step. Includes nothing but the header on purpose.
#include <unikv.h>

// Natural alignment with 8-byte pointers and int64_t: x86_64 (and aarch64).
#if defined(__LP64__)
#define PIN_SIZE(type, size) static_assert(sizeof(type) == (size), "sizeof " #type)
#define PIN_AT(type, field, off) \
    static_assert(offsetof(type, field) == (off), "offsetof " #type "." #field)

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

PIN_SIZE(unikv_pool_params, 48);
PIN_AT(unikv_pool_params, struct_size, 0);
PIN_AT(unikv_pool_params, compress_ratios, 8);
PIN_AT(unikv_pool_params, layer_buffers, 16);
PIN_AT(unikv_pool_params, num_layers, 24);
PIN_AT(unikv_pool_params, max_requests, 28);
PIN_AT(unikv_pool_params, window, 32);
PIN_AT(unikv_pool_params, spec_extra, 36);
PIN_AT(unikv_pool_params, c128_blocks, 40);
PIN_AT(unikv_pool_params, kv_dtype, 44);

PIN_SIZE(unikv_pool_info, 56);
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

PIN_SIZE(unikv_pool_layer_info, 56);
PIN_AT(unikv_pool_layer_info, struct_size, 0);
PIN_AT(unikv_pool_layer_info, data, 8);
PIN_AT(unikv_pool_layer_info, rows, 16);
PIN_AT(unikv_pool_layer_info, swa_rows, 24);
PIN_AT(unikv_pool_layer_info, compressed_rows, 32);
PIN_AT(unikv_pool_layer_info, bytes, 40);
PIN_AT(unikv_pool_layer_info, compress_ratio, 48);
PIN_AT(unikv_pool_layer_info, reserved, 52);

PIN_SIZE(unikv_attention_plan_params, 32);
PIN_AT(unikv_attention_plan_params, struct_size, 0);
PIN_AT(unikv_attention_plan_params, max_tokens, 8);
PIN_AT(unikv_attention_plan_params, num_heads, 12);
PIN_AT(unikv_attention_plan_params, head_dim, 16);
PIN_AT(unikv_attention_plan_params, q_dtype, 20);
PIN_AT(unikv_attention_plan_params, kv_dtype, 24);
PIN_AT(unikv_attention_plan_params, out_dtype, 28);

// Argument structs: struct_size, then 80-byte tensors, then scalars.
PIN_SIZE(unikv_decode_args, 504);
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

PIN_SIZE(unikv_prefill_args, 744);
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
#else
#error "the pinned layout is for LP64 targets; add this target's numbers"
#endif

static_assert(UNIKV_VERSION == UNIKV_VERSION_MAJOR * 1000000 + UNIKV_VERSION_MINOR * 1000 +
                                   UNIKV_VERSION_PATCH,
              "UNIKV_VERSION packs major, minor and patch");

static int same_string(const char *a, const char *b) {
    while (*a != '\0' && *a == *b) {
        ++a;
        ++b;
    }
    return *a == *b;
}

// C++ sees the enums as types with a fixed uint32_t underlying type; C sees
// uint32_t typedefs. Both must pass through the ABI as 4 bytes.
static_assert(sizeof(unikv_status) == sizeof(uint32_t), "unikv_status is 32-bit");
static_assert(sizeof(unikv_dtype) == sizeof(uint32_t), "unikv_dtype is 32-bit");
static_assert(sizeof(unikv_backend) == sizeof(uint32_t), "unikv_backend is 32-bit");
static_assert(sizeof(unikv_copy_kind) == sizeof(uint32_t), "unikv_copy_kind is 32-bit");

// "MAJOR.MINOR.PATCH" packed like UNIKV_VERSION, or 0 when malformed.
static unsigned long packed_version(const char *s) {
    unsigned long parts[3] = {0, 0, 0};
    for (int i = 0; i < 3; ++i) {
        if (*s < '0' || *s > '9') return 0;
        while (*s >= '0' && *s <= '9')
            parts[i] = parts[i] * 10 + static_cast<unsigned long>(*s++ - '0');
        if (*s != (i < 2 ? '.' : '\0')) return 0;
        ++s;
    }
    return parts[0] * 1000000 + parts[1] * 1000 + parts[2];
}

// Exit code: 0 = pass, otherwise the number of the failed check.
int main() {
    if (unikv_version() != UNIKV_VERSION) return 1;
    if (!same_string(unikv_version_string(), UNIKV_VERSION_STRING)) return 2;
    if (packed_version(UNIKV_VERSION_STRING) != UNIKV_VERSION) return 3;
    return 0;
}
