#!/usr/bin/env bash
# Runs the Python package's tests (python/tests, NumPy on the CPU backend)
# against an installed library: scripts/python-test.sh [PREFIX] (default
# build/stage, as scripts/test.sh leaves it). Uses the first python3 that can
# import numpy: the one on PATH, else the distribution's /usr/bin/python3
# (scripts/ensure-tools.sh installs python3-numpy there when none can).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
prefix=${1:-$STAGE}

python=
for candidate in python3 /usr/bin/python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import numpy' 2>/dev/null; then
        python=$candidate
        break
    fi
done
[ -n "$python" ] || {
    echo "python-test: no python3 with numpy (sudo apt-get install python3-numpy)" >&2
    exit 1
}

UNIKV_LIBRARY="$prefix/lib/libunikv.so" UNIKV_INCLUDE_DIR="$prefix/include" PYTHONPATH="$ROOT/python" \
    PYTHONDONTWRITEBYTECODE=1 "$python" -m unittest discover -s "$ROOT/python/tests" -p 'test_*.py' -v
