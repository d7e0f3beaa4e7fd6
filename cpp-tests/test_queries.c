/* What a C caller can ask the library, on the CPU backend: pool sizes before
 * creation (equal to what a created pool reports, and accepted by an adopting
 * pool), the build's capabilities, a required GPU, plan introspection and the
 * log callback, and decode streams without the outputs a pool does not need. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unikv.h>

#include "check.h"

/* A failing call: its status and a message containing `arg`. */
#define CHECK_FAILS(want, arg, call)                                  \
    do {                                                              \
        unikv_status got_ = (call);                                   \
        CHECK(got_ == (want));                                        \
        CHECK(strstr(unikv_last_error_message(), (arg)) != NULL);     \
    } while (0)

static unikv_context *cpu_context(void) {
    unikv_context_options o = {.struct_size = sizeof o, .backend = UNIKV_BACKEND_CPU,
                               .cpu_threads = 1};
    unikv_context *ctx = NULL;
    CHECK_OK(unikv_context_create(&o, &ctx));
    return ctx;
}

static const uint32_t kDtypes[3] = {UNIKV_DTYPE_BF16, UNIKV_DTYPE_FP8_E4M3FN,
                                    UNIKV_DTYPE_FP8_E4M3FNUZ};

static void test_pool_sizes(void) {
    static const uint32_t ratios_a[] = {0, 4, 128};
    static const uint32_t ratios_b[] = {128, 4, 0, 4};
    const unikv_pool_params sets[] = {
        {.struct_size = sizeof(unikv_pool_params), .compress_ratios = ratios_a,
         .num_layers = 3, .max_requests = 3, .window = 128, .c128_blocks = 10},
        {.struct_size = sizeof(unikv_pool_params), .compress_ratios = ratios_b,
         .num_layers = 4, .max_requests = 9, .window = 8, .spec_extra = 2, .c128_blocks = 1},
    };
    unikv_context *ctx = cpu_context();
    size_t s, d;
    uint32_t layer;
    for (s = 0; s < sizeof sets / sizeof sets[0]; ++s) {
        for (d = 0; d < 3; ++d) {
            unikv_pool_params p = sets[s];
            unikv_pool_info before = {.struct_size = sizeof before};
            unikv_pool_info after = {.struct_size = sizeof after};
            unikv_pool *pool = NULL, *adopting = NULL;
            void *data[4] = {0}, *rope[4] = {0};
            const int fp8 = kDtypes[d] != UNIKV_DTYPE_BF16;
            p.kv_dtype = kDtypes[d];
            CHECK_OK(unikv_pool_params_get_info(&p, &before));
            CHECK_OK(unikv_pool_create(ctx, &p, &pool));
            CHECK_OK(unikv_pool_get_info(pool, &after));
            CHECK(before.swa_rows == after.swa_rows && before.row_bytes == after.row_bytes);
            CHECK(before.ring == after.ring && before.num_layers == after.num_layers);
            CHECK(before.kv_dtype == after.kv_dtype && before.owns_memory == 1);
            for (layer = 0; layer < p.num_layers; ++layer) {
                unikv_pool_layer_info want = {.struct_size = sizeof want};
                unikv_pool_layer_info got = {.struct_size = sizeof got};
                CHECK_OK(unikv_pool_params_get_layer(&p, layer, &want));
                CHECK_OK(unikv_pool_get_layer(pool, layer, &got));
                CHECK(want.rows == got.rows && want.swa_rows == got.swa_rows);
                CHECK(want.compressed_rows == got.compressed_rows);
                CHECK(want.bytes == got.bytes && want.rope_bytes == got.rope_bytes);
                CHECK(want.compress_ratio == got.compress_ratio);
                CHECK(want.data == NULL && want.rope_data == NULL);
                CHECK(want.bytes == want.rows * (fp8 ? 512u : 1024u));
                CHECK(want.rope_bytes == (fp8 ? want.rows * 128u : 0u));
                /* Buffers of exactly the reported sizes. */
                CHECK_OK(unikv_memory_alloc(ctx, (size_t)want.bytes, &data[layer]));
                if (fp8) CHECK_OK(unikv_memory_alloc(ctx, (size_t)want.rope_bytes, &rope[layer]));
            }
            {
                unikv_pool_layer_info past = {.struct_size = sizeof past};
                CHECK_FAILS(UNIKV_OUT_OF_RANGE, "layer",
                            unikv_pool_params_get_layer(&p, p.num_layers, &past));
            }
            p.layer_buffers = data;
            p.rope_buffers = fp8 ? rope : NULL;
            CHECK_OK(unikv_pool_create(ctx, &p, &adopting));
            for (layer = 0; layer < p.num_layers; ++layer) {
                unikv_pool_layer_info got = {.struct_size = sizeof got};
                CHECK_OK(unikv_pool_get_layer(adopting, layer, &got));
                CHECK(got.data == data[layer]);
            }
            unikv_pool_destroy(adopting);
            unikv_pool_destroy(pool);
            for (layer = 0; layer < p.num_layers; ++layer) {
                CHECK_OK(unikv_memory_free(ctx, data[layer]));
                CHECK_OK(unikv_memory_free(ctx, rope[layer]));
            }
        }
    }
    /* The same checks and messages as unikv_pool_create. */
    {
        static const uint32_t bad_ratios[] = {0, 5};
        unikv_pool_params p = {.struct_size = sizeof p, .compress_ratios = bad_ratios,
                               .num_layers = 2, .max_requests = 1, .window = 4,
                               .kv_dtype = UNIKV_DTYPE_BF16};
        unikv_pool_info info = {.struct_size = sizeof info};
        unikv_pool *pool = NULL;
        char created[512];
        CHECK(unikv_pool_create(ctx, &p, &pool) == UNIKV_BAD_ENUM);
        snprintf(created, sizeof created, "%s", unikv_last_error_message());
        CHECK_FAILS(UNIKV_BAD_ENUM, "params.compress_ratios[1]",
                    unikv_pool_params_get_info(&p, &info));
        CHECK(strcmp(created, unikv_last_error_message()) == 0);
        p.compress_ratios = ratios_a;
        p.kv_dtype = UNIKV_DTYPE_F32;
        CHECK_FAILS(UNIKV_BAD_DTYPE, "params.kv_dtype", unikv_pool_params_get_info(&p, &info));
        p.kv_dtype = UNIKV_DTYPE_BF16;
        p.window = 0;
        CHECK_FAILS(UNIKV_INVALID_ARGUMENT, "params.window", unikv_pool_params_get_info(&p, &info));
        p.window = 4;
        p.struct_size = 4;
        CHECK_FAILS(UNIKV_BAD_STRUCT_SIZE, "params.struct_size",
                    unikv_pool_params_get_info(&p, &info));
        CHECK_FAILS(UNIKV_NULL_ARGUMENT, "params", unikv_pool_params_get_info(NULL, &info));
        p.struct_size = sizeof p;
        CHECK_FAILS(UNIKV_NULL_ARGUMENT, "info", unikv_pool_params_get_info(&p, NULL));
        CHECK_FAILS(UNIKV_NULL_ARGUMENT, "info", unikv_pool_params_get_layer(&p, 0, NULL));
    }
    unikv_context_destroy(ctx);
}

