// Creates a context on the best available backend, reports it, and exits.
#include <cstdio>

#include <unikv.h>

int main() {
    unikv_context_options options{};
    options.struct_size = sizeof options;
    options.backend = UNIKV_BACKEND_AUTO;
    unikv_context *ctx = nullptr;
    unikv_status status = unikv_context_create(&options, &ctx);
    if (status != UNIKV_OK) {
        std::fprintf(stderr, "unikv_context_create: %s: %s\n", unikv_status_string(status),
                     unikv_last_error_message());
        return 1;
    }
    unikv_context_info info{};
    info.struct_size = sizeof info;
    status = unikv_context_get_info(ctx, &info);
    unikv_context_destroy(ctx);
    if (status != UNIKV_OK) {
        std::fprintf(stderr, "unikv_context_get_info: %s\n", unikv_status_string(status));
        return 1;
    }
    static const char *const backends[] = {"auto", "cpu", "cuda", "rocm"};
    std::printf("unikv %s (header %s), backend %s\n", unikv_version_string(),
                UNIKV_VERSION_STRING, info.backend < 4 ? backends[info.backend] : "unknown");
    return 0;
}
