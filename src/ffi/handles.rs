//! Handle registry: every handle this library returns is recorded with its
//! kind until it is destroyed, and every entry point looks a handle up before
//! dereferencing it. So a destroyed handle, a double destroy, a handle of the
//! wrong kind and a pointer the library never returned are all reported
//! (`UNIKV_INVALID_HANDLE`) without touching the memory they point to.
//!
//! Not detected: a destroyed handle whose address the allocator has since
//! given to a new handle of the same kind (it then names the new object), and
//! a handle destroyed by one thread while another thread's call is using it
//! (destroy is externally synchronized).

use std::collections::BTreeMap;

use parking_lot::RwLock;

use crate::error::{err, Result};

/// Live handles by address, with the kind each was created as. Lookups take
/// the read lock, so concurrent calls do not serialize on it.
static LIVE: RwLock<BTreeMap<usize, &'static str>> = RwLock::new(BTreeMap::new());

/// The objects behind the C ABI's opaque handle types.
pub trait Handle: Sized + 'static {
    /// The C type name, used in messages and as the registry's kind tag.
    const KIND: &'static str;
}

/// Boxes `value`, registers it, and returns the handle for the caller.
pub fn new_handle<T: Handle>(value: T) -> *mut T {
    let ptr = Box::into_raw(Box::new(value));
    LIVE.write().insert(ptr as usize, T::KIND);
    ptr
}

fn check<T: Handle>(name: &str, ptr: *const T, kind: Option<&'static str>) -> Result<()> {
    match kind {
        Some(kind) if kind == T::KIND => Ok(()),
        Some(kind) => Err(err!(
            InvalidHandle,
            "{name}: {ptr:p} is a {kind}, expected a {}",
            T::KIND
        )),
        None => Err(err!(
            InvalidHandle,
            "{name}: {ptr:p} is not a live {} (already destroyed, or not created by unikv)",
            T::KIND
        )),
    }
}

/// Dereferences a handle after checking that it is live and of kind `T`:
/// NULL is `NullArgument`, anything else unknown is `InvalidHandle`.
///
/// # Safety
/// No other thread destroys the handle while the returned reference is used.
pub unsafe fn handle<'a, T: Handle>(name: &str, ptr: *const T) -> Result<&'a T> {
    if ptr.is_null() {
        return Err(err!(NullArgument, "{name}"));
    }
    check(name, ptr, LIVE.read().get(&(ptr as usize)).copied())?;
    // SAFETY: registered by `new_handle` and not yet destroyed.
    Ok(&*ptr)
}

/// Unregisters and drops a handle. NULL is accepted; a pointer that is not a
/// live handle of kind `T` is left alone and reported as `InvalidHandle`.
///
/// # Safety
/// No other thread is using the handle.
pub unsafe fn destroy_handle<T: Handle>(name: &str, ptr: *mut T) -> Result<()> {
    if ptr.is_null() {
        return Ok(());
    }
    {
        let mut live = LIVE.write();
        check(name, ptr, live.get(&(ptr as usize)).copied())?;
        live.remove(&(ptr as usize));
    }
    // SAFETY: created by `new_handle` (Box::into_raw) and now unregistered,
    // so no later lookup can reach it.
    drop(Box::from_raw(ptr));
    Ok(())
}
