/* Built with nothing but `pkg-config --cflags --libs unikv`: the header and
 * the library are found, the versions agree, and a CPU context works. */
#include <stdio.h>

#include <unikv.h>

int main(void) {
    if (unikv_version() != UNIKV_VERSION) {
        fprintf(stderr, "library %u, header %u\n", (unsigned)unikv_version(), (unsigned)UNIKV_VERSION);
        return 1;
    }
    unikv_context_options options = {0};
    options.struct_size = sizeof options;
    options.backend = UNIKV_BACKEND_CPU;
    unikv_context *ctx = NULL;
    unikv_status status = unikv_context_create(&options, &ctx);
    if (status != UNIKV_OK) {
        fprintf(stderr, "unikv_context_create: %s: %s\n", unikv_status_string(status),
                unikv_last_error_message());
        return 1;
    }
    unikv_context_destroy(ctx);
    printf("unikv %s through pkg-config\n", unikv_version_string());
    return 0;
}
