//! Plan introspection: the launch configuration a decode or prefill plan
//! chose, as a struct and as a one-line description.

use std::os::raw::c_char;

use crate::args::attention::{KernelFamily, PlanKind};
use crate::error::{ensure, Result};
use crate::ffi::attention::{unikv_decode_plan, unikv_prefill_plan};
use crate::ffi::boundary::{boundary, enter_context, write_info, write_out, Versioned};
use crate::ffi::context::backend_value;
use crate::ffi::handles::handle;
use crate::ffi::log::{self, unikv_log_level};
use crate::ffi::status::unikv_status;
use crate::plan::AttentionPlan;

/// The kernel family of a plan (`unikv_plan_info.kernel_family`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum unikv_kernel_family {
    /// The CPU backend's reference computation (work items of 16 heads).
    UNIKV_KERNEL_CPU_REFERENCE = 1,
    /// The mma.sync tensor-core kernel (NVIDIA sm_80 and newer).
    UNIKV_KERNEL_MMA = 2,
    /// The sm_90a warpgroup-MMA kernel with 64-head blocks (heads on M).
    UNIKV_KERNEL_WGMMA_HEADS_ON_M = 3,
    /// The sm_90a warpgroup-MMA kernels with 16- or 32-head blocks (heads on N).
    UNIKV_KERNEL_WGMMA_HEADS_ON_N = 4,
    /// The portable kernel on CUDA cores / SIMD units (HIP builds).
    UNIKV_KERNEL_PORTABLE_SCALAR = 5,
    /// The portable kernel on matrix cores (HIP builds with MFMA).
    UNIKV_KERNEL_PORTABLE_MATRIX = 6,
}

/// Kind of a plan (`unikv_plan_info.kind`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum unikv_plan_kind {
    UNIKV_PLAN_DECODE = 1,
    UNIKV_PLAN_PREFILL = 2,
}

/// The launch configuration a plan chose (`unikv_decode_plan_get_info`,
/// `unikv_prefill_plan_get_info`). Fixed at plan creation: every launch
/// through the plan uses it (a kernel with a raw FP8 variant picks it per call
/// from its key sources, see `raw_fp8_variant`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_plan_info {
    /// sizeof(unikv_plan_info), set by the caller.
    pub struct_size: usize,
    /// A `unikv_plan_kind`.
    pub kind: u32,
    /// The `unikv_backend` of the plan's context (never AUTO or GPU).
    pub backend: u32,
    /// A `unikv_kernel_family`.
    pub kernel_family: u32,
    /// The most tokens one call through the plan may carry (capture-time shape).
    pub max_tokens: u32,
    /// The query heads the plan was made for (capture-time shape).
    pub num_heads: u32,
    /// The `unikv_dtype` of the pool the plan reads.
    pub kv_dtype: u32,
    /// Heads one thread block (CPU: one work item) computes.
    pub head_block: u32,
    /// Blocks per token along the heads: ceil(num_heads / head_block).
    pub head_blocks: u32,
    /// Most key splits per (token, head block) of calls that do not take
    /// `long_key_splits`; 1 when those keys are never split. A token's split
    /// count depends on its length, the plan and (through `long_keys`) the
    /// call's index capacity only.
    pub max_splits: u32,
    /// 1 when the `max_splits` splits of a token merge inside a thread-block
    /// cluster (sm_90+; no combine launch), 0 when they merge through the
    /// workspace and a combine kernel (or there is one split).
    pub cluster_merge: u32,
    /// Key-tile pipeline stages of the kernel instantiation (0 on the CPU).
    pub stages: u32,
    /// 1 when the combine kernel is launched early (programmatic dependent
    /// launch, sm_90+).
    pub dependent_launch: u32,
    /// 1 for FP8 plans whose kernel has a raw variant (stored FP8 rows kept
    /// in shared memory), taken by calls whose every key source is an
    /// e4m3fn pool, or every one an e4m3fn FlashMLA cache; other calls take
    /// the in-tile dequantizing instantiation.
    pub raw_fp8_variant: u32,
    /// Multiprocessors the split count was sized for (0 on the CPU).
    pub sm_count: u32,
    /// Bytes of workspace every launch needs (as `*_plan_workspace_size`).
    pub workspace_bytes: u64,
    /// Key splits per (token, head block) of calls with long key lists,
    /// merged through the workspace and a combine kernel (sm_90+ cluster
    /// plans whose clusters cap the split count for few tokens); 0 when the
    /// plan has none and every call takes `max_splits`.
    pub long_key_splits: u32,
    /// The index capacity per token (summed over the call's key sources,
    /// divided by `num_tokens`) from which a call takes `long_key_splits`;
    /// 0 with `long_key_splits` set: every call does.
    pub long_keys: u32,
}

