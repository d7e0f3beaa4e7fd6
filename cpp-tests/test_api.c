/* Lifecycle and bad-input tests through the C ABI on the CPU backend (host
 * memory, so the test reads and writes library buffers directly). Every
 * failing call is checked for its exact status, a last-error message naming
 * the argument, and an output buffer left byte-identical. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <unikv.h>

#define D 512 /* latent width */
#define ROW_BYTES 1024

#include "check.h"

/* Runs a call that must fail with `want` and a message naming `arg`, leaving
 * the `bytes` bytes at `out` (poisoned by the caller) untouched. */
#define EXPECT_FAIL(want, arg, out, bytes, call)                                           \
    do {                                                                                   \
        unsigned char *before_ = snapshot((out), (bytes));                                 \
        expect_failure(__FILE__, __LINE__, #call, (call), (want), (arg), (out), (bytes), \
                       before_);                                                           \
    } while (0)

static unsigned char *snapshot(const void *p, size_t bytes) {
    unsigned char *copy = malloc(bytes);
    CHECK(copy != NULL);
    memcpy(copy, p, bytes);
    return copy;
}

static int is_ident(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* `name` occurs in `msg` as a whole word ("q" must not match "seq"). */
static int names_arg(const char *msg, const char *name) {
    size_t n = strlen(name);
    const char *p;
    for (p = strstr(msg, name); p != NULL; p = strstr(p + 1, name)) {
        if ((p == msg || !is_ident(p[-1])) && !is_ident(p[n])) return 1;
    }
    return 0;
}

static void expect_failure(const char *file, int line, const char *call, unikv_status got,
                           unikv_status want, const char *arg, const void *out, size_t bytes,
                           unsigned char *before) {
    const char *msg = unikv_last_error_message();
    const char *problem = NULL;
    if (got != want)
        problem = "wrong status";
    else if (!names_arg(msg, arg))
        problem = "message does not name the argument";
    else if (memcmp(out, before, bytes) != 0)
        problem = "output written by a failing call";
    free(before);
    if (problem != NULL) {
        fprintf(stderr, "%s:%d: %s\n  %s\n  got %s (%u), want %s (%u); argument \"%s\"\n"
                        "  message: \"%s\"\n",
                file, line, problem, call, unikv_status_string(got), got,
                unikv_status_string(want), want, arg, msg);
        exit(1);
    }
}

/* ---- random inputs and bf16 ---------------------------------------------------- */

static uint64_t rng_state;

/* Uniform in [-1, 1) (xorshift64*). */
static float uniform(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (float)((rng_state * 2685821657736338717ull) >> 40) / (float)(1 << 23) - 1.0f;
}

static uint16_t to_bf16(float f) { /* round to nearest even; inputs are finite */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static double from_bf16(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- helpers ------------------------------------------------------------------- */

/* A contiguous tensor of rank 1..3 (unused extents are ignored). */
static unikv_tensor tensor(void *data, uint32_t dtype, uint32_t ndim, int64_t d0, int64_t d1,
                           int64_t d2) {
    unikv_tensor t;
    const int64_t dims[3] = {d0, d1, d2};
    int64_t stride = 1;
    uint32_t i;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.ndim = ndim;
    for (i = ndim; i-- > 0;) {
        t.shape[i] = dims[i];
        t.strides[i] = stride;
        stride *= dims[i];
    }
    return t;
}

static void *alloc(const unikv_context *ctx, size_t bytes) {
    void *p = NULL;
    CHECK_OK(unikv_memory_alloc(ctx, bytes, &p));
    CHECK(p != NULL);
    return p;
}

static unikv_context *cpu_context(void) {
    unikv_context_options o = {.struct_size = sizeof o, .backend = UNIKV_BACKEND_CPU,
                               .cpu_threads = 2};
    unikv_context *ctx = NULL;
    CHECK_OK(unikv_context_create(&o, &ctx));
    CHECK(ctx != NULL);
    return ctx;
}

/* Rows of one layer, from the formula of unikv_pool_params. */
static uint64_t expected_compressed_rows(const unikv_pool_params *p, uint32_t ratio) {
    if (ratio == 0) return 0;
    return (uint64_t)p->c128_blocks * (ratio == 4 ? 32 : 1) + 256 / ratio;
}

static uint64_t expected_swa_rows(const unikv_pool_params *p) {
    return (uint64_t)(p->max_requests + 1) * (p->window + p->spec_extra);
}

/* Pool-wide and per-layer accessors agree with the formula. */
static void check_geometry(const unikv_pool *pool, const unikv_pool_params *p, uint32_t owns) {
    unikv_pool_info info = {.struct_size = sizeof info};
    uint32_t layer;
    CHECK_OK(unikv_pool_get_info(pool, &info));
    CHECK(info.struct_size == sizeof info);
    CHECK(info.swa_rows == expected_swa_rows(p));
    CHECK(info.row_bytes == ROW_BYTES);
    CHECK(info.num_layers == p->num_layers);
    CHECK(info.max_requests == p->max_requests);
    CHECK(info.window == p->window);
    CHECK(info.ring == p->window + p->spec_extra);
    CHECK(info.c128_blocks == p->c128_blocks);
    CHECK(info.slots_in_use == 0);
    CHECK(info.kv_dtype == UNIKV_DTYPE_BF16);
    CHECK(info.owns_memory == owns);
    for (layer = 0; layer < p->num_layers; ++layer) {
        unikv_pool_layer_info li = {.struct_size = sizeof li};
        uint32_t ratio = p->compress_ratios[layer];
        CHECK_OK(unikv_pool_get_layer(pool, layer, &li));
        CHECK(li.data != NULL && (uintptr_t)li.data % 16 == 0);
        CHECK(li.swa_rows == expected_swa_rows(p));
        CHECK(li.compressed_rows == expected_compressed_rows(p, ratio));
        CHECK(li.rows == li.swa_rows + li.compressed_rows);
        CHECK(li.bytes == li.rows * ROW_BYTES);
        CHECK(li.compress_ratio == ratio);
        if (p->layer_buffers != NULL) CHECK(li.data == p->layer_buffers[layer]);
    }
}

/* ---- tests --------------------------------------------------------------------- */

static void test_status_strings(void) {
    static const uint32_t all[] = UNIKV_STATUS_ALL;
    const size_t n = sizeof all / sizeof all[0];
    size_t i, j;
    CHECK(n == UNIKV_OVERLAPPING_BUFFERS + 1);
    for (i = 0; i < n; ++i) {
        const char *s = unikv_status_string(all[i]);
        CHECK(all[i] == i); /* values are stable and dense */
        CHECK(s != NULL && s[0] != '\0' && strcmp(s, "unknown status") != 0);
        for (j = 0; j < i; ++j) CHECK(strcmp(s, unikv_status_string(all[j])) != 0);
    }
    CHECK(strcmp(unikv_status_string((uint32_t)n), "unknown status") == 0);
    CHECK(strcmp(unikv_status_string(UINT32_MAX), "unknown status") == 0);
}

static void test_context(void) {
    unikv_context_options o = {.struct_size = sizeof o, .backend = UNIKV_BACKEND_CPU,
                               .cpu_threads = 2, .validate = 1};
    unikv_context_info info;
    unikv_context *ctx = NULL;
    unikv_context *out;

    CHECK_OK(unikv_context_create(&o, &ctx));
    memset(&info, 0xA5, sizeof info);
    info.struct_size = sizeof info;
    CHECK_OK(unikv_context_get_info(ctx, &info));
    CHECK(info.backend == UNIKV_BACKEND_CPU);
    CHECK(info.device == 0);
    CHECK(info.cpu_threads == 2);
    CHECK(info.validate == 1);

    memset(&info, 0xA5, sizeof info);
    info.struct_size = sizeof info;
    EXPECT_FAIL(UNIKV_NULL_ARGUMENT, "ctx", &info, sizeof info,
                unikv_context_get_info(NULL, &info));
    EXPECT_FAIL(UNIKV_NULL_ARGUMENT, "info", &info, sizeof info, unikv_context_get_info(ctx, NULL));
    info.struct_size = 0;
    EXPECT_FAIL(UNIKV_BAD_STRUCT_SIZE, "info.struct_size", &info, sizeof info,
                unikv_context_get_info(ctx, &info));
    unikv_context_destroy(ctx);

    /* AUTO picks a concrete backend: the CPU one in a CPU-only build. */
    o.backend = UNIKV_BACKEND_AUTO;
    o.cpu_threads = 0;
    CHECK_OK(unikv_context_create(&o, &ctx));
    info.struct_size = sizeof info;
    CHECK_OK(unikv_context_get_info(ctx, &info));
    CHECK(info.backend == UNIKV_BACKEND_CPU || info.backend == UNIKV_BACKEND_CUDA ||
          info.backend == UNIKV_BACKEND_ROCM);
    if (info.backend == UNIKV_BACKEND_CPU) CHECK(info.cpu_threads >= 1);
    unikv_context_destroy(ctx);

    memset(&out, 0xA5, sizeof out);
    EXPECT_FAIL(UNIKV_NULL_ARGUMENT, "options", &out, sizeof out, unikv_context_create(NULL, &out));
    EXPECT_FAIL(UNIKV_NULL_ARGUMENT, "out", &out, sizeof out, unikv_context_create(&o, NULL));
    o.struct_size = 0;
    EXPECT_FAIL(UNIKV_BAD_STRUCT_SIZE, "options.struct_size", &out, sizeof out,
                unikv_context_create(&o, &out));
    o.struct_size = sizeof o;
    o.backend = 99;
    EXPECT_FAIL(UNIKV_BAD_ENUM, "options.backend", &out, sizeof out,
                unikv_context_create(&o, &out));
}

static void test_destroy_null(void) {
    unikv_context *ctx = cpu_context();
    unikv_context_destroy(NULL);
    unikv_pool_destroy(NULL);
    unikv_decode_plan_destroy(NULL);
    unikv_prefill_plan_destroy(NULL);
    CHECK_OK(unikv_memory_free(ctx, NULL));
    unikv_context_destroy(ctx);
}

static void test_memory(void) {
    unikv_context *ctx = cpu_context();
    unsigned char *p = alloc(ctx, 1000);
    void *out;
    size_t i;
    int local;
    CHECK((uintptr_t)p % 256 == 0);
    for (i = 0; i < 1000; ++i) CHECK(p[i] == 0);
    memset(&out, 0xA5, sizeof out);
    EXPECT_FAIL(UNIKV_NULL_ARGUMENT, "out", &out, sizeof out, unikv_memory_alloc(ctx, 16, NULL));
    EXPECT_FAIL(UNIKV_NULL_ARGUMENT, "ctx", &out, sizeof out, unikv_memory_alloc(NULL, 16, &out));
    EXPECT_FAIL(UNIKV_INVALID_ARGUMENT, "ptr", &out, sizeof out, unikv_memory_free(ctx, &local));
    CHECK_OK(unikv_memory_free(ctx, p));
    unikv_context_destroy(ctx);
}

static void test_pools(void) {
    static const uint32_t ratios[3] = {0, 4, 128};
    unikv_context *ctx = cpu_context();
    unikv_pool_params p = {.struct_size = sizeof p, .compress_ratios = ratios, .num_layers = 3,
                           .max_requests = 3, .window = 128, .spec_extra = 1, .c128_blocks = 2,
                           .kv_dtype = UNIKV_DTYPE_BF16};
    void *buffers[3];
    unikv_pool *pool = NULL, *out;
    unikv_pool_layer_info li;
    uint32_t layer;
    uint64_t i;

    /* Owned memory: zeroed, freed by the pool. */
    CHECK_OK(unikv_pool_create(ctx, &p, &pool));
    check_geometry(pool, &p, 1);
    li.struct_size = sizeof li;
    CHECK_OK(unikv_pool_get_layer(pool, 1, &li));
    for (i = 0; i < li.bytes; ++i) CHECK(((const unsigned char *)li.data)[i] == 0);
    memset(&li, 0xA5, sizeof li);
    li.struct_size = sizeof li;
    EXPECT_FAIL(UNIKV_OUT_OF_RANGE, "layer", &li, sizeof li, unikv_pool_get_layer(pool, 3, &li));
    /* Pools keep their context alive. */
    unikv_context_destroy(ctx);
    check_geometry(pool, &p, 1);
    unikv_pool_destroy(pool);

    /* Adopted memory: sized by the caller from the formula, not freed by the pool. */
    ctx = cpu_context();
    for (layer = 0; layer < 3; ++layer) {
        uint64_t rows = expected_swa_rows(&p) + expected_compressed_rows(&p, ratios[layer]);
        buffers[layer] = alloc(ctx, rows * ROW_BYTES);
    }
    p.layer_buffers = buffers;
    CHECK_OK(unikv_pool_create(ctx, &p, &pool));
    check_geometry(pool, &p, 0);
    unikv_pool_destroy(pool);
    buffers[1] = (char *)buffers[1] + 8; /* rows must be 16-byte aligned */
    memset(&out, 0xA5, sizeof out);
    EXPECT_FAIL(UNIKV_BAD_ALIGNMENT, "layer_buffers", &out, sizeof out,
                unikv_pool_create(ctx, &p, &out));
    buffers[1] = (char *)buffers[1] - 8;
    for (layer = 0; layer < 3; ++layer) CHECK_OK(unikv_memory_free(ctx, buffers[layer]));
    p.layer_buffers = NULL;
    unikv_context_destroy(ctx);
}

static void test_pool_bad_params(void) {
    static const uint32_t ratios[2] = {4, 5};
    unikv_context *ctx = cpu_context();
    unikv_pool_params p = {.struct_size = sizeof p, .compress_ratios = ratios, .num_layers = 1,
                           .max_requests = 2, .window = 128, .kv_dtype = UNIKV_DTYPE_BF16};
    unikv_pool *out;
    memset(&out, 0xA5, sizeof out);

    EXPECT_FAIL(UNIKV_NULL_ARGUMENT, "ctx", &out, sizeof out, unikv_pool_create(NULL, &p, &out));
    EXPECT_FAIL(UNIKV_NULL_ARGUMENT, "params", &out, sizeof out,
                unikv_pool_create(ctx, NULL, &out));
    EXPECT_FAIL(UNIKV_NULL_ARGUMENT, "out", &out, sizeof out, unikv_pool_create(ctx, &p, NULL));
    p.struct_size = 0;
    EXPECT_FAIL(UNIKV_BAD_STRUCT_SIZE, "params.struct_size", &out, sizeof out,
                unikv_pool_create(ctx, &p, &out));
    p.struct_size = sizeof p;
    p.num_layers = 2; /* second ratio is 5 */
    EXPECT_FAIL(UNIKV_BAD_ENUM, "params.compress_ratios", &out, sizeof out,
                unikv_pool_create(ctx, &p, &out));
    p.num_layers = 0;
    EXPECT_FAIL(UNIKV_INVALID_ARGUMENT, "params.num_layers", &out, sizeof out,
                unikv_pool_create(ctx, &p, &out));
    p.num_layers = 1;
    p.compress_ratios = NULL;
    EXPECT_FAIL(UNIKV_NULL_ARGUMENT, "params.compress_ratios", &out, sizeof out,
                unikv_pool_create(ctx, &p, &out));
    p.compress_ratios = ratios;
    p.kv_dtype = 99;
    EXPECT_FAIL(UNIKV_BAD_ENUM, "params.kv_dtype", &out, sizeof out,
                unikv_pool_create(ctx, &p, &out));
    p.kv_dtype = UNIKV_DTYPE_F32;
    EXPECT_FAIL(UNIKV_BAD_DTYPE, "params.kv_dtype", &out, sizeof out,
                unikv_pool_create(ctx, &p, &out));
    unikv_context_destroy(ctx);
}

/* FP8 pools: two buffers per layer (512-byte nope rows, bf16 rope rows). */
static void test_fp8_pools(void) {
    static const uint32_t ratio = 4;
    unikv_context *ctx = cpu_context();
    unikv_pool_params p = {.struct_size = sizeof p, .compress_ratios = &ratio, .num_layers = 1,
                           .max_requests = 2, .window = 128, .c128_blocks = 2,
                           .kv_dtype = UNIKV_DTYPE_FP8_E4M3FN};
    unikv_pool *pool = NULL, *out;
    unikv_pool_info info = {.struct_size = sizeof info};
    unikv_pool_layer_info li = {.struct_size = sizeof li};
    void *nope[1], *rope[1];

    CHECK_OK(unikv_pool_create(ctx, &p, &pool));
    CHECK_OK(unikv_pool_get_info(pool, &info));
    CHECK(info.row_bytes == 640 && info.kv_dtype == UNIKV_DTYPE_FP8_E4M3FN);
    CHECK_OK(unikv_pool_get_layer(pool, 0, &li));
    CHECK(li.bytes == li.rows * 512 && li.rope_bytes == li.rows * 128 && li.rope_data != NULL);
    nope[0] = alloc(ctx, li.bytes);
    rope[0] = alloc(ctx, li.rope_bytes);
    unikv_pool_destroy(pool);

    /* Adopting needs both buffers. */
    p.layer_buffers = nope;
    memset(&out, 0xA5, sizeof out);
    EXPECT_FAIL(UNIKV_NULL_ARGUMENT, "params.rope_buffers", &out, sizeof out,
                unikv_pool_create(ctx, &p, &out));
    p.rope_buffers = rope;
    CHECK_OK(unikv_pool_create(ctx, &p, &pool));
    CHECK_OK(unikv_pool_get_layer(pool, 0, &li));
    CHECK(li.data == nope[0] && li.rope_data == rope[0]);
    unikv_pool_destroy(pool);
    /* A bf16 pool has no rope buffers. */
    p.kv_dtype = UNIKV_DTYPE_BF16;
    EXPECT_FAIL(UNIKV_INVALID_ARGUMENT, "params.rope_buffers", &out, sizeof out,
                unikv_pool_create(ctx, &p, &out));
    CHECK_OK(unikv_memory_free(ctx, nope[0]));
    CHECK_OK(unikv_memory_free(ctx, rope[0]));
    unikv_context_destroy(ctx);
}

static void test_slots(void) {
    static const uint32_t ratio = 0;
    unikv_context *ctx = cpu_context();
    unikv_pool_params p = {.struct_size = sizeof p, .compress_ratios = &ratio, .num_layers = 1,
                           .max_requests = 3, .window = 4, .kv_dtype = UNIKV_DTYPE_BF16};
    unikv_pool_info info = {.struct_size = sizeof info};
    unikv_pool *pool = NULL;
    uint32_t slot, expect;

    CHECK_OK(unikv_pool_create(ctx, &p, &pool));
    for (expect = 1; expect <= 3; ++expect) { /* lowest first; 0 is reserved */
        CHECK_OK(unikv_pool_acquire_slot(pool, &slot));
        CHECK(slot == expect);
    }
    memset(&slot, 0xA5, sizeof slot);
    EXPECT_FAIL(UNIKV_CAPACITY_EXCEEDED, "pool", &slot, sizeof slot,
                unikv_pool_acquire_slot(pool, &slot));
    EXPECT_FAIL(UNIKV_NULL_ARGUMENT, "slot", &slot, sizeof slot,
                unikv_pool_acquire_slot(pool, NULL));
    EXPECT_FAIL(UNIKV_NULL_ARGUMENT, "pool", &slot, sizeof slot,
                unikv_pool_acquire_slot(NULL, &slot));
    CHECK_OK(unikv_pool_get_info(pool, &info));
    CHECK(info.slots_in_use == 3);

    /* Releases have no output; `slot` stays poisoned and occupancy is rechecked. */
    EXPECT_FAIL(UNIKV_OUT_OF_RANGE, "slot", &slot, sizeof slot, unikv_pool_release_slot(pool, 0));
    EXPECT_FAIL(UNIKV_OUT_OF_RANGE, "slot", &slot, sizeof slot, unikv_pool_release_slot(pool, 4));
    CHECK_OK(unikv_pool_release_slot(pool, 2));
    EXPECT_FAIL(UNIKV_INVALID_STATE, "slot", &slot, sizeof slot, unikv_pool_release_slot(pool, 2));
    CHECK_OK(unikv_pool_get_info(pool, &info));
    CHECK(info.slots_in_use == 2);
    CHECK_OK(unikv_pool_acquire_slot(pool, &slot));
    CHECK(slot == 2);
    unikv_pool_destroy(pool);
    unikv_context_destroy(ctx);
}

static void test_plans(void) {
    unikv_context *ctx = cpu_context();
    unikv_attention_plan_params pp = {.struct_size = sizeof pp, .max_tokens = 4, .num_heads = 8,
                                      .head_dim = D, .q_dtype = UNIKV_DTYPE_BF16,
                                      .kv_dtype = UNIKV_DTYPE_BF16,
                                      .out_dtype = UNIKV_DTYPE_BF16};
    unikv_decode_plan *plan = NULL, *out;
    unikv_prefill_plan *prefill = NULL;
    size_t bytes;

    CHECK_OK(unikv_decode_plan_create(ctx, &pp, &plan));
    CHECK_OK(unikv_decode_plan_workspace_size(plan, &bytes));
    CHECK(bytes == 0); /* CPU backend */
    unikv_decode_plan_destroy(plan);
    CHECK_OK(unikv_prefill_plan_create(ctx, &pp, &prefill));
    CHECK_OK(unikv_prefill_plan_workspace_size(prefill, &bytes));
    CHECK(bytes == 0);
    unikv_prefill_plan_destroy(prefill);

    memset(&out, 0xA5, sizeof out);
    pp.num_heads = 0;
    EXPECT_FAIL(UNIKV_INVALID_ARGUMENT, "num_heads", &out, sizeof out,
                unikv_decode_plan_create(ctx, &pp, &out));
    pp.num_heads = 8;
    pp.head_dim = 256;
    EXPECT_FAIL(UNIKV_INVALID_ARGUMENT, "head_dim", &out, sizeof out,
                unikv_decode_plan_create(ctx, &pp, &out));
    pp.head_dim = D;
    pp.q_dtype = 0; /* 0 is not a dtype */
    EXPECT_FAIL(UNIKV_BAD_ENUM, "params.q_dtype", &out, sizeof out,
                unikv_decode_plan_create(ctx, &pp, &out));
    pp.q_dtype = UNIKV_DTYPE_BF16;
    pp.struct_size = 0;
    EXPECT_FAIL(UNIKV_BAD_STRUCT_SIZE, "params.struct_size", &out, sizeof out,
                unikv_decode_plan_create(ctx, &pp, &out));
    unikv_context_destroy(ctx);
}

/* ---- sparse decode ------------------------------------------------------------- */

enum { T = 2, H = 4, POOL_ROWS = 16 };

/* Dense float64 reference of docs/attention.md §1 for one (token, head); K = V. */
static void reference(const uint16_t *q, const uint16_t *kv, const int32_t *rows, int n,
                      double sink, double scale, double *out, double *lse) {
    double s[POOL_ROWS], m = sink, den;
    int j, d;
    for (j = 0; j < n; ++j) {
        double dot = 0;
        for (d = 0; d < D; ++d) dot += from_bf16(q[d]) * from_bf16(kv[(size_t)rows[j] * D + d]);
        s[j] = scale * dot;
        if (s[j] > m) m = s[j];
    }
    den = exp(sink - m);
    for (j = 0; j < n; ++j) den += exp(s[j] - m);
    for (d = 0; d < D; ++d) {
        double acc = 0;
        for (j = 0; j < n; ++j) acc += exp(s[j] - m) * from_bf16(kv[(size_t)rows[j] * D + d]);
        out[d] = acc / den;
    }
    *lse = m + log(den);
}

static void test_decode(void) {
    static const uint32_t ratio = 0;
    /* Token 0 attends rows {1, 3, 5}, token 1 rows {0, 2, 4, 6, 7, 9}. */
    static const int32_t indices[9] = {1, 3, 5, 0, 2, 4, 6, 7, 9};
    static const int32_t indptr[T + 1] = {0, 3, 9};
    const float scale = 1.0f / sqrtf((float)D);
    unikv_context *ctx = cpu_context();
    unikv_pool_params pp = {.struct_size = sizeof pp, .compress_ratios = &ratio, .num_layers = 1,
                            .max_requests = 1, .window = 8, .kv_dtype = UNIKV_DTYPE_BF16};
    unikv_attention_plan_params ap = {.struct_size = sizeof ap, .max_tokens = T, .num_heads = H,
                                      .head_dim = D, .q_dtype = UNIKV_DTYPE_BF16,
                                      .kv_dtype = UNIKV_DTYPE_BF16,
                                      .out_dtype = UNIKV_DTYPE_BF16};
    /* out [T, H, D] bf16 and lse [T, H] f32 share one buffer, so one snapshot
     * covers every output. */
    const size_t out_bytes = (size_t)T * H * D * 2, outputs_bytes = out_bytes + T * H * 4;
    unikv_pool_layer_info li = {.struct_size = sizeof li};
    unikv_pool *pool = NULL;
    unikv_decode_plan *plan = NULL;
    uint16_t *q, kv[POOL_ROWS * D];
    int32_t *idx, *ptr;
    float *sink, lse_out[T * H];
    unsigned char *outputs;
    uint16_t *out;
    unikv_decode_args a;
    size_t i;
    int t, h;

    CHECK_OK(unikv_pool_create(ctx, &pp, &pool));
    CHECK_OK(unikv_pool_get_layer(pool, 0, &li));
    CHECK(li.rows == POOL_ROWS);
    CHECK_OK(unikv_decode_plan_create(ctx, &ap, &plan));
    q = alloc(ctx, (size_t)T * H * D * 2);
    idx = alloc(ctx, sizeof indices);
    ptr = alloc(ctx, sizeof indptr);
    sink = alloc(ctx, H * sizeof(float));
    outputs = alloc(ctx, outputs_bytes);
    out = (uint16_t *)outputs;

    for (i = 0; i < (size_t)POOL_ROWS * D; ++i) kv[i] = to_bf16(uniform());
    CHECK_OK(unikv_memory_copy(ctx, li.data, kv, sizeof kv, UNIKV_COPY_HOST_TO_DEVICE, NULL));
    for (i = 0; i < (size_t)T * H * D; ++i) q[i] = to_bf16(2.0f * uniform());
    for (h = 0; h < H; ++h) sink[h] = uniform();
    memcpy(idx, indices, sizeof indices);
    memcpy(ptr, indptr, sizeof indptr);

    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = tensor(q, UNIKV_DTYPE_BF16, 3, T, H, D);
    a.indices = tensor(idx, UNIKV_DTYPE_I32, 1, 9, 0, 0);
    a.indptr = tensor(ptr, UNIKV_DTYPE_I32, 1, T + 1, 0, 0);
    a.sink = tensor(sink, UNIKV_DTYPE_F32, 1, H, 0, 0);
    a.out = tensor(out, UNIKV_DTYPE_BF16, 3, T, H, D);
    a.lse = tensor(outputs + out_bytes, UNIKV_DTYPE_F32, 2, T, H, 0);
    a.num_tokens = T;
    a.softmax_scale = scale;

    memset(outputs, 0xA5, outputs_bytes);
    CHECK_OK(unikv_sparse_decode(plan, pool, &a, NULL, 0, NULL));
    memcpy(lse_out, outputs + out_bytes, sizeof lse_out);
    /* Judged per (token, head): a batch-wide norm would hide one bad row. */
    for (t = 0; t < T; ++t) {
        for (h = 0; h < H; ++h) {
            const size_t row = (size_t)t * H + h;
            double ref[D], lse, err = 0, norm = 0, rel;
            int d;
            reference(q + row * D, kv, indices + indptr[t], indptr[t + 1] - indptr[t], sink[h],
                      scale, ref, &lse);
            for (d = 0; d < D; ++d) {
                double e = from_bf16(out[row * D + d]) - ref[d];
                err += e * e;
                norm += ref[d] * ref[d];
            }
            rel = sqrt(err / norm);
            if (!(rel < 1e-2) || !(fabs(lse_out[row] - lse) < 1e-4 * (1 + fabs(lse)))) {
                fprintf(stderr, "%s:%d: token %d head %d: relative error %g, lse %g (want %g)\n",
                        __FILE__, __LINE__, t, h, rel, lse_out[row], lse);
                exit(1);
            }
        }
    }

    /* Failing launches leave out and lse exactly as they were. */
    memset(outputs, 0xA5, outputs_bytes);
    a.q.dtype = UNIKV_DTYPE_F32;
    EXPECT_FAIL(UNIKV_BAD_DTYPE, "q", outputs, outputs_bytes,
                unikv_sparse_decode(plan, pool, &a, NULL, 0, NULL));
    a.q = tensor(q, UNIKV_DTYPE_BF16, 3, T, H, D / 2);
    EXPECT_FAIL(UNIKV_BAD_SHAPE, "q", outputs, outputs_bytes,
                unikv_sparse_decode(plan, pool, &a, NULL, 0, NULL));
    a.q = tensor(q, UNIKV_DTYPE_BF16, 3, T, H, D);
    idx[7] = POOL_ROWS; /* one past the layer's rows */
    EXPECT_FAIL(UNIKV_OUT_OF_RANGE, "indices", outputs, outputs_bytes,
                unikv_sparse_decode(plan, pool, &a, NULL, 0, NULL));
    idx[7] = 7;
    a.num_tokens = T + 1;
    EXPECT_FAIL(UNIKV_CAPACITY_EXCEEDED, "num_tokens", outputs, outputs_bytes,
                unikv_sparse_decode(plan, pool, &a, NULL, 0, NULL));
    a.num_tokens = T;
    EXPECT_FAIL(UNIKV_NULL_ARGUMENT, "args", outputs, outputs_bytes,
                unikv_sparse_decode(plan, pool, NULL, NULL, 0, NULL));
    EXPECT_FAIL(UNIKV_NULL_ARGUMENT, "plan", outputs, outputs_bytes,
                unikv_sparse_decode(NULL, pool, &a, NULL, 0, NULL));
    EXPECT_FAIL(UNIKV_NULL_ARGUMENT, "pool", outputs, outputs_bytes,
                unikv_sparse_decode(plan, NULL, &a, NULL, 0, NULL));
    a.struct_size = 0;
    EXPECT_FAIL(UNIKV_BAD_STRUCT_SIZE, "args.struct_size", outputs, outputs_bytes,
                unikv_sparse_decode(plan, pool, &a, NULL, 0, NULL));

    CHECK_OK(unikv_memory_free(ctx, q));
    CHECK_OK(unikv_memory_free(ctx, idx));
    CHECK_OK(unikv_memory_free(ctx, ptr));
    CHECK_OK(unikv_memory_free(ctx, sink));
    CHECK_OK(unikv_memory_free(ctx, outputs));
    unikv_decode_plan_destroy(plan);
    unikv_pool_destroy(pool);
    unikv_context_destroy(ctx);
}

/* The RoPE table from C: row p holds (cos, sin) of p * base^(-2i/64) for the
 * 32 pairs (no YaRN here, so the frequencies are plain powers of the base);
 * a short buffer fails and stays untouched. */
static void test_rope_table(void) {
    enum { ROWS = 5 };
    float table[ROWS * 64 + 1];
    unikv_rope_params params;
    memset(&params, 0, sizeof params);
    params.struct_size = sizeof params;
    params.base = 10000.0;
    table[ROWS * 64] = -7.0f;
    CHECK_OK(unikv_rope_table(&params, ROWS, table, ROWS * 64 + 1));
    CHECK(table[ROWS * 64] == -7.0f);
    for (int p = 0; p < ROWS; ++p) {
        for (int i = 0; i < 32; ++i) {
            const double angle = p * pow(10000.0, -2.0 * i / 64.0);
            CHECK(fabs(table[p * 64 + 2 * i] - cos(angle)) < 1e-6);
            CHECK(fabs(table[p * 64 + 2 * i + 1] - sin(angle)) < 1e-6);
        }
    }
    for (int i = 0; i < ROWS * 64 + 1; ++i) table[i] = -7.0f;
    EXPECT_FAIL(UNIKV_CAPACITY_EXCEEDED, "table_len", table, sizeof table,
                unikv_rope_table(&params, ROWS + 1, table, ROWS * 64 + 1));
    params.base = 0.5;
    EXPECT_FAIL(UNIKV_INVALID_ARGUMENT, "params.base", table, sizeof table,
                unikv_rope_table(&params, ROWS, table, ROWS * 64 + 1));
}

/* ---- inverse RoPE -------------------------------------------------------------- */

/* One bf16 ulp at magnitude |v| (8 significant bits). */
static double bf16_ulp(double v) {
    int e;
    frexp(v, &e);
    return ldexp(1.0, e - 8);
}

/* unikv_inverse_rope from C on a table from unikv_rope_table: the rope dims of
 * every head come back rotated by the conjugate of the token's row (float64
 * reference, 1 bf16 ulp plus the fp32 error near zero), the nope dims are
 * bit-unchanged; bad inputs fail and leave x untouched. */
static void test_inverse_rope(void) {
    enum { NT = 3, NH = 2, MAX_POS = 8 };
    static const int32_t pos_init[NT] = {5, 0, 7};
    const size_t x_bytes = (size_t)NT * NH * D * 2;
    unikv_context *ctx = cpu_context();
    uint16_t *x = alloc(ctx, x_bytes), *before = malloc(x_bytes);
    float *table = alloc(ctx, MAX_POS * 64 * sizeof(float));
    int32_t *pos = alloc(ctx, sizeof pos_init);
    int64_t *pos64 = alloc(ctx, NT * sizeof(int64_t));
    unikv_rope_params rp;
    unikv_inverse_rope_args a;
    size_t i;
    int t, h, k;

    CHECK(before != NULL);
    memset(&rp, 0, sizeof rp);
    rp.struct_size = sizeof rp;
    rp.base = 10000.0;
    CHECK_OK(unikv_rope_table(&rp, MAX_POS, table, MAX_POS * 64));
    for (i = 0; i < (size_t)NT * NH * D; ++i) x[i] = to_bf16(uniform());
    memcpy(before, x, x_bytes);
    memcpy(pos, pos_init, sizeof pos_init);

    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.x = tensor(x, UNIKV_DTYPE_BF16, 3, NT, NH, D);
    a.positions = tensor(pos, UNIKV_DTYPE_I32, 1, NT, 0, 0);
    a.rope_table = tensor(table, UNIKV_DTYPE_F32, 2, MAX_POS, 64, 0);
    a.num_tokens = NT;
    a.num_heads = NH;
    CHECK_OK(unikv_inverse_rope(ctx, &a, NULL));
    for (t = 0; t < NT; ++t) {
        const float *cs = table + pos_init[t] * 64;
        for (h = 0; h < NH; ++h) {
            const size_t row = ((size_t)t * NH + h) * D;
            CHECK(memcmp(x + row, before + row, 448 * 2) == 0);
            for (k = 0; k < 32; ++k) {
                const size_t d = row + 448 + 2 * k;
                const double re = from_bf16(before[d]), im = from_bf16(before[d + 1]);
                const double want_re = re * cs[2 * k] + im * cs[2 * k + 1];
                const double want_im = im * cs[2 * k] - re * cs[2 * k + 1];
                CHECK(fabs(from_bf16(x[d]) - want_re) <= bf16_ulp(want_re) + 1e-6);
                CHECK(fabs(from_bf16(x[d + 1]) - want_im) <= bf16_ulp(want_im) + 1e-6);
            }
        }
    }

    /* Failing calls leave x exactly as it was. */
    a.x.dtype = UNIKV_DTYPE_F32;
    EXPECT_FAIL(UNIKV_BAD_DTYPE, "x", x, x_bytes, unikv_inverse_rope(ctx, &a, NULL));
    a.x = tensor(x, UNIKV_DTYPE_BF16, 3, NT, NH, D / 2);
    EXPECT_FAIL(UNIKV_BAD_SHAPE, "x", x, x_bytes, unikv_inverse_rope(ctx, &a, NULL));
    a.x = tensor(x, UNIKV_DTYPE_BF16, 3, NT, NH, D);
    a.num_heads = NH + 1;
    EXPECT_FAIL(UNIKV_BAD_SHAPE, "x", x, x_bytes, unikv_inverse_rope(ctx, &a, NULL));
    a.num_heads = 0;
    EXPECT_FAIL(UNIKV_INVALID_ARGUMENT, "num_heads", x, x_bytes,
                unikv_inverse_rope(ctx, &a, NULL));
    a.num_heads = NH;
    a.positions.dtype = UNIKV_DTYPE_F32;
    EXPECT_FAIL(UNIKV_BAD_DTYPE, "positions", x, x_bytes, unikv_inverse_rope(ctx, &a, NULL));
    a.positions.dtype = UNIKV_DTYPE_I32;
    a.rope_table = tensor(table, UNIKV_DTYPE_F32, 2, MAX_POS * 2, 32, 0);
    EXPECT_FAIL(UNIKV_BAD_SHAPE, "rope_table", x, x_bytes, unikv_inverse_rope(ctx, &a, NULL));
    a.rope_table = tensor(table, UNIKV_DTYPE_F32, 2, MAX_POS, 64, 0);
    pos[2] = MAX_POS; /* one past the table */
    EXPECT_FAIL(UNIKV_OUT_OF_RANGE, "positions", x, x_bytes, unikv_inverse_rope(ctx, &a, NULL));
    pos[2] = -1;
    EXPECT_FAIL(UNIKV_OUT_OF_RANGE, "positions", x, x_bytes, unikv_inverse_rope(ctx, &a, NULL));
    pos[2] = pos_init[2];
    /* int64 positions: one past 2^32 must not wrap to a valid row. */
    for (t = 0; t < NT; ++t) pos64[t] = pos_init[t];
    pos64[1] = ((int64_t)1 << 32) + 1;
    a.positions = tensor(pos64, UNIKV_DTYPE_I64, 1, NT, 0, 0);
    EXPECT_FAIL(UNIKV_OUT_OF_RANGE, "positions", x, x_bytes, unikv_inverse_rope(ctx, &a, NULL));
    EXPECT_FAIL(UNIKV_NULL_ARGUMENT, "args", x, x_bytes, unikv_inverse_rope(ctx, NULL, NULL));
    EXPECT_FAIL(UNIKV_NULL_ARGUMENT, "ctx", x, x_bytes, unikv_inverse_rope(NULL, &a, NULL));
    a.struct_size = 0;
    EXPECT_FAIL(UNIKV_BAD_STRUCT_SIZE, "args.struct_size", x, x_bytes,
                unikv_inverse_rope(ctx, &a, NULL));

    free(before);
    CHECK_OK(unikv_memory_free(ctx, x));
    CHECK_OK(unikv_memory_free(ctx, table));
    CHECK_OK(unikv_memory_free(ctx, pos));
    CHECK_OK(unikv_memory_free(ctx, pos64));
    unikv_context_destroy(ctx);
}

/* The FlashMLA cache store from C: a row of ones in the nope dims (scale
 * 1/448 rounds up to 2^-8, byte 119, codes of 256 = 0x78) and a RoPE ramp at
 * location 3 of two pages of 2 tokens (page 1, slot 1); then bad inputs fail
 * with their status and leave the cache as it was. */
static void test_store_flashmla(void) {
    enum { P = 2, PAGES = 2, BPP = 1728 };
    unikv_context *ctx = cpu_context();
    unsigned char *cache = alloc(ctx, PAGES * BPP);
    uint16_t *kv = alloc(ctx, 2 * D * sizeof(uint16_t));
    int64_t *loc = alloc(ctx, 2 * sizeof(int64_t));
    unikv_store_flashmla_args a;
    int d;
    for (d = 0; d < D; ++d) kv[d] = d < 448 ? to_bf16(1.0f) : to_bf16((float)(d - 448) / 64.0f);
    for (d = 0; d < D; ++d) kv[D + d] = to_bf16(uniform());
    loc[0] = 3;
    loc[1] = -1;
    memset(cache, 0xA5, PAGES * BPP);
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.cache = tensor(cache, UNIKV_DTYPE_U8, 2, PAGES, BPP, 0);
    a.kv = tensor(kv, UNIKV_DTYPE_BF16, 2, 2, D, 0);
    a.loc = tensor(loc, UNIKV_DTYPE_I64, 1, 2, 0, 0);
    a.page_size = P;
    a.cache_dtype = UNIKV_DTYPE_FP8_E4M3FN;
    a.num_tokens = 2;
    CHECK_OK(unikv_store_flashmla(ctx, &a, NULL));
    for (d = 0; d < 448; ++d) CHECK(cache[BPP + 576 + d] == 0x78);
    CHECK(memcmp(cache + BPP + 576 + 448, kv + 448, 128) == 0);
    for (d = 0; d < 7; ++d) CHECK(cache[BPP + 576 * P + 8 + d] == 119);
    CHECK(cache[BPP + 576 * P + 8 + 7] == 0xA5); /* the scale slot's padding byte */
    CHECK(cache[0] == 0xA5 && cache[BPP - 1] == 0xA5);

    a.page_size = 3;
    EXPECT_FAIL(UNIKV_INVALID_ARGUMENT, "page_size", cache, PAGES * BPP,
                unikv_store_flashmla(ctx, &a, NULL));
    a.page_size = P;
    a.cache_dtype = UNIKV_DTYPE_BF16;
    EXPECT_FAIL(UNIKV_BAD_DTYPE, "cache_dtype", cache, PAGES * BPP,
                unikv_store_flashmla(ctx, &a, NULL));
    a.cache_dtype = 99;
    EXPECT_FAIL(UNIKV_BAD_ENUM, "cache_dtype", cache, PAGES * BPP,
                unikv_store_flashmla(ctx, &a, NULL));
    a.cache_dtype = UNIKV_DTYPE_FP8_E4M3FNUZ;
    a.cache.strides[0] = BPP + 16;
    a.cache.shape[0] = 1;
    EXPECT_FAIL(UNIKV_BAD_STRIDE, "cache", cache, PAGES * BPP,
                unikv_store_flashmla(ctx, &a, NULL));
    a.cache = tensor(cache, UNIKV_DTYPE_U8, 2, PAGES, BPP, 0);
    /* Token 0 is valid, token 1 lies past the 4 slots: nothing is written. */
    loc[1] = P * PAGES;
    EXPECT_FAIL(UNIKV_OUT_OF_RANGE, "loc", cache, PAGES * BPP,
                unikv_store_flashmla(ctx, &a, NULL));
    CHECK_OK(unikv_memory_free(ctx, loc));
    CHECK_OK(unikv_memory_free(ctx, kv));
    CHECK_OK(unikv_memory_free(ctx, cache));
    unikv_context_destroy(ctx);
}

/* unikv_prepare_qkv from C: a valid call (the nope dims of Q and KV against a
 * double reference, the pool rows equal to kv_out), then bad input that must
 * leave q_out, kv_out and the pool untouched. */
static void test_prepare_qkv(void) {
    enum { PT = 2, PH = 2, MAX_POS = 16 };
    static const uint32_t ratio = 0;
    static const int64_t positions[PT] = {3, 12};
    static const int32_t pool_rows[PT] = {8 + 3, 8 + 4}; /* slot 1 of an 8-row ring */
    unikv_context *ctx = cpu_context();
    unikv_pool_params pp = {.struct_size = sizeof pp, .compress_ratios = &ratio, .num_layers = 1,
                            .max_requests = 1, .window = 8, .kv_dtype = UNIKV_DTYPE_BF16};
    unikv_rope_params rp;
    unikv_pool_layer_info li = {.struct_size = sizeof li};
    unikv_pool *pool = NULL;
    /* q_out [PT, PH, D] then kv_out [PT, D] in one buffer: one snapshot covers both. */
    const size_t q_bytes = (size_t)PT * PH * D * 2, outputs_bytes = q_bytes + (size_t)PT * D * 2;
    uint16_t *q, *kv, *w, *q_out, *kv_out;
    unsigned char *outputs, *pool_before;
    float *table;
    int64_t *pos;
    int32_t *rows;
    unikv_prepare_qkv_args a;
    size_t i;
    int t, h, d;

    CHECK_OK(unikv_pool_create(ctx, &pp, &pool));
    CHECK_OK(unikv_pool_get_layer(pool, 0, &li));
    q = alloc(ctx, q_bytes);
    kv = alloc(ctx, (size_t)PT * D * 2);
    w = alloc(ctx, D * 2);
    table = alloc(ctx, MAX_POS * 64 * sizeof(float));
    pos = alloc(ctx, sizeof positions);
    rows = alloc(ctx, sizeof pool_rows);
    outputs = alloc(ctx, outputs_bytes);
    q_out = (uint16_t *)outputs;
    kv_out = (uint16_t *)(outputs + q_bytes);
    for (i = 0; i < (size_t)PT * PH * D; ++i) q[i] = to_bf16(uniform());
    for (i = 0; i < (size_t)PT * D; ++i) kv[i] = to_bf16(uniform());
    for (i = 0; i < D; ++i) w[i] = to_bf16(1.0f + 0.5f * uniform());
    memset(&rp, 0, sizeof rp);
    rp.struct_size = sizeof rp;
    rp.base = 10000.0;
    CHECK_OK(unikv_rope_table(&rp, MAX_POS, table, MAX_POS * 64));
    memcpy(pos, positions, sizeof positions);
    memcpy(rows, pool_rows, sizeof pool_rows);

    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q_in = tensor(q, UNIKV_DTYPE_BF16, 3, PT, PH, D);
    a.q_out = tensor(q_out, UNIKV_DTYPE_BF16, 3, PT, PH, D);
    a.kv_in = tensor(kv, UNIKV_DTYPE_BF16, 2, PT, D, 0);
    a.kv_weight = tensor(w, UNIKV_DTYPE_BF16, 1, D, 0, 0);
    a.kv_out = tensor(kv_out, UNIKV_DTYPE_BF16, 2, PT, D, 0);
    a.rope_table = tensor(table, UNIKV_DTYPE_F32, 2, MAX_POS, 64, 0);
    a.positions = tensor(pos, UNIKV_DTYPE_I64, 1, PT, 0, 0);
    a.rows = tensor(rows, UNIKV_DTYPE_I32, 1, PT, 0, 0);
    a.num_tokens = PT;
    a.num_heads = PH;
    a.q_eps = 1e-6f;
    a.kv_eps = 1e-6f;

    memset(outputs, 0xA5, outputs_bytes);
    CHECK_OK(unikv_prepare_qkv(pool, &a, NULL));
    /* RMSNorm of each row; the nope dims are one bf16 rounding (2^-8 relative) away. */
    for (t = 0; t < PT; ++t) {
        for (h = 0; h <= PH; ++h) { /* h == PH: the KV row */
            const uint16_t *x = h < PH ? q + ((size_t)t * PH + h) * D : kv + (size_t)t * D;
            const uint16_t *got = h < PH ? q_out + ((size_t)t * PH + h) * D : kv_out + (size_t)t * D;
            double sum = 0, f;
            for (d = 0; d < D; ++d) sum += from_bf16(x[d]) * from_bf16(x[d]);
            f = 1.0 / sqrt(sum / D + 1e-6);
            for (d = 0; d < 448; ++d) {
                const double want = from_bf16(x[d]) * f * (h < PH ? 1.0 : from_bf16(w[d]));
                CHECK(fabs(from_bf16(got[d]) - want) <= fabs(want) / 128);
            }
        }
        CHECK(memcmp((uint16_t *)li.data + (size_t)pool_rows[t] * D, kv_out + (size_t)t * D,
                     ROW_BYTES) == 0);
    }

    pool_before = snapshot(li.data, li.bytes);
    memset(outputs, 0xA5, outputs_bytes);
    a.positions.dtype = UNIKV_DTYPE_F32;
    EXPECT_FAIL(UNIKV_BAD_DTYPE, "positions", outputs, outputs_bytes,
                unikv_prepare_qkv(pool, &a, NULL));
    a.positions.dtype = UNIKV_DTYPE_I64;
    pos[1] = MAX_POS; /* one past the table */
    EXPECT_FAIL(UNIKV_OUT_OF_RANGE, "positions", outputs, outputs_bytes,
                unikv_prepare_qkv(pool, &a, NULL));
    pos[1] = positions[1];
    rows[1] = (int32_t)li.rows; /* one past the layer */
    EXPECT_FAIL(UNIKV_OUT_OF_RANGE, "rows", outputs, outputs_bytes,
                unikv_prepare_qkv(pool, &a, NULL));
    rows[1] = pool_rows[0]; /* two tokens on one row */
    EXPECT_FAIL(UNIKV_INVALID_ARGUMENT, "rows", outputs, outputs_bytes,
                unikv_prepare_qkv(pool, &a, NULL));
    rows[1] = pool_rows[1];
    a.kv_weight.data = NULL;
    EXPECT_FAIL(UNIKV_NULL_ARGUMENT, "kv_weight", outputs, outputs_bytes,
                unikv_prepare_qkv(pool, &a, NULL));
    a.kv_weight.data = w;
    a.q_out = tensor(q_out, UNIKV_DTYPE_BF16, 3, PT, PH + 1, D);
    EXPECT_FAIL(UNIKV_BAD_SHAPE, "q_out", outputs, outputs_bytes,
                unikv_prepare_qkv(pool, &a, NULL));
    a.q_out = tensor(q_out, UNIKV_DTYPE_BF16, 3, PT, PH, D);
    a.num_heads = 0;
    EXPECT_FAIL(UNIKV_INVALID_ARGUMENT, "num_heads", outputs, outputs_bytes,
                unikv_prepare_qkv(pool, &a, NULL));
    a.num_heads = PH;
    EXPECT_FAIL(UNIKV_NULL_ARGUMENT, "args", outputs, outputs_bytes,
                unikv_prepare_qkv(pool, NULL, NULL));
    EXPECT_FAIL(UNIKV_NULL_ARGUMENT, "pool", outputs, outputs_bytes,
                unikv_prepare_qkv(NULL, &a, NULL));
    a.struct_size = 0;
    EXPECT_FAIL(UNIKV_BAD_STRUCT_SIZE, "args.struct_size", outputs, outputs_bytes,
                unikv_prepare_qkv(pool, &a, NULL));
    CHECK(memcmp(li.data, pool_before, li.bytes) == 0);
    free(pool_before);

    CHECK_OK(unikv_memory_free(ctx, q));
    CHECK_OK(unikv_memory_free(ctx, kv));
    CHECK_OK(unikv_memory_free(ctx, w));
    CHECK_OK(unikv_memory_free(ctx, table));
    CHECK_OK(unikv_memory_free(ctx, pos));
    CHECK_OK(unikv_memory_free(ctx, rows));
    CHECK_OK(unikv_memory_free(ctx, outputs));
    unikv_pool_destroy(pool);
    unikv_context_destroy(ctx);
}

/* ---- hash_topk -------------------------------------------------------------------- */

/* unikv_hash_topk from C: 3 rows of which 2 are real, K = 2 table experts of
 * E = 4 plus one shared slot; weights against a float64 reference (1e-6
 * relative), the padded row (-1, 0); bad inputs fail and leave the outputs as
 * they were. */
static void test_hash_topk(void) {
    enum { N = 3, E = 4, K = 2, S = 1, VOCAB = 5 };
    static const int32_t table_init[VOCAB * K] = {0, 1, 3, 2, 1, 1, 2, 0, 3, 3};
    static const int64_t ids_init[N] = {4, 1, 0};
    unikv_context *ctx = cpu_context();
    float *logits = alloc(ctx, N * E * sizeof(float));
    int32_t *table = alloc(ctx, sizeof table_init);
    int64_t *ids = alloc(ctx, sizeof ids_init);
    float *weights = alloc(ctx, N * (K + S) * sizeof(float));
    int32_t *topk = alloc(ctx, N * (K + S) * sizeof(int32_t));
    unikv_hash_topk_args a;
    int n, j;

    for (n = 0; n < N * E; ++n) logits[n] = uniform() * 8.0f;
    memcpy(table, table_init, sizeof table_init);
    memcpy(ids, ids_init, sizeof ids_init);
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.router_logits = tensor(logits, UNIKV_DTYPE_F32, 2, N, E, 0);
    a.input_ids = tensor(ids, UNIKV_DTYPE_I64, 1, N, 0, 0);
    a.tid2eid = tensor(table, UNIKV_DTYPE_I32, 2, VOCAB, K, 0);
    a.topk_weights = tensor(weights, UNIKV_DTYPE_F32, 2, N, K + S, 0);
    a.topk_ids = tensor(topk, UNIKV_DTYPE_I32, 2, N, K + S, 0);
    a.num_real_tokens_host = 2;
    a.num_tokens = N;
    a.num_shared = S;
    a.routed_scaling_factor = 1.5f;
    CHECK_OK(unikv_hash_topk(ctx, &a, NULL));
    for (n = 0; n < 2; ++n) {
        const int32_t *e = table_init + ids_init[n] * K;
        double w[K], sum = 0.0;
        for (j = 0; j < K; ++j) {
            const double x = logits[n * E + e[j]];
            w[j] = sqrt(log1p(exp(x)));
            sum += w[j];
        }
        for (j = 0; j < K; ++j) {
            CHECK(topk[n * (K + S) + j] == e[j]);
            CHECK(fabs(weights[n * (K + S) + j] - w[j] / sum) <= 1e-6 * (w[j] / sum));
        }
        CHECK(topk[n * (K + S) + K] == E);
        CHECK(fabs(weights[n * (K + S) + K] - 1.0 / 1.5) <= 1e-6);
    }
    for (j = 0; j < K + S; ++j) CHECK(topk[2 * (K + S) + j] == -1 && weights[2 * (K + S) + j] == 0.0f);

    /* Failing calls leave the weights exactly as they were. */
    a.num_shared = 31;
    EXPECT_FAIL(UNIKV_INVALID_ARGUMENT, "num_shared", weights, N * (K + S) * sizeof(float),
                unikv_hash_topk(ctx, &a, NULL));
    a.num_shared = S;
    ids[1] = VOCAB;
    EXPECT_FAIL(UNIKV_OUT_OF_RANGE, "input_ids[1]", weights, N * (K + S) * sizeof(float),
                unikv_hash_topk(ctx, &a, NULL));
    ids[1] = ids_init[1];
    a.topk_ids.dtype = UNIKV_DTYPE_I64;
    EXPECT_FAIL(UNIKV_BAD_DTYPE, "topk_ids", weights, N * (K + S) * sizeof(float),
                unikv_hash_topk(ctx, &a, NULL));

    CHECK_OK(unikv_memory_free(ctx, logits));
    CHECK_OK(unikv_memory_free(ctx, table));
    CHECK_OK(unikv_memory_free(ctx, ids));
    CHECK_OK(unikv_memory_free(ctx, weights));
    CHECK_OK(unikv_memory_free(ctx, topk));
    unikv_context_destroy(ctx);
}

/* ---- lightning indexer ------------------------------------------------------------ */

/* The value of an e4m3fn code (finite codes only). */
static double e4m3fn_value(unsigned char c) {
    const int e = (c >> 3) & 15, m = c & 7;
    const double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
    return (c & 0x80) ? -v : v;
}

/* unikv_indexer_prepare_q from C: 2 tokens x 2 heads against a float64
 * reference (RoPE of dims 64..127, the Hadamard transform as the explicit
 * +-1 matrix, scale max(amax, 1e-4) / 448): every code within half an FP8
 * step (plus 1e-5 of the max for the op's fp32 transform) and the folded
 * weights within 1e-5; then unikv_indexer_topk_from_logits on hand-made
 * scores with a tie at the threshold, and a bad topk that writes nothing. */
static void test_indexer(void) {
    enum { T = 2, H = 2, DI = 128, MAX_POS = 8, KEYS = 16, TOPK = 4, W = 5 };
    static const int32_t pos_init[T] = {39, 12}; /* 10 and 3 visible keys */
    static const float logits_init[T][KEYS] = {
        {0.5f, 2.0f, -1.0f, 2.0f, 7.0f, 0.25f, 2.0f, -3.0f, 2.0f, 0.0f},
        {1.0f, -1.0f, 3.0f},
    };
    static const int32_t want_table[T][W] = {
        {3 * 64 + 1, 3 * 64 + 3, 3 * 64 + 4, 3 * 64 + 6, -1}, /* 7, then 3 of the four 2.0s: lowest keys */
        {3 * 64 + 0, 3 * 64 + 1, 3 * 64 + 2, -1, -1},         /* 3 keys: all */
    };
    unikv_context *ctx = cpu_context();
    uint16_t *q = alloc(ctx, T * H * DI * 2), *w = alloc(ctx, T * H * 2);
    float *table = alloc(ctx, MAX_POS * 64 * sizeof(float)), *w_out = alloc(ctx, T * H * sizeof(float));
    float *logits = alloc(ctx, T * KEYS * sizeof(float));
    unsigned char *codes = alloc(ctx, T * H * DI);
    int32_t *pos = alloc(ctx, sizeof pos_init), *batch = alloc(ctx, T * sizeof(int32_t));
    int32_t *page_table = alloc(ctx, sizeof(int32_t)), *out = alloc(ctx, T * W * sizeof(int32_t));
    unikv_rope_params rp;
    unikv_indexer_prepare_q_args a;
    unikv_indexer_topk_args k;
    int t, h, i, j;

    memset(&rp, 0, sizeof rp);
    rp.struct_size = sizeof rp;
    rp.base = 10000.0;
    CHECK_OK(unikv_rope_table(&rp, MAX_POS, table, MAX_POS * 64));
    for (i = 0; i < T * H * DI; ++i) q[i] = to_bf16(uniform() * 4.0f);
    for (i = 0; i < T * H; ++i) w[i] = to_bf16(uniform());
    memcpy(pos, pos_init, sizeof pos_init);
    for (t = 0; t < T; ++t) pos[t] %= MAX_POS; /* the queries' own positions: table rows */
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = tensor(q, UNIKV_DTYPE_BF16, 3, T, H, DI);
    a.weights = tensor(w, UNIKV_DTYPE_BF16, 2, T, H, 0);
    a.rope_table = tensor(table, UNIKV_DTYPE_F32, 2, MAX_POS, 64, 0);
    a.positions = tensor(pos, UNIKV_DTYPE_I32, 1, T, 0, 0);
    a.q_fp8 = tensor(codes, UNIKV_DTYPE_U8, 3, T, H, DI);
    a.weights_out = tensor(w_out, UNIKV_DTYPE_F32, 2, T, H, 0);
    a.q_dtype = UNIKV_DTYPE_FP8_E4M3FN;
    a.num_tokens = T;
    a.num_heads = H;
    a.weight_scale = 0.0625f;
    CHECK_OK(unikv_indexer_prepare_q(ctx, &a, NULL));
    for (t = 0; t < T; ++t) {
        const float *cs = table + pos[t] * 64;
        for (h = 0; h < H; ++h) {
            double x[DI], y[DI], amax = 0.0, scale;
            for (i = 0; i < DI; ++i) x[i] = from_bf16(q[(t * H + h) * DI + i]);
            for (i = 0; i < 32; ++i) {
                const double re = x[64 + 2 * i], im = x[65 + 2 * i];
                x[64 + 2 * i] = re * cs[2 * i] - im * cs[2 * i + 1];
                x[65 + 2 * i] = re * cs[2 * i + 1] + im * cs[2 * i];
            }
            for (i = 0; i < DI; ++i) {
                y[i] = 0.0;
                for (j = 0; j < DI; ++j) {
                    int bits = i & j, parity = 0;
                    while (bits) parity ^= bits & 1, bits >>= 1;
                    y[i] += parity ? -x[j] : x[j];
                }
                y[i] /= sqrt((double)DI);
                if (fabs(y[i]) > amax) amax = fabs(y[i]);
            }
            scale = (amax > 1e-4 ? amax : 1e-4) / 448.0;
            for (i = 0; i < DI; ++i) {
                const double v = y[i] / scale, half_step = fabs(v) / 16.0 > ldexp(1.0, -10) ? fabs(v) / 16.0 : ldexp(1.0, -10);
                CHECK(fabs(e4m3fn_value(codes[(t * H + h) * DI + i]) - v) <= half_step + 1e-5 * 448.0);
            }
            {
                const double want = from_bf16(w[t * H + h]) * 0.0625 * scale;
                CHECK(fabs(w_out[t * H + h] - want) <= 1e-5 * fabs(want) + 1e-30);
            }
        }
    }

    /* The selection from given scores. */
    memcpy(pos, pos_init, sizeof pos_init);
    for (t = 0; t < T; ++t) {
        batch[t] = 0;
        for (i = 0; i < KEYS; ++i) logits[t * KEYS + i] = logits_init[t][i];
    }
    page_table[0] = 3;
    memset(&k, 0, sizeof k);
    k.struct_size = sizeof k;
    k.page_table = tensor(page_table, UNIKV_DTYPE_I32, 2, 1, 1, 0);
    k.batch_id = tensor(batch, UNIKV_DTYPE_I32, 1, T, 0, 0);
    k.positions = tensor(pos, UNIKV_DTYPE_I32, 1, T, 0, 0);
    k.logits = tensor(logits, UNIKV_DTYPE_F32, 2, T, KEYS, 0);
    k.topk_indices = tensor(out, UNIKV_DTYPE_I32, 2, T, W, 0);
    k.num_tokens = T;
    k.topk = TOPK;
    CHECK_OK(unikv_indexer_topk_from_logits(ctx, &k, NULL));
    CHECK(memcmp(out, want_table, sizeof want_table) == 0);
    k.topk = 0;
    EXPECT_FAIL(UNIKV_INVALID_ARGUMENT, "topk", out, sizeof want_table,
                unikv_indexer_topk_from_logits(ctx, &k, NULL));

    CHECK_OK(unikv_memory_free(ctx, q));
    CHECK_OK(unikv_memory_free(ctx, w));
    CHECK_OK(unikv_memory_free(ctx, table));
    CHECK_OK(unikv_memory_free(ctx, w_out));
    CHECK_OK(unikv_memory_free(ctx, logits));
    CHECK_OK(unikv_memory_free(ctx, codes));
    CHECK_OK(unikv_memory_free(ctx, pos));
    CHECK_OK(unikv_memory_free(ctx, batch));
    CHECK_OK(unikv_memory_free(ctx, page_table));
    CHECK_OK(unikv_memory_free(ctx, out));
    unikv_context_destroy(ctx);
}

int main(void) {
    /* Before any failure the thread's message is empty. */
    CHECK(strcmp(unikv_last_error_message(), "") == 0);
    rng_state = (uint64_t)time(NULL) | 1;
    printf("test_api: seed %llu\n", (unsigned long long)rng_state);
    fflush(stdout); /* before any failure report on stderr */

    test_status_strings();
    test_context();
    test_destroy_null();
    test_memory();
    test_pools();
    test_pool_bad_params();
    test_fp8_pools();
    test_slots();
    test_plans();
    test_decode();
    test_rope_table();
    test_inverse_rope();
    test_store_flashmla();
    test_prepare_qkv();
    test_hash_topk();
    test_indexer();
    printf("test_api: all checks passed\n");
    return 0;
}
