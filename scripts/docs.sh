#!/usr/bin/env bash
# Builds the HTML API reference (Doxygen over include/unikv.h and docs/*.md)
# into OUTPUT_DIR (default build/docs; the pages are OUTPUT_DIR/html/) and
# fails when Doxygen warns about anything, an undocumented item included.
# CI runs it (.ci/run); CMake's `docs` target calls it too.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$ROOT/build/docs}
DOXYGEN=${DOXYGEN:-doxygen}
command -v "$DOXYGEN" >/dev/null ||
    { echo "docs.sh: doxygen is required (sudo apt-get install doxygen)" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
log="$out/warnings.log"
rm -f "$log"
cd "$ROOT"
{ cat docs/Doxyfile; echo "OUTPUT_DIRECTORY = \"$out\""; echo "WARN_LOGFILE = \"$log\""; } |
    "$DOXYGEN" -
if [ -s "$log" ]; then
    cat "$log" >&2
    echo "docs.sh: $(wc -l <"$log") Doxygen warning line(s) above (every item of include/unikv.h must be documented)" >&2
    exit 1
fi
echo "docs.sh: API reference in $out/html/index.html"
