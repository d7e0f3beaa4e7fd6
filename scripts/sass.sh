#!/usr/bin/env bash
# Per-kernel SASS of every CUDA kernel source, for proving a refactor changed
# no machine code. Compiles each .cu under kernels/ (recursively) as build.rs
# does, for each target in UNIKV_CUDA_ARCHS (default sm_90a;sm_80), and writes
# OUTDIR/<arch>/<kernel>.sass: one file per kernel function, named by its
# demangled signature with the anonymous-namespace tag (which differs per
# translation unit) removed, and addresses stripped (the instruction words,
# scheduling bits included, stay) so two builds compare with `diff -r`. Needs nvcc (scripts/install-nvcc.sh) and cuobjdump
# (CUOBJDUMP, or on PATH).
#
#   scripts/sass.sh OUTDIR            # then: diff -r BEFORE AFTER
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:?usage: scripts/sass.sh OUTDIR}
if ! command -v cuobjdump >/dev/null || ! command -v nvdisasm >/dev/null; then
    tools="${XDG_CACHE_HOME:-$HOME/.cache}/unikv/sass-tools-13.5.37"
    if [ ! -x "$tools/nvidia/cu13/bin/nvdisasm" ]; then
        python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$tools" \
            nvidia-cuda-cuobjdump==13.5.37 nvidia-cuda-nvdisasm==13.5.37 >&2
    fi
    export PATH="$tools/nvidia/cu13/bin:$PATH"
fi
command -v nvcc >/dev/null || { echo "sass.sh: nvcc not found: eval \"\$(scripts/install-nvcc.sh --env)\"" >&2; exit 1; }
archs=${UNIKV_CUDA_ARCHS-"sm_90a;sm_80"}
defines=${UNIKV_SASS_DEFINES-}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$ROOT"
mapfile -t sources < <(find kernels -name '*.cu' | sort)
IFS=';' read -ra list <<<"$archs"
for arch in "${list[@]}"; do
    num=${arch#sm_}
    for src in "${sources[@]}"; do
        obj="$work/$(echo "$src" | tr / _).$arch.cubin"
        # shellcheck disable=SC2086
        nvcc -std=c++17 -O3 -cubin -arch="sm_$num" -Ikernels $defines "$src" -o "$obj" &
        while [ "$(jobs -rp | wc -l)" -ge "${SASS_JOBS:-2}" ]; do wait -n; done
    done
    wait
    mkdir -p "$out/$arch"
    for obj in "$work"/*."$arch".cubin; do
        cuobjdump -sass "$obj" | python3 -c '
import re, sys, os, subprocess
out = sys.argv[1]
name, lines = None, []
def flush():
    if name is None or not lines: return
    demangled = subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip()
    demangled = re.sub(r"\(anonymous namespace\)::", "", demangled)
    fname = re.sub(r"[^A-Za-z0-9_,<>()=-]+", "_", demangled)[:200]
    with open(os.path.join(out, fname + ".sass"), "w") as f:
        f.write("\n".join(lines) + "\n")
for raw in sys.stdin:
    m = re.match(r"\s*Function : (\S+)", raw)
    if m:
        flush(); name, lines = m.group(1), []; continue
    if name is None: continue
    line = re.sub(r"/\*[0-9a-f]{4,}\*/", "", raw)      # addresses
    line = re.sub(r"_GLOBAL__N__[0-9a-f_]+", "", line)  # TU-local namespace tags
    line = " ".join(line.split())  # column padding depends on the whole cubin
    if line and not line.startswith(".") and line != "..........":
        lines.append(line)
flush()
' "$out/$arch"
    done
done
find "$out" -name '*.sass' | wc -l | xargs echo "sass.sh: kernels dumped:"
