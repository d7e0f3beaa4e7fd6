//! The panic and error boundary every exported function runs inside, plus the
//! helpers that turn C pointers into references.

use std::cell::{Cell, RefCell};
use std::ffi::CString;
use std::os::raw::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::context::Context;
use crate::error::{ensure, err, Result};
use crate::ffi::status::unikv_status;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    /// The context the current call works on, so a caught panic can mark it
    /// unusable. Only dereferenced while the call that set it is running.
    static CURRENT_CONTEXT: Cell<*const Context> = const { Cell::new(std::ptr::null()) };
}

fn set_last_error(message: String) {
    let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|slot| *slot.borrow_mut() = message);
}

/// Pointer to this thread's last error message (valid until the next failing
/// call on this thread).
pub fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|slot| slot.borrow().as_ptr())
}

/// Records the context a call operates on (see `CURRENT_CONTEXT`).
pub fn enter_context(ctx: &Context) {
    CURRENT_CONTEXT.with(|c| c.set(ctx as *const Context));
    #[cfg(feature = "test-hooks")]
    crate::ffi::test_hooks::maybe_panic();
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_string()
    }
}

/// Runs `body`, converting its error or panic into a status code and the
/// thread's last error message. A panic marks the current context unusable.
pub fn boundary(body: impl FnOnce() -> Result<()>) -> unikv_status {
    CURRENT_CONTEXT.with(|c| c.set(std::ptr::null()));
    let outcome = catch_unwind(AssertUnwindSafe(body));
    let error = match outcome {
        Ok(Ok(())) => return unikv_status::UNIKV_OK,
        Ok(Err(e)) => e,
        Err(payload) => {
            let ctx = CURRENT_CONTEXT.with(|c| c.replace(std::ptr::null()));
            if !ctx.is_null() {
                // SAFETY: set during this call from a live handle the caller still holds.
                unsafe { (*ctx).mark_failed() };
            }
            err!(
                Internal,
                "internal error (panic): {}",
                panic_message(payload.as_ref())
            )
        }
    };
    let status = unikv_status::from(&error);
    let message = error.to_string();
    if crate::ffi::log::enabled() {
        let description = String::from_utf8_lossy(status.description());
        let description = description.trim_end_matches('\0');
        crate::ffi::log::emit(
            crate::ffi::log::unikv_log_level::UNIKV_LOG_ERROR,
            &format!("{description}: {message}"),
        );
    }
    set_last_error(message);
    status
}

/// Writes an output value, failing with `NullArgument` on NULL.
///
/// # Safety
/// A non-NULL `ptr` is valid for writes.
pub unsafe fn write_out<T>(name: &str, ptr: *mut T, value: T) -> Result<()> {
    ensure!(!ptr.is_null(), NullArgument, "{name}");
    ptr.write(value);
    Ok(())
}

/// Parameter structs that begin with `size_t struct_size`.
///
/// # Safety
/// Implementors are `#[repr(C)]`, start with a `usize` field, and every bit
/// pattern of the remaining fields is valid (integers, raw pointers, floats).
pub unsafe trait Versioned: Copy {
    const NAME: &'static str;
    /// Size of the first released version of the struct.
    const MIN_SIZE: usize = std::mem::size_of::<Self>();
}

/// How far past its own size the library reads a newer caller's struct (to
/// check the unknown fields are zero): a garbage `struct_size` must not make
/// it read caller memory until a fault.
pub const MAX_UNKNOWN_BYTES: usize = 4096;

/// Reads a versioned input struct: fails on NULL and on a `struct_size` smaller
/// than the first version; a larger size is accepted only when the bytes this
/// version does not know are zero. Fields the caller's version lacks keep the
/// values of `defaults`.
///
/// # Safety
/// A non-NULL `ptr` is valid for `struct_size` bytes.
pub unsafe fn read_params<T: Versioned>(ptr: *const T, defaults: T) -> Result<T> {
    ensure!(!ptr.is_null(), NullArgument, "{}", T::NAME);
    let size = (ptr as *const usize).read_unaligned();
    let ours = std::mem::size_of::<T>();
    ensure!(
        size <= ours + MAX_UNKNOWN_BYTES,
        BadStructSize,
        "{}.struct_size: {size} is more than {MAX_UNKNOWN_BYTES} bytes past this library's {ours} (set it to sizeof(the struct))",
        T::NAME
    );
    ensure!(
        size >= T::MIN_SIZE,
        BadStructSize,
        "{}.struct_size: {size} is smaller than {} (set it to sizeof(the struct))",
        T::NAME,
        T::MIN_SIZE
    );
    if size > ours {
        let extra = std::slice::from_raw_parts((ptr as *const u8).add(ours), size - ours);
        ensure!(
            extra.iter().all(|b| *b == 0),
            BadStructSize,
            "{}.struct_size: {size} includes fields this library version ({}) does not know",
            T::NAME,
            env!("CARGO_PKG_VERSION")
        );
    }
    let mut value = defaults;
    std::ptr::copy_nonoverlapping(
        ptr as *const u8,
        &mut value as *mut T as *mut u8,
        size.min(ours),
    );
    Ok(value)
}

/// Writes a versioned output struct: the caller sets `struct_size`, and only
/// that many bytes (at most this version's size) are written.
///
/// # Safety
/// A non-NULL `ptr` is valid for `struct_size` bytes of writes.
pub unsafe fn write_info<T: Versioned>(ptr: *mut T, value: T) -> Result<()> {
    ensure!(!ptr.is_null(), NullArgument, "{}", T::NAME);
    let size = (ptr as *const usize).read_unaligned();
    ensure!(
        size >= std::mem::size_of::<usize>(),
        BadStructSize,
        "{}.struct_size: {size} is too small (set it to sizeof(the struct))",
        T::NAME
    );
    let n = size.min(std::mem::size_of::<T>());
    let bytes = std::slice::from_raw_parts(&value as *const T as *const u8, n);
    // Keep the caller's struct_size; fill the rest.
    let skip = std::mem::size_of::<usize>();
    std::ptr::copy_nonoverlapping(bytes[skip..].as_ptr(), (ptr as *mut u8).add(skip), n - skip);
    Ok(())
}
