#!/usr/bin/env bash
# Fuzzes the C API (fuzz/fuzz_targets/api.rs, harness in tests/fuzz_harness/)
# for a fixed time, starting from a scratch copy of the committed corpus
# fuzz/corpus/api (the committed one is never modified), and prints one
# summary line: executions, exec/s, libFuzzer's final cov/ft, crashes.
#
# libFuzzer runs in fork mode and goes on after a crash. Each crash input is
# replayed afterwards: one whose output names the signature of a defect listed
# in fuzz/regressions/OPEN (a known library defect, already kept as a
# regression) is reported as known; any other crash makes the script exit
# non-zero. Crash inputs and the log stay under build/fuzz-run/.
#
# Usage: scripts/fuzz.sh [SECONDS]   (default 120)
# Environment: FUZZ_JOBS (parallel fuzzing processes, default 1),
#   FUZZ_SANITIZER (cargo fuzz's -s: address, the default, or none, about
#   three times faster, for long runs whose corpus is replayed under
#   AddressSanitizer afterwards), FUZZ_LEAKS=1 (LeakSanitizer on: slower,
#   since destroyed contexts' worker threads exit after their input and set
#   off a leak scan), UNIKV_FUZZ_ALIASING=1|off (see tests/fuzz_harness).
#
# cargo-fuzz is installed when missing; libFuzzer and the sanitizers need a
# nightly compiler's flags, which the stable toolchain accepts with
# RUSTC_BOOTSTRAP=1 (set here), so no nightly toolchain is needed.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SECS=${1:-120}
JOBS=${FUZZ_JOBS:-1}
SAN=${FUZZ_SANITIZER:-address}
export RUSTC_BOOTSTRAP=1
export PATH="$HOME/.cargo/bin:$PATH"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

if [ "$SAN" = address ]; then
    TARGET_DIR="$ROOT/build/fuzz"
else
    TARGET_DIR="$ROOT/build/fuzz-$SAN"
fi
RUN="$ROOT/build/fuzz-run"
rm -rf "$RUN"
mkdir -p "$RUN/corpus" "$RUN/artifacts"
cp -R "$ROOT/fuzz/corpus/api/." "$RUN/corpus/"

cd "$ROOT/fuzz"
start=$(date +%s)
cargo fuzz build api -s "$SAN" --target-dir "$TARGET_DIR"
echo "fuzz.sh: build took $(($(date +%s) - start)) s" >&2
BIN="$TARGET_DIR/$(rustc -vV | sed -n 's/^host: //p')/release/api"

log="$RUN/fuzz.log"
set +e
"$BIN" "$RUN/corpus" -fork="$JOBS" -ignore_crashes=1 \
    -max_total_time="$SECS" -rss_limit_mb=2048 -timeout=10 -max_len=4096 \
    -detect_leaks="${FUZZ_LEAKS:-0}" -artifact_prefix="$RUN/artifacts/" >"$log" 2>&1
rc=$?
set -e

# Status lines: "#EXECS: cov: C ft: F corp: N exec/s: R oom/timeout/crash:
# a/b/c time: Ts job: J".
last=$(grep -h -E '^#[0-9]+: cov:' "$log" | tail -n 1 || true)
execs=$(sed -n 's/^#\([0-9]*\):.*/\1/p' <<<"$last")
secs=$(sed -n 's/.* time: \([0-9]*\)s.*/\1/p' <<<"$last")
cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
rate=$((${execs:-0} / (${secs:-1} > 0 ? ${secs:-1} : 1)))

# Signatures of the open defects: the second '|' field of each line of OPEN.
mapfile -t known < <(grep -v '^#' "$ROOT/fuzz/regressions/OPEN" 2>/dev/null |
    awk -F'|' 'NF >= 3 {gsub(/^ +| +$/, "", $2); print $2}')
new=0
old=0
for f in "$RUN"/artifacts/*; do
    [ -f "$f" ] || continue
    out=$("$BIN" "$f" -detect_leaks=0 2>&1 || true)
    match=
    for sig in "${known[@]}"; do
        if grep -q -F -- "$sig" <<<"$out"; then
            match=$sig
        fi
    done
    if [ -n "$match" ]; then
        old=$((old + 1))
        echo "fuzz.sh: known open defect ($match): $f" >&2
    else
        new=$((new + 1))
        echo "fuzz.sh: NEW CRASH: $f" >&2
        grep -E 'panicked at|^==[0-9]+==ERROR|SUMMARY' -A2 <<<"$out" | head -n 8 >&2
    fi
done
if [ "$rc" -ne 0 ] && [ "$new" -eq 0 ] && [ "$old" -eq 0 ]; then
    new=1
    echo "fuzz.sh: libFuzzer exited with $rc; see $log" >&2
fi

echo "fuzz: ${SECS}s, ${execs:-0} executions, ${rate} exec/s, cov: ${cov:-?} ft: ${ft:-?}," \
    "corpus $(ls "$RUN/corpus" | wc -l) files, crashes: $new new, $old known open defects"
if [ "$new" -gt 0 ]; then
    echo "fuzz.sh: reproduce with: $BIN <crash file> (UNIKV_FUZZ_TRACE=1 prints the calls); log $log" >&2
    exit 1
fi
