#!/usr/bin/env bash
# GPU verification in two halves (contributors: see README, "Checking on a GPU").
#
#   scripts/gpu-check.sh bundle      here (nvcc, no GPU): builds the CUDA test
#                                    binary, the benchmark and a staged install
#                                    tree into gpu-bundle/ (git-ignored, < 64 MiB)
#   scripts/gpu-check.sh run [what]  on the GPU machine (driver, CMake, C++,
#                                    PyTorch; no Rust), from the repository root
#                                    with gpu-bundle/ carried along; `what` is
#                                    tests (= suites, sanitizers and fuzz: the
#                                    fuzz corpus on CUDA under memcheck), one
#                                    of those three, bench or all (default).
#                                    Logs go to
#                                    $OUT (or /tmp/unikv-gpu-out); a summary
#                                    table is printed last.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUNDLE="$ROOT/gpu-bundle"
cd "$ROOT"

bundle() {
    scripts/ensure-tools.sh
    eval "$(scripts/install-nvcc.sh --env)"
    export UNIKV_CUDA_ARCHS="${UNIKV_CUDA_ARCHS:-sm_90a}"
    local target="$ROOT/build/cargo-gpu"
    rm -rf "$BUNDLE" && mkdir -p "$BUNDLE/bin"
    cargo build --release -p unikv-bench --target-dir "$target"
    # The GPU suite, and the fuzz corpus replay (run on CUDA contexts there).
    cargo test --release --features cuda,test-hooks --no-run --test gpu --test fuzz_replay \
        --target-dir "$target" --message-format=json | python3 -c '
import json, shutil, sys
names = {"gpu": "gpu-tests", "fuzz_replay": "fuzz-replay"}
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in names:
        shutil.copy(m["executable"], sys.argv[1] + "/bin/" + names[m["target"]["name"]])' "$BUNDLE"
    cp "$target/release/unikv-bench" "$BUNDLE/bin/unikv-bench"
    strip "$BUNDLE/bin/"*
    source scripts/lib.sh
    cmake_configure "$ROOT" "$ROOT/build/gpu" -DUNIKV_CARGO_FEATURES=cuda
    cmake_build "$ROOT/build/gpu"
    cmake --install "$ROOT/build/gpu" --prefix "$BUNDLE/stage"
    strip "$BUNDLE"/stage/lib/libunikv.so.*.*.*
    du -sh "$BUNDLE"
}

run_suites() {
    local out=$1
    local status=0
    UNIKV_EXPECT_GPU=1 "$BUNDLE/bin/gpu-tests" --test-threads=1 2>&1 | tee "$out/rust-gpu-tests.log" || status=1
    local gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    cmake -S cpp-tests -B /tmp/unikv-cpp-gpu "${gen[@]}" -DCMAKE_PREFIX_PATH="$BUNDLE/stage" >/tmp/cmake.log 2>&1
    cmake --build /tmp/unikv-cpp-gpu >>/tmp/cmake.log 2>&1 || { cat /tmp/cmake.log; return 1; }
    UNIKV_TEST_BACKEND=cuda ctest --test-dir /tmp/unikv-cpp-gpu --output-on-failure 2>&1 | tee "$out/cpp.log" || status=1
    cmake -S examples -B /tmp/unikv-example-gpu "${gen[@]}" -DCMAKE_PREFIX_PATH="$BUNDLE/stage" >>/tmp/cmake.log 2>&1
    cmake --build /tmp/unikv-example-gpu >>/tmp/cmake.log 2>&1 || { cat /tmp/cmake.log; return 1; }
    /tmp/unikv-example-gpu/unikv_example 2>&1 | tee -a "$out/cpp.log" || status=1
    # The Python package with PyTorch CUDA tensors against a PyTorch reference.
    UNIKV_LIBRARY="$BUNDLE/stage/lib/libunikv.so" PYTHONPATH="$ROOT/python" PYTHONDONTWRITEBYTECODE=1 \
        python3 python/tests/gpu_torch.py 2>&1 | tee "$out/python-gpu.log" || status=1
    return $status
}

# compute-sanitizer over the GPU tests at their small size; UNIKV_SANITIZERS
# picks the tools (default all four), so a run can be split across calls.
run_sanitizers() {
    local out=$1
    local status=0
    # A hang under a sanitizer (a kernel that waits on other warps in a way the
    # tool cannot schedule) fails that tool after UNIKV_SANITIZER_TIMEOUT seconds
    # instead of eating the machine's time.
    local limit=${UNIKV_SANITIZER_TIMEOUT:-200}
    for tool in ${UNIKV_SANITIZERS:-memcheck racecheck synccheck initcheck}; do
        UNIKV_EXPECT_GPU=1 UNIKV_GPU_TEST_SMALL=1 timeout "$limit" compute-sanitizer --tool "$tool" --error-exitcode 9 \
            "$BUNDLE/bin/gpu-tests" --test-threads=1 >"$out/sanitizer-$tool.log" 2>&1 || {
            echo "compute-sanitizer $tool: exit $? (124: no result within ${limit} s)" | tee -a "$out/sanitizer-$tool.log"
            status=1
        }
    done
    return $status
}

run_tests() {
    local out=$1
    local status=0
    run_suites "$out" || status=1
    run_sanitizers "$out" || status=1
    run_fuzz "$out" || status=1
    return $status
}

