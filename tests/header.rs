//! The checked-in C header must equal a fresh cbindgen generation, and its
//! version macros must match the crate version. `UNIKV_UPDATE_HEADER=1` rewrites
//! the checked-in header instead (scripts/update-header.sh).

use std::path::Path;

fn preamble() -> String {
    let (major, minor, patch) = (
        env!("CARGO_PKG_VERSION_MAJOR"),
        env!("CARGO_PKG_VERSION_MINOR"),
        env!("CARGO_PKG_VERSION_PATCH"),
    );
    let packed = unikv::ffi::version::packed(
        major.parse().unwrap(),
        minor.parse().unwrap(),
        patch.parse().unwrap(),
    );
    format!(
        r#"/**
 * @file unikv.h
 * @brief unikv: DeepSeek-V4 sparse attention over a unified KV pool.
 *
 * The domain (pool layout, index streams, attention math, FP8 formats, the
 * serving step) is described in the repository's docs/ folder.
 *
 * Conventions (apply to every function below):
 * - Fallible functions return a unikv_status (UNIKV_OK = 0). On failure nothing
 *   is written to any output, and unikv_last_error_message() names the argument
 *   at fault. No C++ exception or Rust panic ever crosses this boundary; an
 *   internal failure returns UNIKV_INTERNAL and makes the context unusable.
 * - Handles are opaque; each *_create has a *_destroy that accepts NULL.
 *   Every call checks its handles against a registry of live ones before
 *   touching them: a destroyed handle, a second destroy, a handle of another
 *   kind or a pointer unikv never returned gives UNIKV_INVALID_HANDLE (destroy
 *   functions ignore it and set the last error). Undefined still: a destroyed
 *   handle whose address a new handle of the same kind has taken, and
 *   destroying a handle while another thread's call uses it.
 * - Parameter and argument structs start with `size_t struct_size`: set it to
 *   sizeof(the struct). Info structs filled by the library also read it first.
 *   A struct_size more than UNIKV_MAX_UNKNOWN_BYTES past the library's own
 *   size is UNIKV_BAD_STRUCT_SIZE without reading past it; bytes past the
 *   library's size must be zero.
 * - Enum inputs are uint32_t and range-checked (UNIKV_BAD_ENUM).
 * - Tensors (unikv_tensor) are row-major with innermost stride 1; strides are
 *   in elements. Tensor data lives in the context's memory: host memory on the
 *   CPU backend, device memory on GPU backends. Argument structs themselves are
 *   host memory, read during the call only.
 * - `stream` is a cudaStream_t / hipStream_t passed as void* (NULL = default
 *   stream). Launches never allocate, synchronize or read device memory on the
 *   host, so they can be captured in CUDA graphs. The CPU backend runs
 *   synchronously and ignores streams.
 * - Values that live in device memory (indices, indptrs, positions, slots) are
 *   fully checked on the CPU backend (UNIKV_OUT_OF_RANGE, nothing written). GPU
 *   backends never access memory out of bounds whatever those values are, and
 *   check them precisely when the context was created with `validate`.
 * - Token-indexed tensors may be longer than `num_tokens` (buffers sized for a
 *   capture-time maximum); only the first num_tokens entries are used.
 * - No output may share memory with another argument of the call or with the
 *   pool rows it reads or writes (UNIKV_OVERLAPPING_BUFFERS), except exact
 *   in-place use where a function allows it: the same data pointer, dtype,
 *   shape and strides as the input the output replaces.
 * - The header compiles as C99, C11, C17 and C2x and as C++11 to C++2b, with
 *   -Wall -Wextra -pedantic -Wc++-compat (cpp-tests/CMakeLists.txt).
 */

/** Major version of this header (incompatible ABI changes). */
#define UNIKV_VERSION_MAJOR {major}
/** Minor version of this header (compatible additions). */
#define UNIKV_VERSION_MINOR {minor}
/** Patch version of this header (fixes only). */
#define UNIKV_VERSION_PATCH {patch}
/** The version of this header as "MAJOR.MINOR.PATCH"; compare with unikv_version_string(). */
#define UNIKV_VERSION_STRING "{major}.{minor}.{patch}"
/** major * 1000000 + minor * 1000 + patch; compare with unikv_version(). */
#define UNIKV_VERSION {packed}

/**
 * @def UNIKV_NODISCARD
 * Marks the functions whose unikv_status must not be ignored. It expands to
 * an attribute only where a `(void)` cast silences it, so callers that
 * deliberately drop a status compile cleanly under -Werror:
 * - C++17 and later, and C2x/C23 compilers that have it: `[[nodiscard]]`;
 * - clang in older modes: `__attribute__((warn_unused_result))`;
 * - nothing otherwise. GCC's `warn_unused_result` is not silenced by a cast,
 *   so C before C2x and C++11/14 compiled with GCC get no attribute.
 * Define UNIKV_NODISCARD before including the header to choose another
 * expansion (for example empty).
 */
#ifndef UNIKV_NODISCARD
#if defined(__cplusplus)
#if __cplusplus >= 201703L
#define UNIKV_NODISCARD [[nodiscard]]
#elif defined(__clang__)
#define UNIKV_NODISCARD __attribute__((warn_unused_result))
#endif
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ > 201710L && defined(__has_c_attribute)
#if __has_c_attribute(nodiscard)
#define UNIKV_NODISCARD [[nodiscard]]
#endif
#endif
#if !defined(UNIKV_NODISCARD) && defined(__clang__)
#define UNIKV_NODISCARD __attribute__((warn_unused_result))
#endif
#ifndef UNIKV_NODISCARD
#define UNIKV_NODISCARD
#endif
#endif"#
    )
}

