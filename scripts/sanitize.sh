#!/usr/bin/env bash
# The test suites under sanitizers (issue 21), on the CPU backend:
#   1. every Rust test under AddressSanitizer + LeakSanitizer;
#   2. the C/C++ suite (ctest) built with -fsanitize=address,undefined against
#      the staged library (LeakSanitizer sees the library's allocations too);
#   3. the concurrency tests under ThreadSanitizer: the Rust slot-allocator
#      test, and cpp-tests/test_concurrency.cpp linked to a libunikv built
#      with -Zsanitizer=thread.
# Rust sanitizers are unstable flags; RUSTC_BOOTSTRAP=1 enables them on the
# stable toolchain (std itself stays uninstrumented: no build-std offline).
# Usage: scripts/sanitize.sh [asan|cpp|tsan]... (default: all three)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"
"$ROOT/scripts/ensure-tools.sh"

HOST=$(rustc -vV | sed -n 's/^host: //p')
export RUSTC_BOOTSTRAP=1
# A sanitized build shares nothing with the normal one.
export CARGO_INCREMENTAL=0

rust_asan() {
    echo "== sanitize: Rust tests under AddressSanitizer + LeakSanitizer"
    # --target keeps the flags off build scripts and proc macros. The
    # memory-limit test re-runs itself under `ulimit -v`, which ASan's shadow
    # mapping cannot live with; the plain suite runs it.
    RUSTFLAGS="-Zsanitizer=address -Cunsafe-allow-abi-mismatch=sanitizer" \
        ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" \
        cargo test --features test-hooks --target "$HOST" --target-dir "$BUILD/asan" --tests -- \
        --skip huge_pools_fail_cleanly_under_a_memory_limit
}

cpp_asan() {
    echo "== sanitize: C/C++ tests under AddressSanitizer + UBSan + LeakSanitizer"
    build_and_stage
    local flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
    cmake_configure "$ROOT/cpp-tests" "$BUILD/cpp-tests-asan" -DCMAKE_PREFIX_PATH="$STAGE" \
        -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
        -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
    cmake_build "$BUILD/cpp-tests-asan"
    # The consumer test configures a project of its own, with its own flags.
    ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" \
        ctest --test-dir "$BUILD/cpp-tests-asan" --output-on-failure -E '^consumer$'
}

tsan() {
    echo "== sanitize: concurrency tests under ThreadSanitizer"
    local dir="$BUILD/tsan"
    RUSTFLAGS="-Zsanitizer=thread -Cunsafe-allow-abi-mismatch=sanitizer" TSAN_OPTIONS="halt_on_error=1 suppressions=$ROOT/scripts/tsan.supp" \
        cargo test --features test-hooks --target "$HOST" --target-dir "$dir" \
        --test pool -- slot_allocator_is_thread_safe
    # libunikv instrumented; the test program brings the TSan runtime. GCC
    # instruments the C++ side, but its libtsan lacks entry points the Rust
    # side calls (__tsan_memcpy), so the program links Rust's own runtime.
    RUSTFLAGS="-Zsanitizer=thread -Cunsafe-allow-abi-mismatch=sanitizer" \
        cargo rustc --release --lib --crate-type cdylib --target "$HOST" --target-dir "$dir"
    local lib="$dir/$HOST/release"
    # The program looks for the SONAME (build.rs), which cargo's folder lacks.
    local soname
    soname=$(readelf -d "$lib/libunikv.so" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
    ln -sf libunikv.so "$lib/$soname"
    local runtime
    runtime="$(rustc --print sysroot)/lib/rustlib/$HOST/lib/librustc-stable_rt.tsan.a"
    g++ -std=c++17 -O1 -g -fsanitize=thread -Wall -Wextra -Werror -I"$ROOT/include" \
        -c "$ROOT/cpp-tests/test_concurrency.cpp" -o "$dir/test_concurrency.o"
    g++ "$dir/test_concurrency.o" -o "$dir/test_concurrency" \
        -Wl,--whole-archive "$runtime" -Wl,--no-whole-archive \
        -L"$lib" -lunikv -Wl,-rpath,"$lib" -lpthread -ldl -lm -lrt
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$ROOT/scripts/tsan.supp" "$dir/test_concurrency"
}

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(asan cpp tsan)
for step in "${steps[@]}"; do
    case $step in
    asan) rust_asan ;;
    cpp) cpp_asan ;;
    tsan) tsan ;;
    *)
        echo "sanitize.sh: unknown step $step (asan, cpp, tsan)" >&2
        exit 2
        ;;
    esac
done
echo "sanitize: ${steps[*]} clean"
