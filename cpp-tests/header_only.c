/* The header compiles on its own as C11 (-pedantic -Werror), the public
 * structs have the x86_64 LP64 layout the ABI promises, and the version macros
 * agree with each other and with the library. header_only.cpp is the C++17
 * twin; keep the two in step. Includes nothing but the header and the pinned
 * layout (abi_layout.h) on purpose. */
#include <unikv.h>

#include "abi_layout.h"


_Static_assert(UNIKV_VERSION == UNIKV_VERSION_MAJOR * 1000000 + UNIKV_VERSION_MINOR * 1000 +
                                    UNIKV_VERSION_PATCH,
               "UNIKV_VERSION packs major, minor and patch");

static int same_string(const char *a, const char *b) {
    while (*a != '\0' && *a == *b) {
        ++a;
        ++b;
    }
    return *a == *b;
}

/* "MAJOR.MINOR.PATCH" packed like UNIKV_VERSION, or 0 when malformed. */
static unsigned long packed_version(const char *s) {
    unsigned long parts[3] = {0, 0, 0};
    int i;
    for (i = 0; i < 3; ++i) {
        if (*s < '0' || *s > '9') return 0;
        while (*s >= '0' && *s <= '9') parts[i] = parts[i] * 10 + (unsigned long)(*s++ - '0');
        if (*s != (i < 2 ? '.' : '\0')) return 0;
        ++s;
    }
    return parts[0] * 1000000 + parts[1] * 1000 + parts[2];
}

/* Exit code: 0 = pass, otherwise the number of the failed check. */
int main(void) {
    if (unikv_version() != UNIKV_VERSION) return 1;
    if (!same_string(unikv_version_string(), UNIKV_VERSION_STRING)) return 2;
    if (packed_version(UNIKV_VERSION_STRING) != UNIKV_VERSION) return 3;
    return 0;
}
