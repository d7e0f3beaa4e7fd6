/* The C tests' assertion macros (test_api.c, test_queries.c): a failed check
 * prints the condition, its place and the library's last error, and exits. */
#ifndef UNIKV_CPP_TESTS_CHECK_H
#define UNIKV_CPP_TESTS_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include <unikv.h>

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: CHECK(%s) failed (last error: \"%s\")\n", __FILE__, \
                    __LINE__, #cond, unikv_last_error_message());                     \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

#define CHECK_OK(call) CHECK((call) == UNIKV_OK)

#endif
