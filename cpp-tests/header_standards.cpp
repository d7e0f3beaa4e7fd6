// header_standards.c as C++ (C++11 to C++2b, -Wall -Wextra -pedantic
// -Werror): compiled, not run. (void) must silence UNIKV_NODISCARD here too.
#include <unikv.h>

namespace {
const uint32_t all_statuses[] = UNIKV_STATUS_ALL;
const unikv_status ok = UNIKV_OK;
const unikv_dtype dtype = UNIKV_DTYPE_BF16;
}  // namespace

void unikv_header_standards_cpp();
void unikv_header_standards_cpp() {
    unikv_context *ctx = nullptr;
    unikv_pool *pool = nullptr;
    uint32_t slot = 0;
    (void)all_statuses;
    (void)ok;
    (void)dtype;
    (void)unikv_context_create(nullptr, &ctx);
    (void)unikv_pool_acquire_slot(pool, &slot);
    (void)unikv_pool_release_slot(pool, slot);
    (void)unikv_stream_synchronize(ctx, nullptr);
    unikv_pool_destroy(pool);
    unikv_context_destroy(ctx);
}