/* A dense-only pool: only the SWA stream is required. */
static void test_decode_streams_without_compressed_outputs(void) {
    static const uint32_t dense[] = {0, 0};
    static const uint32_t with_csa[] = {0, 4};
    unikv_context *ctx = cpu_context();
    unikv_pool_params p = {.struct_size = sizeof p, .compress_ratios = dense, .num_layers = 2,
                           .max_requests = 2, .window = 4, .kv_dtype = UNIKV_DTYPE_BF16};
    unikv_pool *pool = NULL, *csa_pool = NULL;
    int32_t batch_id[2] = {0, 1}, req_slots[2] = {1, 2}, positions[2] = {2, 9};
    int32_t indptr[3] = {-7, -7, -7}, indices[8];
    unikv_decode_streams_args a;
    memset(&a, 0, sizeof a);
    memset(indices, 0x5a, sizeof indices);
    a.struct_size = sizeof a;
#define VEC(t, ptr, n)                                                              \
    do {                                                                            \
        (t).data = (ptr);                                                           \
        (t).dtype = UNIKV_DTYPE_I32;                                                \
        (t).ndim = 1;                                                               \
        (t).shape[0] = (n);                                                         \
        (t).strides[0] = 1;                                                         \
    } while (0)
    VEC(a.batch_id, batch_id, 2);
    VEC(a.req_slots, req_slots, 2);
    VEC(a.positions, positions, 2);
    VEC(a.swa_indptr, indptr, 3);
    VEC(a.swa_indices, indices, 8);
    a.num_tokens = 2;
    CHECK_OK(unikv_pool_create(ctx, &p, &pool));
    CHECK_OK(unikv_build_decode_streams(pool, &a, NULL));
    CHECK(indptr[0] == 0 && indptr[1] == 3 && indptr[2] == 7);
    /* ring 4: slot 1, positions 0..2 -> rows 4..6; slot 2, positions 6..9 -> 10, 11, 8, 9 */
    CHECK(indices[0] == 4 && indices[1] == 5 && indices[2] == 6);
    CHECK(indices[3] == 10 && indices[4] == 11 && indices[5] == 8 && indices[6] == 9);
    /* A pool with ratio-4 layers needs the CSA stream. */
    p.compress_ratios = with_csa;
    CHECK_OK(unikv_pool_create(ctx, &p, &csa_pool));
    CHECK_FAILS(UNIKV_NULL_ARGUMENT, "csa_indptr", unikv_build_decode_streams(csa_pool, &a, NULL));
    unikv_pool_destroy(csa_pool);
    unikv_pool_destroy(pool);
    unikv_context_destroy(ctx);
#undef VEC
}

