//! Test-only hooks (feature `test-hooks`, never in release builds).

use std::sync::atomic::{AtomicBool, Ordering};

static PANIC_NEXT: AtomicBool = AtomicBool::new(false);

/// Makes the next entry point that reaches a handle's context panic there,
/// inside the boundary.
pub fn arm_panic() {
    PANIC_NEXT.store(true, Ordering::SeqCst);
}

pub(crate) fn maybe_panic() {
    if PANIC_NEXT.swap(false, Ordering::SeqCst) {
        panic!("forced by unikv::ffi::test_hooks::arm_panic");
    }
}
