#!/usr/bin/env bash
# Builds the library, installs it into build/stage, then builds and runs the
# example program (examples/) against that install, from any directory.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

"$ROOT/scripts/ensure-tools.sh"
build_and_stage
cmake_configure "$ROOT/examples" "$BUILD/examples" -DCMAKE_PREFIX_PATH="$STAGE"
cmake_build "$BUILD/examples"
"$BUILD/examples/unikv_example"