static void test_capabilities(void) {
    unikv_capabilities caps = {.struct_size = sizeof caps};
    unikv_context_options o = {.struct_size = sizeof o, .backend = UNIKV_BACKEND_GPU};
    unikv_context *ctx = NULL;
    CHECK_OK(unikv_get_capabilities(&caps));
    CHECK(caps.struct_size == sizeof caps);
    CHECK(caps.backends & (1u << UNIKV_BACKEND_CPU));
    CHECK(caps.kv_dtypes & (1u << UNIKV_DTYPE_BF16));
    CHECK(caps.fp8_formats == ((1u << UNIKV_DTYPE_FP8_E4M3FN) | (1u << UNIKV_DTYPE_FP8_E4M3FNUZ)));
    CHECK(caps.head_dim == 512 && caps.rope_dim == 64 && caps.nope_dim == 448);
    CHECK(caps.max_heads == 128);
    CHECK(caps.gpu_archs != NULL);
    if (!(caps.backends & (1u << UNIKV_BACKEND_GPU))) CHECK(caps.gpu_archs[0] == '\0');
    CHECK_FAILS(UNIKV_NULL_ARGUMENT, "caps", unikv_get_capabilities(NULL));
    /* A required GPU is an error, not the CPU fallback of AUTO. */
    if (caps.gpu_devices == 0) {
        CHECK_FAILS(UNIKV_BACKEND_UNAVAILABLE, "options.backend", unikv_context_create(&o, &ctx));
        CHECK(ctx == NULL);
        CHECK(strstr(unikv_last_error_message(), "UNIKV_BACKEND_GPU") != NULL);
    }
}

/* The log callback's record of this (single-threaded) program. */
static int g_infos, g_errors;
static char g_last_info[512], g_last_error[512];

static void on_log(void *user, uint32_t level, const char *message) {
    CHECK(user == (void *)&g_infos);
    if (level == UNIKV_LOG_INFO) {
        ++g_infos;
        snprintf(g_last_info, sizeof g_last_info, "%s", message);
    } else if (level == UNIKV_LOG_ERROR) {
        ++g_errors;
        snprintf(g_last_error, sizeof g_last_error, "%s", message);
    }
}

