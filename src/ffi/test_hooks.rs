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

/// Makes GPU attention plans created afterwards on this thread take the paths
/// that GPUs without thread-block clusters or wgmma take (the workspace and
/// combine kernel; the mma.sync kernel), so one H200 run covers them too.
#[cfg(feature = "cuda")]
pub fn gpu_plan_fallbacks(no_cluster: bool, no_wgmma: bool) {
    // SAFETY: sets two thread-local flags in the kernel shim.
    unsafe {
        crate::backend::gpu::shim::unikv_gpu_test_plan_fallbacks(no_cluster.into(), no_wgmma.into())
    }
}
