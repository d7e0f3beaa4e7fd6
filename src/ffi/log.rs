//! The optional diagnostics callback: plan choices and error messages, for a
//! caller's log. Process-wide; off until a callback is set.

use std::cell::Cell;
use std::ffi::CString;
use std::os::raw::{c_char, c_void};

use parking_lot::RwLock;

use crate::ffi::boundary::boundary;
use crate::ffi::status::unikv_status;

/// Severity of a diagnostics message (`unikv_log_fn`'s `level`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum unikv_log_level {
    /// A call failed: the message is the one `unikv_last_error_message`
    /// returns afterwards, prefixed by the status description.
    UNIKV_LOG_ERROR = 1,
    /// Reserved for conditions that do not fail a call.
    UNIKV_LOG_WARNING = 2,
    /// A decision worth recording, e.g. the launch configuration a plan
    /// chose (its `unikv_*_plan_describe` line).
    UNIKV_LOG_INFO = 3,
}

/// A diagnostics callback: `user` is the pointer given to
/// `unikv_set_log_callback`, `level` a `unikv_log_level`, `message` a
/// NUL-terminated line valid only during the call. It runs on the thread of
/// the call that produced the message, possibly on several threads at once;
/// it must return (no exceptions or longjmp across it). A unikv call made
/// from inside it does not log.
#[allow(non_camel_case_types)]
pub type unikv_log_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, level: u32, message: *const c_char)>;

#[derive(Clone, Copy)]
struct Logger {
    callback: unsafe extern "C" fn(*mut c_void, u32, *const c_char),
    user: usize,
}

static LOGGER: RwLock<Option<Logger>> = RwLock::new(None);

thread_local! {
    /// Set while this thread runs the callback, so a failing unikv call made
    /// from inside it does not log again.
    static IN_CALLBACK: Cell<bool> = const { Cell::new(false) };
}

/// Whether a callback is set (lets callers skip formatting a message).
pub fn enabled() -> bool {
    LOGGER.read().is_some()
}

/// Passes `message` to the callback, if one is set. Never called with a lock
/// held, so the callback may call `unikv_set_log_callback` itself.
pub fn emit(level: unikv_log_level, message: &str) {
    let Some(logger) = *LOGGER.read() else {
        return;
    };
    if IN_CALLBACK.with(|c| c.replace(true)) {
        return;
    }
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    // SAFETY: the caller registered this function for these arguments.
    unsafe { (logger.callback)(logger.user as *mut c_void, level as u32, text.as_ptr()) };
    IN_CALLBACK.with(|c| c.set(false));
}

/// Sets (or with NULL `callback`, removes) the process-wide diagnostics
/// callback, replacing any earlier one; `user` is passed back to it
/// unchanged. Off by default. Messages: UNIKV_LOG_INFO with the one-line
/// description of every decode and prefill plan created, and UNIKV_LOG_ERROR
/// with the message of every failing call (the status description, then the
/// text `unikv_last_error_message` returns). Messages are formatted only
/// while a callback is set, on plan creation and on errors, never on a
/// successful launch. A call already running on another thread may still
/// pass a message to the previous callback. Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_set_log_callback(
    callback: unikv_log_fn,
    user: *mut c_void,
) -> unikv_status {
    boundary(|| {
        *LOGGER.write() = callback.map(|callback| Logger {
            callback,
            user: user as usize,
        });
        Ok(())
    })
}