static void test_plan_introspection(void) {
    unikv_context *ctx = cpu_context();
    unikv_attention_plan_params pp = {.struct_size = sizeof pp, .max_tokens = 16, .num_heads = 64,
                                      .head_dim = 512, .q_dtype = UNIKV_DTYPE_BF16,
                                      .kv_dtype = UNIKV_DTYPE_FP8_E4M3FN,
                                      .out_dtype = UNIKV_DTYPE_BF16};
    unikv_decode_plan *plan = NULL;
    unikv_prefill_plan *prefill = NULL;
    unikv_plan_info info = {.struct_size = sizeof info};
    char line[512], small[10];
    size_t length = 0, ws = 1;
    CHECK_OK(unikv_set_log_callback(on_log, &g_infos));
    CHECK_OK(unikv_decode_plan_create(ctx, &pp, &plan));
    CHECK(g_infos == 1);
    CHECK_OK(unikv_decode_plan_get_info(plan, &info));
    CHECK(info.kind == UNIKV_PLAN_DECODE && info.backend == UNIKV_BACKEND_CPU);
    CHECK(info.kernel_family == UNIKV_KERNEL_CPU_REFERENCE);
    CHECK(info.num_heads == 64 && info.max_tokens == 16 && info.kv_dtype == UNIKV_DTYPE_FP8_E4M3FN);
    CHECK(info.head_block * info.head_blocks >= info.num_heads);
    CHECK(info.max_splits == 1 && info.cluster_merge == 0);
    CHECK_OK(unikv_decode_plan_workspace_size(plan, &ws));
    CHECK(info.workspace_bytes == ws);
    CHECK_OK(unikv_decode_plan_describe(plan, NULL, 0, &length));
    CHECK(length > 0 && length < sizeof line);
    CHECK_OK(unikv_decode_plan_describe(plan, line, sizeof line, NULL));
    CHECK(strlen(line) == length);
    CHECK(strcmp(line, g_last_info) == 0); /* the log saw the same line */
    CHECK(strncmp(line, "decode plan: cpu", 16) == 0);
    CHECK_OK(unikv_decode_plan_describe(plan, small, sizeof small, &length));
    CHECK(strlen(small) == sizeof small - 1 && strncmp(small, line, sizeof small - 1) == 0);
    CHECK_FAILS(UNIKV_NULL_ARGUMENT, "buf", unikv_decode_plan_describe(plan, NULL, 4, NULL));
    CHECK(g_errors == 1 && strstr(g_last_error, "buf") != NULL);
    CHECK_FAILS(UNIKV_INVALID_HANDLE, "plan",
                unikv_prefill_plan_get_info((const unikv_prefill_plan *)plan, &info));
    CHECK_OK(unikv_prefill_plan_create(ctx, &pp, &prefill));
    CHECK(g_infos == 2 && strncmp(g_last_info, "prefill plan: cpu", 17) == 0);
    CHECK_OK(unikv_prefill_plan_get_info(prefill, &info));
    CHECK(info.kind == UNIKV_PLAN_PREFILL);
    CHECK_OK(unikv_prefill_plan_describe(prefill, line, sizeof line, NULL));
    CHECK(strcmp(line, g_last_info) == 0);
    CHECK_OK(unikv_set_log_callback(NULL, NULL));
    CHECK(unikv_decode_plan_describe(plan, NULL, 4, NULL) == UNIKV_NULL_ARGUMENT);
    CHECK(g_errors == 2); /* the last failure came after the callback was removed */
    unikv_prefill_plan_destroy(prefill);
    unikv_decode_plan_destroy(plan);
    unikv_context_destroy(ctx);
}

int main(void) {
    test_pool_sizes();
    test_decode_streams_without_compressed_outputs();
    test_capabilities();
    test_plan_introspection();
    printf("test_queries: ok\n");
    return 0;
}
