//! The C ABI: the only `extern "C"` surface. Each file mirrors one topic of the
//! public header and converts C arguments into core calls; no domain logic here.
//!
//! Conventions: every fallible function returns a `unikv_status` and records a
//! thread-local message naming the offending argument; nothing is written on
//! error; panics never cross the boundary; an output may not overlap another
//! argument except as exact in-place use a function allows (`ops::aliasing`).
//! The header's preamble (tests/header.rs) states them for C callers.

// Every extern function's safety contract is its header documentation (valid
// handles, pointers valid for the sizes described), stated once per function there.
#![allow(clippy::missing_safety_doc)]

// Declared in the order the header presents them.
pub mod capabilities;
pub mod log;
pub mod status;
pub mod types;
pub mod version;
// Lifecycle and memory.
pub mod context;
pub mod pool;
pub mod sizes;
// Operations of one serving step.
pub mod attention;
pub mod cache_store;
pub mod compressor;
pub mod index;
pub mod indexer;
pub mod introspect;
pub mod prepare;
pub mod rope;
pub mod routing;
pub mod store;
// Internals.
pub mod boundary;
pub mod handles;
#[cfg(feature = "test-hooks")]
pub mod test_hooks;

use std::os::raw::c_char;

use status::unikv_status;

/// A static, NUL-terminated description of a status code ("unknown status" for
/// values not in `unikv_status`). Never NULL; do not free. Thread-safe.
#[no_mangle]
pub extern "C" fn unikv_status_string(status: u32) -> *const c_char {
    let text = unikv_status::ALL
        .iter()
        .find(|s| **s as u32 == status)
        .map_or(&b"unknown status\0"[..], |s| s.description());
    text.as_ptr() as *const c_char
}

/// The message of the last failing call on the calling thread, naming the
/// argument at fault ("" before any failure). Valid until the next failing call
/// on this thread; do not free. Thread-safe (thread-local).
#[no_mangle]
pub extern "C" fn unikv_last_error_message() -> *const c_char {
    boundary::last_error_ptr()
}
