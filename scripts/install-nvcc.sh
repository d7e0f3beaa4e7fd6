#!/usr/bin/env bash
# Installs the CUDA 13.0 compiler from the Python package index into a cache
# folder (no system toolkit needed) and prints the CUDA_HOME to use. Reused when
# present. Usage: eval "$(scripts/install-nvcc.sh --env)"
set -euo pipefail
prefix="${UNIKV_CUDA_CACHE:-$HOME/.cache/unikv/cuda-13.0.88}"
home="$prefix/nvidia/cu13"
if [ ! -x "$home/bin/nvcc" ]; then
  echo "installing nvcc 13.0.88 into $prefix" >&2
  python3 -m pip install --quiet --disable-pip-version-check --target "$prefix" \
    nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-nvvm==13.0.88 \
    nvidia-cuda-crt==13.0.88 'nvidia-cuda-cccl==13.0.*' >&2
fi
[ -x "$home/bin/nvcc" ] || { echo "nvcc missing under $home after install" >&2; exit 1; }
if [ "${1:-}" = "--env" ]; then
  echo "export CUDA_HOME='$home'; export PATH='$home/bin':\"\$PATH\""
else
  echo "$home"
fi
