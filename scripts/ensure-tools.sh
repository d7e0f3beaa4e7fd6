#!/usr/bin/env bash
# Installs what the builds need when it is missing: cmake >= 3.20, pkg-config,
# a C/C++ compiler (reported, not installed), cargo with rustfmt and clippy
# (the toolchain rust-toolchain.toml pins, when Rust comes from rustup), doxygen
# (the API reference check, scripts/docs.sh) and python3 with NumPy for the
# Python package's tests.
# Idempotent; prints nothing when everything is already there.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
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

# ctest's pkg_config case links a C program with `pkg-config --cflags --libs
# unikv` (it is skipped, saying so, without pkg-config).
if ! command -v pkg-config >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        quiet apt-get update -qq || true
        DEBIAN_FRONTEND=noninteractive quiet apt-get install -y -qq pkg-config || true
    fi
    command -v pkg-config >/dev/null ||
        echo "ensure-tools: pkg-config is missing, so ctest skips its pkg_config case: install it with
    sudo apt-get install pkg-config   (Debian/Ubuntu)
    sudo dnf install pkgconf          (Fedora/RHEL)" >&2
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

# rust-toolchain.toml pins the toolchain the project is tested with; under
# rustup, the first cargo call in the repository would download it when it is
# not installed. An installed stable of exactly that version is reused instead
# (linked under the pinned name, no download); otherwise rustup installs it.
# RUSTUP_TOOLCHAIN, when set, overrides the file and is left alone.
ensure_toolchain() {
    command -v rustup >/dev/null || return 0
    [ -z "${RUSTUP_TOOLCHAIN:-}" ] || return 0
    local pinned host toolchains
    pinned=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' "$ROOT/rust-toolchain.toml")
    [ -n "$pinned" ] || die "rust-toolchain.toml names no channel"
    # Outside the repository, so the pinned toolchain is not resolved yet.
    host=$(cd / && rustc -vV 2>/dev/null | sed -n 's/^host: //p')
    [ -n "$host" ] || host=$(cd / && rustup show 2>/dev/null | sed -n 's/^Default host: //p')
    rustup toolchain list | grep -q "^$pinned-$host" && return 0
    toolchains="${RUSTUP_HOME:-$HOME/.rustup}/toolchains"
    if [ -d "$toolchains/stable-$host" ] &&
        (cd / && rustc +stable --version 2>/dev/null) | grep -q "^rustc $pinned "; then
        ln -s "$toolchains/stable-$host" "$toolchains/$pinned-$host"
        return 0
    fi
    quiet rustup toolchain install "$pinned" --profile minimal -c rustfmt -c clippy ||
        die "could not install Rust $pinned (rust-toolchain.toml). To build with another
installed toolchain instead (untested), set RUSTUP_TOOLCHAIN, e.g. RUSTUP_TOOLCHAIN=stable"
}
ensure_toolchain
cd "$ROOT"

# scripts/test.sh runs `cargo fmt` (component rustfmt) and `cargo clippy`.
ensure_component() { # subcommand component
    cargo "$1" --version >/dev/null 2>&1 && return
    command -v rustup >/dev/null ||
        die "cargo $1 is missing: add the $2 component to your Rust toolchain"
    quiet rustup component add "$2"
}
ensure_component fmt rustfmt
ensure_component clippy clippy

# scripts/docs.sh (CI's documentation check) runs Doxygen: the distribution's
# package when running as root; otherwise docs.sh says how to install it (the
# builds and tests do not need it).
if ! command -v doxygen >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    quiet apt-get update -qq || true
    DEBIAN_FRONTEND=noninteractive quiet apt-get install -y -qq --no-install-recommends doxygen || true
fi

# scripts/python-test.sh needs a python3 that imports numpy: the distribution's
# package when none does (root only; otherwise the script says what to install).
if ! { command -v python3 >/dev/null && python3 -c 'import numpy' 2>/dev/null; } &&
    ! /usr/bin/python3 -c 'import numpy' 2>/dev/null &&
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    quiet apt-get update -qq || true
    DEBIAN_FRONTEND=noninteractive quiet apt-get install -y -qq python3-numpy ||
        die "could not install python3-numpy (needed by scripts/python-test.sh)"
fi