unsafe impl Versioned for unikv_plan_info {
    const NAME: &'static str = "info";
}

fn family_value(family: KernelFamily) -> unikv_kernel_family {
    use unikv_kernel_family::*;
    match family {
        KernelFamily::CpuReference => UNIKV_KERNEL_CPU_REFERENCE,
        KernelFamily::Mma => UNIKV_KERNEL_MMA,
        KernelFamily::WgmmaHeadsOnM => UNIKV_KERNEL_WGMMA_HEADS_ON_M,
        KernelFamily::WgmmaHeadsOnN => UNIKV_KERNEL_WGMMA_HEADS_ON_N,
        KernelFamily::PortableScalar => UNIKV_KERNEL_PORTABLE_SCALAR,
        KernelFamily::PortableMatrix => UNIKV_KERNEL_PORTABLE_MATRIX,
    }
}

fn family_name(family: KernelFamily) -> &'static str {
    match family {
        KernelFamily::CpuReference => "cpu-reference",
        KernelFamily::Mma => "mma",
        KernelFamily::WgmmaHeadsOnM => "wgmma-heads-on-m",
        KernelFamily::WgmmaHeadsOnN => "wgmma-heads-on-n",
        KernelFamily::PortableScalar => "portable-scalar",
        KernelFamily::PortableMatrix => "portable-matrix",
    }
}

/// The struct `unikv_*_plan_get_info` reports.
pub fn plan_info(plan: &AttentionPlan) -> unikv_plan_info {
    let shape = plan.shape();
    let s = plan.launch().summary;
    unikv_plan_info {
        struct_size: std::mem::size_of::<unikv_plan_info>(),
        kind: match shape.kind {
            PlanKind::Decode => unikv_plan_kind::UNIKV_PLAN_DECODE,
            PlanKind::Prefill => unikv_plan_kind::UNIKV_PLAN_PREFILL,
        } as u32,
        backend: backend_value(plan.context().kind()) as u32,
        kernel_family: family_value(s.family) as u32,
        max_tokens: shape.max_tokens as u32,
        num_heads: shape.num_heads as u32,
        kv_dtype: shape.kv_dtype.to_raw(),
        head_block: s.head_block as u32,
        head_blocks: s.head_blocks as u32,
        max_splits: s.max_splits as u32,
        cluster_merge: s.cluster_merge as u32,
        stages: s.stages as u32,
        dependent_launch: s.dependent_launch as u32,
        raw_fp8_variant: s.raw_fp8_variant as u32,
        sm_count: s.sm_count as u32,
        workspace_bytes: plan.workspace_bytes() as u64,
        long_key_splits: s.long_splits as u32,
        long_keys: s.long_keys as u32,
    }
}

