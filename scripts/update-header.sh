#!/usr/bin/env bash
# Regenerates include/unikv.h from src/ffi/ (after a C ABI change).
set -euo pipefail
cd "$(dirname "$0")/.."
UNIKV_UPDATE_HEADER=1 cargo test --quiet --test header -- header_is_fresh
