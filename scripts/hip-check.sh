#!/usr/bin/env bash
# HIP build check, no AMD GPU needed: every kernel file compiles with hipcc for
# the targets in UNIKV_HIP_ARCHS (default gfx90a;gfx940, the CDNA targets
# Debian's hipcc 5.2 accepts) with warnings as errors; the objects define
# exactly the unikv_gpu_* entry points the Rust shim declares (so no operation
# is missing on the HIP side); and the crate builds and links with the `rocm`
# feature (clippy-clean). Installs Debian's hipcc, libamdhip64-dev and
# rocm-device-libs when hipcc is absent (root). The target list is always
# explicit, so hipcc never probes this machine for a GPU.
#
# Every .cu under kernels/ compiles, test-only sources and hooks included
# (-DUKV_TEST_HOOKS); the attention instances of NVIDIA-only kernels compile to
# empty objects, so HIP builds carry the portable kernels only
# (kernels/attention/portable.cuh). For each MFMA target in the list the check
# disassembles the two matrix-variant instances (bf16 and FP8 pools) and
# requires v_mfma instructions in each, so the matrix path cannot fall back to
# its software model unnoticed.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

die() {
    echo "hip-check: $*" >&2
    exit 1
}

if ! command -v hipcc >/dev/null; then
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null ||
        die "hipcc not found: install Debian's hipcc, libamdhip64-dev and rocm-device-libs (or ROCm)"
    log=$(mktemp)
    trap 'rm -f "$log"' EXIT
    packages=(hipcc libamdhip64-dev rocm-device-libs)
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >"$log" 2>&1; then
        apt-get update -qq >"$log" 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >"$log" 2>&1 ||
            { cat "$log" >&2; die "could not install ${packages[*]}"; }
    fi
fi

archs=${UNIKV_HIP_ARCHS-"gfx90a;gfx940"}
offload=()
IFS=';' read -ra list <<<"$archs"
for arch in "${list[@]}"; do
    [ -n "$arch" ] && offload+=("--offload-arch=$arch")
done
[ ${#offload[@]} -gt 0 ] || die "UNIKV_HIP_ARCHS is empty: name at least one gfx target (e.g. gfx90a;gfx940)"

# hipcc picks NVIDIA as its platform when it finds a CUDA toolkit (CI puts
# one on PATH first); these kernels are for AMD targets.
export HIP_PLATFORM=amd
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mapfile -t sources < <(find kernels -name '*.cu' | sort)
flags=(-std=c++17 -O3 -Wall -Wextra -Werror -Ikernels -DUKV_TEST_HOOKS)
for src in "${sources[@]}"; do
    hipcc -x hip "${offload[@]}" "${flags[@]}" -c "$src" -o "$out/$(echo "${src%.cu}" | tr / _).o" ||
        die "$src does not compile for $archs"
done

# The matrix variant on MFMA targets: attention_portable_kernel<kFp8, true>,
# one instance per pool type.
mfma_kernels=0
for arch in "${list[@]}"; do
    case "$arch" in gfx90a | gfx94? | gfx950) ;; *) continue ;; esac
    for pool in bf16 fp8; do
        src=kernels/attention/instances/portable_matrix_$pool.cu
        asm="$out/portable-matrix-$pool-$arch.s"
        hipcc -x hip --offload-arch="$arch" --cuda-device-only -S "${flags[@]}" -Wno-unused-command-line-argument \
            "$src" -o "$asm" || die "$src does not compile for $arch"
        counts=$(awk '/^_Z[^ ]*attention_portable_kernelILb[01]ELb1EE[^ ]*:/ {name = $1; n = 0}
                      name && /v_mfma/ {n++}
                      name && /^\.Lfunc_end/ {print n; name = ""}' "$asm")
        [ "$(echo "$counts" | grep -c '^[1-9]')" = 1 ] ||
            die "$arch: the $pool matrix attention kernel carries no v_mfma instructions (per kernel: $(echo $counts))"
        mfma_kernels=$((mfma_kernels + 1))
    done
done

# The entry points: defined by the HIP objects = declared by src/backend/gpu/shim.rs.
defined=$(nm -g --defined-only "$out"/*.o | awk '$3 ~ /^unikv_gpu_/ {print $3}' | sort -u)
declared=$(grep -oh 'fn unikv_gpu_[a-z0-9_]*' src/backend/gpu/*.rs | sed 's/fn //' | sort -u)
if [ "$defined" != "$declared" ]; then
    diff <(echo "$declared") <(echo "$defined") >&2 || true
    die "the HIP objects' unikv_gpu_* entry points differ from src/backend/gpu/shim.rs (< declared, > defined)"
fi

# The crate with the AMD backend: clippy, then a build that links libamdhip64.
export UNIKV_HIP_ARCHS="$archs"
cargo clippy --features rocm,test-hooks --all-targets --target-dir build/cargo-rocm -- -D warnings
cargo build --features rocm,test-hooks --target-dir build/cargo-rocm
echo "hip-check: all ${#sources[@]} kernel files compile for $archs and export the shim's $(echo "$declared" | wc -l) entry points; $mfma_kernels matrix kernels use v_mfma; the rocm build links"
