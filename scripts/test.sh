#!/usr/bin/env bash
# Runs every test, from any directory: rustfmt, clippy and the Rust tests, then
# the Python package's tests and the C/C++ suite (ctest) against the library
# installed into build/stage. Prints one line per phase with the elapsed
# seconds (4 to 7 minutes in all on a 2-core machine from a fresh clone;
# compiling the Rust tests dominates).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

start=$SECONDS
# phase NAME COMMAND...: runs COMMAND after a progress line, then reports its time.
phase() {
    local name=$1 t0=$SECONDS
    shift
    echo "test.sh: [$((SECONDS - start))s] $name ..." >&2
    "$@"
    echo "test.sh: [$((SECONDS - start))s] $name done ($((SECONDS - t0))s)" >&2
}

"$ROOT/scripts/ensure-tools.sh"
cd "$ROOT"
phase "cargo fmt --check" cargo fmt --check
phase "cargo clippy" cargo clippy --all-targets --features test-hooks -- -D warnings
phase "cargo test" cargo test --features test-hooks

phase "build and install into build/stage" build_and_stage
# The Python package (python/) over the installed library: NumPy on the CPU
# backend (before ctest, whose summary ends the log).
phase "python tests" "$ROOT/scripts/python-test.sh" "$STAGE"
# UNIKV_CARGO_TARGET_DIR: the in-tree tests (add_subdirectory, FetchContent)
# reuse the cargo build build_and_stage just made, so cargo finds it up to date.
phase "configure cpp-tests" cmake_configure "$ROOT/cpp-tests" "$BUILD/cpp-tests" -DCMAKE_PREFIX_PATH="$STAGE" \
    -DUNIKV_CARGO_TARGET_DIR="$BUILD/cargo"
phase "build cpp-tests" cmake_build "$BUILD/cpp-tests"
phase "ctest" ctest --test-dir "$BUILD/cpp-tests" --output-on-failure
echo "test.sh: all tests passed in $((SECONDS - start))s" >&2