# The committed fuzz corpus and regressions replayed on CUDA contexts under
# memcheck: hostile descriptors and index contents must not make a kernel
# touch memory out of bounds.
run_fuzz() {
    local out=$1
    local limit=${UNIKV_SANITIZER_TIMEOUT:-200}
    # Hostile allocation sizes make cudaMalloc fail on purpose: not an error here.
    UNIKV_FUZZ_BACKEND=cuda UNIKV_FUZZ_ROOT="$ROOT" timeout "$limit" compute-sanitizer --tool memcheck --report-api-errors no \
        --error-exitcode 9 "$BUNDLE/bin/fuzz-replay" --test-threads=1 --nocapture >"$out/fuzz-memcheck.log" 2>&1 || {
        echo "fuzz replay under memcheck: exit $? (124: no result within ${limit} s)" | tee -a "$out/fuzz-memcheck.log"
        return 1
    }
}

run_bench() {
    local out=$1
    local tflops
    local ceilings
    ceilings=$(python3 - <<'PY'
import torch
def median_ms(fn, reps=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times)[reps // 2]
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
tflops = 2 * n**3 / (median_ms(lambda: a @ b) * 1e-3) / 1e12
src = torch.randn(1 << 29, device="cuda")  # 2 GiB
dst = torch.empty_like(src)
tbps = 2 * src.numel() * 4 / (median_ms(lambda: dst.copy_(src)) * 1e-3) / 1e12
print(f"{tflops:.1f} {tbps:.3f}")
PY
)
    local tflops=${ceilings% *} tbps=${ceilings#* }
    echo "PyTorch ceilings (median of 10): bf16 matmul 8192^3 $tflops TFLOP/s, 2 GiB device copy $tbps TB/s (read + write)" | tee "$out/bench.md"
    if command -v cuobjdump >/dev/null; then
        # Tensor-core evidence: mma.sync shows as HMMA, ldmatrix as LDSM, cp.async as LDGSTS.
        cuobjdump --dump-sass "$BUNDLE"/stage/lib/libunikv.so >/tmp/unikv.sass
        echo "SASS of libunikv.so: $(grep -c 'HGMMA' /tmp/unikv.sass) HGMMA (wgmma), $(grep -c 'HMMA' /tmp/unikv.sass) HMMA (mma.sync), $(grep -c 'LDSM' /tmp/unikv.sass) LDSM," \
            "$(grep -c 'LDGSTS' /tmp/unikv.sass) LDGSTS instructions" | tee -a "$out/bench.md"
    fi
    UNIKV_MATMUL_TFLOPS=$tflops UNIKV_COPY_TBPS=$tbps "$BUNDLE/bin/unikv-bench" 2>&1 | tee -a "$out/bench.md"
}

summary() {
    local out=$1
    echo
    echo "== summary =="
    grep -h "test result" "$out/rust-gpu-tests.log" 2>/dev/null | sed 's/^/rust gpu tests: /' || true
    grep -h "tests passed" "$out/cpp.log" 2>/dev/null | sed 's/^/ctest (cuda): /' || true
    grep -h "max relative" "$out/cpp.log" 2>/dev/null | sed 's/^/example: /' || true
    grep -h "^gpu_torch" "$out/python-gpu.log" 2>/dev/null | sed 's/^/python: /' || true
    for tool in memcheck racecheck synccheck initcheck; do
        [ -f "$out/sanitizer-$tool.log" ] || continue
        echo "compute-sanitizer $tool: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|no result within' "$out/sanitizer-$tool.log" | tail -1)"
    done
    if [ -f "$out/fuzz-memcheck.log" ]; then
        echo "fuzz corpus on CUDA: $(grep -h 'inputs replayed' "$out/fuzz-memcheck.log" | tr '\n' ' ')$(grep -h 'ERROR SUMMARY\|no result within' "$out/fuzz-memcheck.log" | tail -1)"
    fi
}

case "${1:-}" in
    bundle) bundle ;;
    run)
        what=${2:-all}
        out=${OUT:-/tmp/unikv-gpu-out}
        mkdir -p "$out"
        nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
        status=0
        case "$what" in
            tests) run_tests "$out" || status=1 ;;
            fuzz) run_fuzz "$out" || status=1 ;;
            suites) run_suites "$out" || status=1 ;;
            sanitizers) run_sanitizers "$out" || status=1 ;;
            bench) run_bench "$out" || status=1 ;;
            all) run_tests "$out" || status=1; run_bench "$out" || status=1 ;;
            *) echo "unknown: $what" >&2; exit 2 ;;
        esac
        summary "$out"
        case "$what" in
            bench | all)
                # The main table's last rows, then the FlashMLA side-by-side section
                # (unikv-bench prints it last: table, geometric means, targets met) in full.
                sed '/^FlashMLA side by side/,$d' "$out/bench.md" | grep '^|' | tail -40
                sed -n '/^FlashMLA side by side/,$p' "$out/bench.md"
                ;;
        esac
        exit $status
        ;;
    *)
        echo "usage: scripts/gpu-check.sh bundle | run [tests|suites|sanitizers|fuzz|bench|all]" >&2
        exit 2
        ;;
esac
