#!/usr/bin/env bash
# Fuzzes the C API (fuzz/fuzz_targets/api.rs, harness in tests/fuzz_harness/)
# for a fixed time, starting from a scratch copy of the committed corpus
# fuzz/corpus/api (the committed one is never modified), and prints one
# summary line: executions, exec/s, libFuzzer's final cov/ft, crash or not.
# Exits non-zero on a crash; the input is kept under build/fuzz-run/artifacts.
#
# Usage: scripts/fuzz.sh [SECONDS]   (default 120)
# Environment: FUZZ_JOBS (parallel fuzzing processes through libFuzzer's fork
#   mode, which also keeps going after a crash; default 1),
#   FUZZ_LEAKS=1 (LeakSanitizer on: slower, since destroyed contexts' worker
#   threads exit after their input and set off a leak scan),
#   UNIKV_FUZZ_ALIASING=1 (also generate outputs overlapping other arguments).
#
# cargo-fuzz is installed when missing; libFuzzer and AddressSanitizer need a
# nightly compiler's flags, which the stable toolchain accepts with
# RUSTC_BOOTSTRAP=1 (set here), so no nightly toolchain is needed.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SECS=${1:-120}
JOBS=${FUZZ_JOBS:-1}
export RUSTC_BOOTSTRAP=1
export PATH="$HOME/.cargo/bin:$PATH"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

TARGET_DIR="$ROOT/build/fuzz"
RUN="$ROOT/build/fuzz-run"
rm -rf "$RUN"
mkdir -p "$RUN/corpus" "$RUN/artifacts"
cp -R "$ROOT/fuzz/corpus/api/." "$RUN/corpus/"

cd "$ROOT/fuzz"
start=$(date +%s)
cargo fuzz build api --target-dir "$TARGET_DIR"
echo "fuzz.sh: build took $(($(date +%s) - start)) s" >&2

log="$RUN/fuzz.log"
set +e
cargo fuzz run api "$RUN/corpus" --target-dir "$TARGET_DIR" -- \
    -max_total_time="$SECS" -rss_limit_mb=2048 -timeout=10 -max_len=4096 \
    -detect_leaks="${FUZZ_LEAKS:-0}" -print_final_stats=1 \
    -artifact_prefix="$RUN/artifacts/" \
    $([ "$JOBS" -gt 1 ] && echo "-fork=$JOBS -ignore_crashes=1") >"$log" 2>&1
rc=$?
set -e

if [ "$JOBS" -gt 1 ]; then
    # Fork mode: status lines "#EXECS: cov: C ft: F corp: ... exec/s: R ...".
    last=$(grep -h -E '^#[0-9]+: cov:' "$log" | tail -n 1)
    execs=$(sed -n 's/^#\([0-9]*\):.*/\1/p' <<<"$last")
    rate=$(sed -n 's/.* exec\/s: \([0-9]*\).*/\1/p' <<<"$last")
else
    stat() { grep -h "stat::$1:" "$log" | awk '{s += $2} END {print s + 0}'; }
    execs=$(stat number_of_executed_units)
    rate=$(stat average_exec_per_sec)
    last=$(grep -h -E '(DONE|pulse|NEW|REDUCE|INITED) +cov:' "$log" | tail -n 1)
fi
cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
crashed=no
if [ "$rc" -ne 0 ] || [ -n "$(ls -A "$RUN/artifacts")" ] ||
    grep -q -E '^==[0-9]+==ERROR|panicked at|deadly signal' "$log"; then
    crashed=yes
fi
echo "fuzz: ${SECS}s, ${execs} executions, ${rate} exec/s, cov: ${cov:-?} ft: ${ft:-?}, corpus $(ls "$RUN/corpus" | wc -l) files, crashed: $crashed"
if [ "$crashed" = yes ]; then
    grep -h -E 'panicked at|^==[0-9]+==ERROR|SUMMARY' -A3 "$log" | head -n 20 >&2
    ls "$RUN/artifacts" >&2
    echo "fuzz.sh: log $log; reproduce with: cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run api --target-dir $TARGET_DIR <artifact>" >&2
    exit 1
fi
