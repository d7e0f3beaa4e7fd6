//! Runtime version, matching the header's `UNIKV_VERSION*` macros.

use std::os::raw::c_char;

const fn parse(s: &str) -> u32 {
    let bytes = s.as_bytes();
    let mut value = 0u32;
    let mut i = 0;
    while i < bytes.len() {
        value = value * 10 + (bytes[i] - b'0') as u32;
        i += 1;
    }
    value
}

pub const MAJOR: u32 = parse(env!("CARGO_PKG_VERSION_MAJOR"));
pub const MINOR: u32 = parse(env!("CARGO_PKG_VERSION_MINOR"));
pub const PATCH: u32 = parse(env!("CARGO_PKG_VERSION_PATCH"));

/// The packed form used by `UNIKV_VERSION`: major * 1000000 + minor * 1000 + patch.
pub const fn packed(major: u32, minor: u32, patch: u32) -> u32 {
    major * 1_000_000 + minor * 1_000 + patch
}

/// The library's version packed as major * 1000000 + minor * 1000 + patch;
/// compare with `UNIKV_VERSION` to detect a header/library mismatch. Thread-safe.
#[no_mangle]
pub extern "C" fn unikv_version() -> u32 {
    packed(MAJOR, MINOR, PATCH)
}

/// The library's version as "MAJOR.MINOR.PATCH". Static; do not free. Thread-safe.
#[no_mangle]
pub extern "C" fn unikv_version_string() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char
}