fn generate(root: &Path) -> String {
    let mut config = cbindgen::Config::from_file(root.join("cbindgen.toml")).unwrap();
    config.after_includes = Some(preamble());
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(root.join("src/ffi/mod.rs"))
        .generate()
        .expect("cbindgen failed")
        .write(&mut out);
    let header = untag_c_enums(&String::from_utf8(out).unwrap());
    // cbindgen names an enum's associated constant `<enum>_<NAME>` and offers
    // no rename for it; every macro of the header is upper-case UNIKV_*.
    header.replace("#define unikv_status_ALL ", "#define UNIKV_STATUS_ALL ")
}

/// cbindgen declares each `repr(u32)` enum as `enum X` (typed `: uint32_t` in
/// C++ and C23) and, in C before C23, also `typedef uint32_t X;`. A tag and a
/// typedef of one name but different types is invalid C++, which
/// `gcc -Wc++-compat` reports. Before C23 the enum is therefore left without
/// a tag: its values are plain constants and `X` names only the uint32_t
/// typedef, as the signatures use it. C++ and C23 keep `enum X : uint32_t`.
/// The typedef gets a documentation comment of its own.
fn untag_c_enums(header: &str) -> String {
    const COND: &str = "defined(__cplusplus) || __STDC_VERSION__ >= 202311L";
    let typed = format!("\n#if {COND}\n  : uint32_t\n#endif // {COND}\n {{\n");
    let mut out = String::new();
    let mut rest = header;
    while let Some(i) = rest.find(&typed) {
        let head = &rest[..i];
        let line = head.rfind('\n').map_or(0, |j| j + 1);
        let name = head[line..]
            .strip_prefix("enum ")
            .expect("an enum declaration");
        out.push_str(&head[..line]);
        out.push_str(&format!(
            "#if {COND}\nenum {name} : uint32_t\n#else\nenum\n#endif\n{{\n"
        ));
        rest = &rest[i + typed.len()..];
        let typedef = "#ifndef __cplusplus\n";
        let t = rest.find(typedef).expect("the enum's typedef");
        out.push_str(&rest[..t]);
        out.push_str(&format!(
            "/** The C type of `{name}` values: uint32_t before C23, the enum in C23 and C++. */\n"
        ));
        rest = &rest[t..];
    }
    out.push_str(rest);
    out
}

#[test]
fn header_is_fresh() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fresh = generate(root);
    let dir = std::env::temp_dir().join(format!("unikv-header-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("unikv.h"), &fresh).unwrap();
    let checked_in = root.join("include/unikv.h");
    if std::env::var_os("UNIKV_UPDATE_HEADER").is_some() {
        std::fs::write(&checked_in, &fresh).unwrap();
    }
    let current = std::fs::read_to_string(&checked_in).unwrap_or_default();
    assert!(
        current == fresh,
        "include/unikv.h is stale; the fresh one is at {}. Run scripts/update-header.sh",
        dir.join("unikv.h").display()
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn version_macros_match_the_library() {
    let header =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("include/unikv.h"))
            .unwrap();
    let macro_value = |name: &str| -> String {
        let prefix = format!("#define {name} ");
        header
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("{name} missing"))
            .trim()
            .to_string()
    };
    let major: u32 = macro_value("UNIKV_VERSION_MAJOR").parse().unwrap();
    let minor: u32 = macro_value("UNIKV_VERSION_MINOR").parse().unwrap();
    let patch: u32 = macro_value("UNIKV_VERSION_PATCH").parse().unwrap();
    let packed: u32 = macro_value("UNIKV_VERSION").parse().unwrap();
    assert_eq!(packed, unikv::ffi::version::unikv_version());
    assert_eq!(packed, major * 1_000_000 + minor * 1_000 + patch);
    let string = unsafe { std::ffi::CStr::from_ptr(unikv::ffi::version::unikv_version_string()) };
    assert_eq!(
        macro_value("UNIKV_VERSION_STRING"),
        format!("\"{}\"", string.to_str().unwrap())
    );
    assert_eq!(string.to_str().unwrap(), format!("{major}.{minor}.{patch}"));
}
