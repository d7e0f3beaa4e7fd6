# Shared by scripts/test.sh and scripts/example.sh (sourced, after `set -euo
# pipefail`): locations, generator choice, and the library build + install.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD="$ROOT/build"
STAGE="$BUILD/stage"
JOBS=$(nproc)
if command -v ninja >/dev/null; then GENERATOR=Ninja; else GENERATOR="Unix Makefiles"; fi

# cmake_configure SRC BIN [ARGS...]. The generator is given only for a fresh
# build folder: CMake refuses to switch generators on an existing one.
cmake_configure() {
    local src=$1 bin=$2
    shift 2
    local generator=()
    [ -f "$bin/CMakeCache.txt" ] || generator=(-G "$GENERATOR")
    cmake -S "$src" -B "$bin" ${generator[@]+"${generator[@]}"} "$@"
}

cmake_build() {
    cmake --build "$1" --parallel "$JOBS"
}

# Builds libunikv (cargo, driven by the top-level CMakeLists.txt, in
# build/cargo) and installs the package into a fresh build/stage, so no file
# of an older install (another SONAME) lingers there.
build_and_stage() {
    cmake_configure "$ROOT" "$BUILD"
    cmake_build "$BUILD"
    rm -rf "$STAGE"
    cmake --install "$BUILD" --prefix "$STAGE"
}
