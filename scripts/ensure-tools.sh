#!/usr/bin/env bash
# Installs what the builds need when it is missing: cmake >= 3.20, a C/C++
# compiler (reported, not installed), cargo with rustfmt and clippy, and
# python3 with NumPy for the Python package's tests.
# Idempotent; prints nothing when everything is already there.
set -euo pipefail

MIN_CMAKE=3.20
log=$(mktemp)
trap 'rm -f "$log"' EXIT

die() {
    echo "ensure-tools: $*" >&2
    exit 1
}

# Runs a command quietly; shows its output only when it fails.
quiet() {
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        return 1
    fi
}

cmake_ok() {
    local v
    v=$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9][0-9.]*\).*/\1/p')
    [ -n "$v" ] && [ "$(printf '%s\n%s\n' "$MIN_CMAKE" "$v" | sort -V | head -n1)" = "$MIN_CMAKE" ]
}

if ! cmake_ok; then
    # Distribution packages first (root only); older distributions ship a
    # cmake below 3.20, so pip is tried whenever the result is still too old.
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        quiet apt-get update -qq || true
        DEBIAN_FRONTEND=noninteractive quiet apt-get install -y -qq cmake || true
    fi
    if ! cmake_ok && command -v python3 >/dev/null; then
        quiet python3 -m pip install --user --quiet "cmake>=$MIN_CMAKE" || true
        # pip puts it in the user base's bin/, which the caller must put on PATH.
        user_bin="$(python3 -m site --user-base)/bin"
        if [ -x "$user_bin/cmake" ] && ! cmake_ok; then
            die "cmake is installed in $user_bin: put that folder first on PATH and rerun"
        fi
    fi
    cmake_ok || die "cmake >= $MIN_CMAKE is required: install it with
    sudo apt-get install cmake     (Debian/Ubuntu, if recent enough)
    python3 -m pip install --user cmake   (then put \$(python3 -m site --user-base)/bin on PATH)
  or download it from https://cmake.org/download/"
fi

# The compilers CMake looks for when CC/CXX are unset.
have_any() {
    local c
    for c in "$@"; do command -v "$c" >/dev/null && return 0; done
    return 1
}
have_any ${CC:-cc gcc clang} && have_any ${CXX:-c++ g++ clang++} ||
    die "a C and C++ compiler is required (or set CC/CXX): install
    sudo apt-get install gcc g++        (Debian/Ubuntu)
    sudo dnf install gcc gcc-c++        (Fedora/RHEL)"

command -v cargo >/dev/null || die "cargo is required: install Rust with rustup:
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y
    . \"\$HOME/.cargo/env\""

# scripts/test.sh runs `cargo fmt` (component rustfmt) and `cargo clippy`.
ensure_component() { # subcommand component
    cargo "$1" --version >/dev/null 2>&1 && return
    command -v rustup >/dev/null ||
        die "cargo $1 is missing: add the $2 component to your Rust toolchain"
    quiet rustup component add "$2"
}
ensure_component fmt rustfmt
ensure_component clippy clippy

# scripts/python-test.sh needs a python3 that imports numpy: the distribution's
# package when none does (root only; otherwise the script says what to install).
if ! { command -v python3 >/dev/null && python3 -c 'import numpy' 2>/dev/null; } &&
    ! /usr/bin/python3 -c 'import numpy' 2>/dev/null &&
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    quiet apt-get update -qq || true
    DEBIAN_FRONTEND=noninteractive quiet apt-get install -y -qq python3-numpy ||
        die "could not install python3-numpy (needed by scripts/python-test.sh)"
fi
