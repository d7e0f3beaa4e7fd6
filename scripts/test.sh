#!/usr/bin/env bash
# Runs every test, from any directory: rustfmt, clippy and the Rust tests, then
# the C/C++ suite (ctest) against the library installed into build/stage.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

"$ROOT/scripts/ensure-tools.sh"
cd "$ROOT"
cargo fmt --check
cargo clippy --all-targets --features test-hooks -- -D warnings
cargo test --features test-hooks

build_and_stage
# UNIKV_CARGO_TARGET_DIR: the in-tree tests (add_subdirectory, FetchContent)
# reuse the cargo build build_and_stage just made, so cargo finds it up to date.
cmake_configure "$ROOT/cpp-tests" "$BUILD/cpp-tests" -DCMAKE_PREFIX_PATH="$STAGE" \
    -DUNIKV_CARGO_TARGET_DIR="$BUILD/cargo"
cmake_build "$BUILD/cpp-tests"
ctest --test-dir "$BUILD/cpp-tests" --output-on-failure
