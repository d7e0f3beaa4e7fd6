/* Compiled, not run: the header on its own under every C standard it
 * supports (C99, C11, C17, C2x), with -Wall -Wextra -pedantic -Wc++-compat
 * -Werror (cpp-tests/CMakeLists.txt). Also the contract of UNIKV_NODISCARD:
 * a status deliberately dropped with a (void) cast compiles cleanly under
 * -Werror, whatever the compiler and standard. Uses no C11 feature itself. */
#include <unikv.h>

static const uint32_t all_statuses[] = UNIKV_STATUS_ALL;

/* Every enum value is an integer constant of its uint32_t typedef. */
static const unikv_status ok = UNIKV_OK;
static const unikv_dtype dtype = UNIKV_DTYPE_BF16;
static const unikv_backend backend = UNIKV_BACKEND_CPU;
static const unikv_copy_kind copy_kind = UNIKV_COPY_HOST_TO_DEVICE;

/* Not called: only its compilation matters. */
void unikv_header_standards_c(void);
void unikv_header_standards_c(void) {
    unikv_context *ctx = NULL;
    unikv_pool *pool = NULL;
    uint32_t slot = 0;
    size_t bytes = 0;
    (void)all_statuses;
    (void)ok;
    (void)dtype;
    (void)backend;
    (void)copy_kind;
    (void)unikv_context_create(NULL, &ctx);
    (void)unikv_pool_acquire_slot(pool, &slot);
    (void)unikv_pool_release_slot(pool, slot);
    (void)unikv_memory_free(ctx, NULL);
    (void)unikv_decode_plan_workspace_size(NULL, &bytes);
    (void)unikv_stream_synchronize(ctx, NULL);
    unikv_pool_destroy(pool);
    unikv_context_destroy(ctx);
}