/// The one-line description `unikv_*_plan_describe` writes, e.g.
/// "decode plan: cuda, mma kernel, 2 blocks of 64 heads (128 heads), up to 8
/// splits merged in a cluster, 2 stages, 0 workspace bytes, max_tokens 64,
/// kv bf16".
pub fn describe(plan: &AttentionPlan) -> String {
    let shape = plan.shape();
    let s = plan.launch().summary;
    let kind = match shape.kind {
        PlanKind::Decode => "decode",
        PlanKind::Prefill => "prefill",
    };
    let backend = format!("{:?}", plan.context().kind()).to_lowercase();
    let mut splits = match (s.max_splits, s.cluster_merge) {
        (1, _) => "no key splits".to_string(),
        (n, true) => format!("up to {n} key splits merged in a cluster"),
        (n, false) => format!("up to {n} key splits merged by a combine kernel"),
    };
    match (s.long_splits, s.long_keys) {
        (0, _) => {}
        (n, 0) => splits = format!("up to {n} key splits merged by a combine kernel"),
        (n, keys) => {
            splits += &format!(" (from {keys} keys a token: up to {n} merged by a combine kernel)")
        }
    }
    let mut line = format!(
        "{kind} plan: {backend}, {} kernel{}, {} block{} of {} heads ({} heads), {splits}",
        family_name(s.family),
        if s.raw_fp8_variant {
            " (raw FP8 variant for e4m3fn pools)"
        } else {
            ""
        },
        s.head_blocks,
        if s.head_blocks == 1 { "" } else { "s" },
        s.head_block,
        shape.num_heads,
    );
    if s.stages > 0 {
        line += &format!(
            ", {} stage{}",
            s.stages,
            if s.stages == 1 { "" } else { "s" }
        );
    }
    if s.dependent_launch {
        line += ", dependent launch";
    }
    if s.sm_count > 0 {
        line += &format!(", {} SMs", s.sm_count);
    }
    line += &format!(
        ", {} workspace bytes, max_tokens {}, kv {}",
        plan.workspace_bytes(),
        shape.max_tokens,
        shape.kv_dtype.name()
    );
    line
}

/// Logs a new plan's description (UNIKV_LOG_INFO) when a callback is set.
pub fn log_plan(plan: &AttentionPlan) {
    if log::enabled() {
        log::emit(unikv_log_level::UNIKV_LOG_INFO, &describe(plan));
    }
}

/// snprintf-like: writes at most `size - 1` bytes of `text` and a NUL into
/// `buf`, and the full length into `*length` when it is not NULL.
unsafe fn write_text(text: &str, buf: *mut c_char, size: usize, length: *mut usize) -> Result<()> {
    ensure!(!buf.is_null() || size == 0, NullArgument, "buf");
    if !length.is_null() {
        write_out("length", length, text.len())?;
    }
    if size > 0 {
        let n = text.len().min(size - 1);
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
    }
    Ok(())
}

fn entered(plan: &AttentionPlan) -> &AttentionPlan {
    enter_context(plan.context());
    plan
}

/// Fills `info` (host memory; set `info->struct_size` first) with the launch
/// configuration the decode plan chose: kernel family, head block, split cap,
/// cluster merge, stages, workspace. Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_decode_plan_get_info(
    plan: *const unikv_decode_plan,
    info: *mut unikv_plan_info,
) -> unikv_status {
    boundary(|| {
        let plan = entered(&handle("plan", plan)?.inner);
        write_info(info, plan_info(plan))
    })
}

/// The prefill plan's launch configuration; see `unikv_decode_plan_get_info`.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_prefill_plan_get_info(
    plan: *const unikv_prefill_plan,
    info: *mut unikv_plan_info,
) -> unikv_status {
    boundary(|| {
        let plan = entered(&handle("plan", plan)?.inner);
        write_info(info, plan_info(plan))
    })
}

/// Writes a one-line, human-readable description of the decode plan's
/// launch configuration (the fields of `unikv_plan_info` in words; the
/// wording may change between versions, parse the struct instead) into `buf`
/// like snprintf: at most `size - 1` bytes and a terminating NUL (nothing
/// when `size` is 0; `buf` may then be NULL). `*length`, when `length` is not
/// NULL, receives the description's full length without the NUL, so a result
/// with `*length >= size` was truncated. Host memory. Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_decode_plan_describe(
    plan: *const unikv_decode_plan,
    buf: *mut c_char,
    size: usize,
    length: *mut usize,
) -> unikv_status {
    boundary(|| {
        let plan = entered(&handle("plan", plan)?.inner);
        write_text(&describe(plan), buf, size, length)
    })
}

/// The prefill plan's description; see `unikv_decode_plan_describe`.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_prefill_plan_describe(
    plan: *const unikv_prefill_plan,
    buf: *mut c_char,
    size: usize,
    length: *mut usize,
) -> unikv_status {
    boundary(|| {
        let plan = entered(&handle("plan", plan)?.inner);
        write_text(&describe(plan), buf, size, length)
    })
}
