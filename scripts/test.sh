#!/usr/bin/env bash
# Runs every test, from any directory: rustfmt, clippy and the Rust tests, then
# the Python package's tests and the C/C++ suite (ctest) against the library
# installed into build/stage.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

"$ROOT/scripts/ensure-tools.sh"
cd "$ROOT"
cargo fmt --check
cargo clippy --all-targets --features test-hooks -- -D warnings
cargo test --features test-hooks

build_and_stage
# The Python package (python/) over the installed library: NumPy on the CPU
# backend (before ctest, whose summary ends the log).
"$ROOT/scripts/python-test.sh" "$STAGE"
cmake_configure "$ROOT/cpp-tests" "$BUILD/cpp-tests" -DCMAKE_PREFIX_PATH="$STAGE"
cmake_build "$BUILD/cpp-tests"
ctest --test-dir "$BUILD/cpp-tests" --output-on-failure
