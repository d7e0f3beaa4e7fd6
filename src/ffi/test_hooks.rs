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
#[cfg(unikv_gpu)]
pub fn gpu_plan_fallbacks(no_cluster: bool, no_wgmma: bool) {
    // SAFETY: sets two thread-local flags in the kernel shim.
    unsafe {
        crate::backend::gpu::shim::unikv_gpu_test_plan_fallbacks(no_cluster.into(), no_wgmma.into())
    }
}

/// The attention kernel a test forces on GPU plans (gpu_plan_portable).
#[cfg(unikv_gpu)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortableKernel {
    /// The plan's own choice.
    Off = 0,
    /// The portable kernel without matrix instructions.
    Scalar = 1,
    /// The portable kernel on 16x16x16 matrix products (MFMA on CDNA; on
    /// NVIDIA the software model of that instruction).
    Matrix = 2,
}

/// Makes GPU attention plans created afterwards on this thread use a variant
/// of the portable kernel (the HIP build's kernels), so an NVIDIA run checks
/// both against the CPU backend.
#[cfg(unikv_gpu)]
pub fn gpu_plan_portable(kernel: PortableKernel) {
    // SAFETY: sets a thread-local value in the kernel shim.
    unsafe { crate::backend::gpu::shim::unikv_gpu_test_plan_portable(kernel as std::ffi::c_int) }
}

/// The indexer score kernel a test forces (gpu_indexer_score_kernel).
#[cfg(unikv_gpu)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexerScoreKernel {
    /// The launch's own choice: FP8 wgmma on sm_90a for e4m3fn, f16 mma.sync
    /// on other NVIDIA GPUs and formats, CUDA cores on HIP.
    Auto = 0,
    /// The CUDA-core kernel (the HIP build's).
    CudaCores = 1,
    /// The f16 mma.sync kernel (sm_80+).
    MmaSync = 2,
}

/// Makes indexer scores computed afterwards on this thread use `kernel`, so
/// an NVIDIA run checks every score kernel.
#[cfg(unikv_gpu)]
pub fn gpu_indexer_score_kernel(kernel: IndexerScoreKernel) {
    // SAFETY: sets a thread-local value in the kernel shim.
    unsafe {
        crate::backend::gpu::shim::unikv_gpu_test_indexer_score_kernel(kernel as std::ffi::c_int)
    }
}

/// Runs the device FP8 codec (kernels/fp8.cuh) on device 0 over `n` values at
/// `x`, writing the software codes, the hardware-or-software pair codes, the
/// UE8M0 bytes of |x| and the 256 decoded codes, all device buffers; waits for
/// the default stream. `format`: 0 e4m3fn, 1 e4m3fnuz.
///
/// # Safety
/// Every pointer must be a device allocation of device 0 large enough for `n`
/// values (256 for `decoded`).
#[cfg(unikv_gpu)]
pub unsafe fn gpu_fp8_check(
    x: *const f32,
    n: usize,
    format: u32,
    out: [*mut u8; 3],
    decoded: *mut f32,
) -> Result<(), String> {
    use crate::backend::gpu::shim;
    let params = shim::Fp8CheckParams {
        x,
        sw: out[0],
        hw: out[1],
        scale: out[2],
        decoded,
        n: n as i64,
        format,
        reserved: 0,
    };
    let null = std::ptr::null_mut();
    // SAFETY: the caller passes device buffers of the sizes above.
    let status = unsafe {
        match shim::unikv_gpu_fp8_check(0, &params, null) {
            0 => shim::unikv_gpu_stream_synchronize(0, null),
            s => s,
        }
    };
    if status == 0 {
        Ok(())
    } else {
        // SAFETY: the shim's thread-local message is a valid C string.
        let msg = unsafe { std::ffi::CStr::from_ptr(shim::unikv_gpu_last_error()) };
        Err(format!(
            "fp8 check failed ({status}): {}",
            msg.to_string_lossy()
        ))
    }
}
