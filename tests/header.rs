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
        r#"/*
 * unikv: DeepSeek-V4 sparse attention over a unified KV pool.
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
 *   A struct_size more than 4096 bytes past the library's own size is
 *   UNIKV_BAD_STRUCT_SIZE without reading past it; bytes past the library's
 *   size must be zero.
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
 */

#define UNIKV_VERSION_MAJOR {major}
#define UNIKV_VERSION_MINOR {minor}
#define UNIKV_VERSION_PATCH {patch}
#define UNIKV_VERSION_STRING "{major}.{minor}.{patch}"
/* major * 1000000 + minor * 1000 + patch; compare with unikv_version(). */
#define UNIKV_VERSION {packed}

#if defined(__cplusplus) && __cplusplus >= 201703L
#define UNIKV_NODISCARD [[nodiscard]]
#elif defined(__GNUC__) || defined(__clang__)
#define UNIKV_NODISCARD __attribute__((warn_unused_result))
#else
#define UNIKV_NODISCARD
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
    String::from_utf8(out).unwrap()
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
