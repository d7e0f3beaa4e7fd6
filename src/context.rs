//! The context: one backend bound to one device, shared by pools and plans.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::backend::{cpu::CpuBackend, Backend, BackendKind};
use crate::error::{ensure, err, Error, Result};

/// What the caller asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// The GPU backend when one is compiled in and a device is present, else CPU.
    Auto,
    Cpu,
    Cuda,
    Rocm,
    /// The GPU backend compiled into this build, on the requested device;
    /// BackendUnavailable (never the CPU fallback of `Auto`) when there is none.
    Gpu,
}

#[derive(Debug, Clone)]
pub struct ContextOptions {
    pub backend: BackendChoice,
    pub device: i32,
    /// CPU worker threads; 0 = one per available core.
    pub cpu_threads: usize,
    /// Synchronize and check every device-resident value before each launch.
    pub validate: bool,
}

#[derive(Debug)]
pub struct Context {
    backend: Box<dyn Backend>,
    device: i32,
    validate: bool,
    /// Set after a fatal error (a caught panic, a sticky GPU fault); every later
    /// operation on this context then fails with `InvalidState`.
    failed: AtomicBool,
}

impl Context {
    pub fn new(options: &ContextOptions) -> Result<Arc<Self>> {
        ensure!(
            options.device >= 0,
            OutOfRange,
            "device: {} is negative",
            options.device
        );
        let backend: Box<dyn Backend> = match options.backend {
            BackendChoice::Cpu => Box::new(CpuBackend::new(options.cpu_threads)?),
            BackendChoice::Auto => match gpu_backend(options.device, options.validate) {
                Ok(gpu) => gpu,
                // No driver or no device: the embedded default takes over.
                Err(Error::BackendUnavailable(_)) => {
                    Box::new(CpuBackend::new(options.cpu_threads)?)
                }
                Err(e) => return Err(e),
            },
            BackendChoice::Gpu => {
                gpu_backend(options.device, options.validate).map_err(|e| match e {
                    Error::BackendUnavailable(why) => err!(
                        BackendUnavailable,
                        "options.backend: UNIKV_BACKEND_GPU requires a GPU (AUTO would fall back to the CPU backend): {why}"
                    ),
                    e => e,
                })?
            }
            BackendChoice::Cuda if cfg!(feature = "cuda") => {
                gpu_backend(options.device, options.validate)?
            }
            BackendChoice::Rocm if cfg!(feature = "rocm") => {
                gpu_backend(options.device, options.validate)?
            }
            BackendChoice::Cuda => {
                return Err(err!(
                    BackendUnavailable,
                    "backend: CUDA was not compiled into this build of unikv (cargo feature `cuda`)"
                ))
            }
            BackendChoice::Rocm => {
                return Err(err!(
                    BackendUnavailable,
                    "backend: ROCm was not compiled into this build of unikv (cargo feature `rocm`)"
                ))
            }
        };
        Ok(Arc::new(Context {
            backend,
            device: options.device,
            validate: options.validate,
            failed: AtomicBool::new(false),
        }))
    }

    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    pub fn kind(&self) -> BackendKind {
        self.backend.kind()
    }

    pub fn device(&self) -> i32 {
        self.device
    }

    pub fn validate(&self) -> bool {
        self.validate
    }

    pub fn mark_failed(&self) {
        self.failed.store(true, Ordering::SeqCst);
    }

    /// Fails once the context has seen a fatal error.
    pub fn check_usable(&self) -> Result<()> {
        ensure!(
            !self.failed.load(Ordering::SeqCst) && self.backend.healthy(),
            InvalidState,
            "context: unusable after an earlier fatal error"
        );
        Ok(())
    }
}

/// The GPU backend on `device`, wrapped in `Validating` in validate mode.
#[cfg(unikv_gpu)]
fn gpu_backend(device: i32, validate: bool) -> Result<Box<dyn Backend>> {
    use crate::backend::{gpu::GpuBackend, validating::Validating};
    let gpu = GpuBackend::open(device)?;
    Ok(if validate {
        Box::new(Validating::new(gpu))
    } else {
        Box::new(gpu)
    })
}

#[cfg(not(unikv_gpu))]
fn gpu_backend(_device: i32, _validate: bool) -> Result<Box<dyn Backend>> {
    Err(err!(
        BackendUnavailable,
        "backend: no GPU backend was compiled into this build of unikv (cargo feature `cuda` or `rocm`)"
    ))
}
