//! Attention plans and the sparse decode / prefill entry points.

use std::os::raw::c_void;

use crate::args::attention::{PlanKind, PlanShape, Workspace};
use crate::backend::Stream;
use crate::dtype::DType;
use crate::error::{ensure, Result};
use crate::ffi::boundary::{boundary, enter_context, read_params, write_out, Versioned};
use crate::ffi::context::{context, unikv_context};
use crate::ffi::handles::{destroy_handle, handle, new_handle, Handle};
use crate::ffi::pool::{pool_of, unikv_pool};
use crate::ffi::status::unikv_status;
use crate::ffi::types::unikv_tensor;
use crate::ops::attention::{self, AttentionRaw, ExtendRaw, InverseRopeRaw};
use crate::ops::merge::{self, MergeRaw};
use crate::plan::AttentionPlan;

/// Opaque decode plan: launch configuration for capture-time shapes. Immutable
/// after creation; thread-safe (concurrent launches need distinct workspaces).
#[allow(non_camel_case_types)]
pub struct unikv_decode_plan {
    pub(crate) inner: AttentionPlan,
}

impl Handle for unikv_decode_plan {
    const KIND: &'static str = "unikv_decode_plan";
}

/// Opaque prefill plan; same rules as `unikv_decode_plan`.
#[allow(non_camel_case_types)]
pub struct unikv_prefill_plan {
    pub(crate) inner: AttentionPlan,
}

impl Handle for unikv_prefill_plan {
    const KIND: &'static str = "unikv_prefill_plan";
}

/// Capture-time shapes of an attention plan.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_attention_plan_params {
    /// sizeof(unikv_attention_plan_params).
    pub struct_size: usize,
    /// Largest `num_tokens` any launch through this plan will pass.
    pub max_tokens: u32,
    /// Local query heads H, 1..=128.
    pub num_heads: u32,
    /// Latent width; must be 512.
    pub head_dim: u32,
    /// `unikv_dtype` of q: UNIKV_DTYPE_BF16.
    pub q_dtype: u32,
    /// The pool's `kv_dtype` (bf16 or an FP8 flavour); a launch on a pool of
    /// another dtype is UNIKV_BAD_DTYPE.
    pub kv_dtype: u32,
    /// `unikv_dtype` of out: UNIKV_DTYPE_BF16.
    pub out_dtype: u32,
}

unsafe impl Versioned for unikv_attention_plan_params {
    const NAME: &'static str = "params";
}

/// Arguments of `unikv_sparse_decode` (docs/attention.md §1).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_decode_args {
    /// sizeof(unikv_decode_args).
    pub struct_size: usize,
    /// `[>= num_tokens, H, 512]` bf16, 16-byte aligned rows.
    pub q: unikv_tensor,
    /// i32 pool rows of all tokens' slices, concatenated (docs/index-streams.md).
    pub indices: unikv_tensor,
    /// `[>= num_tokens + 1]` i32: token t's slice is
    /// `indices[indptr[t]..indptr[t+1])`.
    pub indptr: unikv_tensor,
    /// Optional `[H]` f32 attention-sink logits (natural log); absent = -inf.
    pub sink: unikv_tensor,
    /// `[>= num_tokens, H, 512]` bf16 output; may be `q` itself (exact
    /// in-place: the same data, shape and strides).
    pub out: unikv_tensor,
    /// Optional `[>= num_tokens, H]` f32 log-sum-exp (natural log, sink
    /// included; the sink logit itself for an empty slice).
    pub lse: unikv_tensor,
    /// Pool layer whose rows the indices address.
    pub layer: u32,
    /// Tokens of this launch, at most the plan's `max_tokens`.
    pub num_tokens: u32,
    /// Multiplies q.k (512^-0.5 for DeepSeek-V4); must be finite.
    pub softmax_scale: f32,
    /// Must be 0.
    pub reserved: u32,
    /// Optional inverse-RoPE epilogue (docs/attention.md §4): with both
    /// `rope_table` (f32 `[max_pos, 64]`, `unikv_rope_table`) and `positions`
    /// (`[>= num_tokens]` int32 or int64) given, dims 448..511 of every output
    /// head of token t are rotated by the conjugate of table row `positions[t]`
    /// in fp32 before the single rounding to bf16; `lse` is unaffected. Both
    /// absent (NULL data): no epilogue. A position outside the table is
    /// OUT_OF_RANGE on the CPU backend (nothing written); GPU backends leave
    /// that token's rope dims unrotated.
    pub rope_table: unikv_tensor,
    /// `[>= num_tokens]` i32 or i64 positions of the epilogue (see `rope_table`).
    pub positions: unikv_tensor,
}

unsafe impl Versioned for unikv_decode_args {
    const NAME: &'static str = "args";
}

/// Arguments of `unikv_sparse_prefill` (docs/attention.md §2): decode's fields
/// plus the extend source, the chunk's own K rows.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_prefill_args {
    /// sizeof(unikv_prefill_args).
    pub struct_size: usize,
    /// `[>= num_tokens, H, 512]` bf16 queries, 16-byte aligned rows.
    pub q: unikv_tensor,
    /// Prefix stream into the pool layer; -1 entries are skipped.
    pub indices: unikv_tensor,
    /// `[>= num_tokens + 1]` i32 offsets of each token's prefix slice.
    pub indptr: unikv_tensor,
    /// Optional `[H]` f32 attention-sink logits; absent = -inf.
    pub sink: unikv_tensor,
    /// `[>= num_tokens, H, 512]` bf16 output; may be `q` itself (exact in-place).
    pub out: unikv_tensor,
    /// Optional `[>= num_tokens, H]` f32 log-sum-exp over both sources and the
    /// sink.
    pub lse: unikv_tensor,
    /// `[rows, 512]` bf16: the chunk's normed, rotated K rows.
    pub extend_kv: unikv_tensor,
    /// Extend stream into `extend_kv`; -1 entries are skipped.
    pub extend_indices: unikv_tensor,
    /// `[>= num_tokens + 1]` i32 offsets of each token's extend slice.
    pub extend_indptr: unikv_tensor,
    /// Pool layer the prefix stream addresses.
    pub layer: u32,
    /// Tokens of this launch, at most the plan's `max_tokens`.
    pub num_tokens: u32,
    /// Multiplies q.k (512^-0.5 for DeepSeek-V4); must be finite.
    pub softmax_scale: f32,
    /// Must be 0.
    pub reserved: u32,
}

unsafe impl Versioned for unikv_prefill_args {
    const NAME: &'static str = "args";
}

fn plan_shape(kind: PlanKind, p: &unikv_attention_plan_params) -> Result<PlanShape> {
    Ok(PlanShape {
        kind,
        max_tokens: p.max_tokens as usize,
        num_heads: p.num_heads as usize,
        head_dim: p.head_dim as usize,
        q_dtype: DType::from_raw("params.q_dtype", p.q_dtype)?,
        kv_dtype: DType::from_raw("params.kv_dtype", p.kv_dtype)?,
        out_dtype: DType::from_raw("params.out_dtype", p.out_dtype)?,
    })
}

unsafe fn create_plan(
    ctx: *const unikv_context,
    params: *const unikv_attention_plan_params,
    kind: PlanKind,
) -> Result<AttentionPlan> {
    let ctx = context(ctx)?;
    let p = read_params(params, std::mem::zeroed())?;
    let plan = AttentionPlan::new(ctx.clone(), plan_shape(kind, &p)?)?;
    crate::ffi::introspect::log_plan(&plan);
    Ok(plan)
}

/// Records the plan's context for the panic boundary.
fn entered(plan: &AttentionPlan) -> &AttentionPlan {
    enter_context(plan.context());
    plan
}

fn to_workspace(ptr: *mut c_void, bytes: usize) -> Workspace {
    Workspace {
        ptr: ptr as *mut u8,
        bytes,
    }
}

/// Creates a decode plan for the given capture-time shapes: chooses the launch
/// configuration and loads kernels, so the first launch may be captured in a
/// CUDA graph. `*out` receives a handle owned by the caller. Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_decode_plan_create(
    ctx: *const unikv_context,
    params: *const unikv_attention_plan_params,
    out: *mut *mut unikv_decode_plan,
) -> unikv_status {
    boundary(|| {
        ensure!(!out.is_null(), NullArgument, "out");
        let inner = create_plan(ctx, params, PlanKind::Decode)?;
        out.write(new_handle(unikv_decode_plan { inner }));
        Ok(())
    })
}

/// Destroys a decode plan. NULL is accepted; a pointer that is not a live
/// decode plan is ignored (the thread's last error says so). Externally
/// synchronized.
#[no_mangle]
pub unsafe extern "C" fn unikv_decode_plan_destroy(plan: *mut unikv_decode_plan) {
    let _ = boundary(|| destroy_handle("plan", plan));
}

/// Bytes of workspace every launch through the plan needs (0 on the CPU
/// backend). Allocate it once, e.g. with `unikv_memory_alloc`. Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_decode_plan_workspace_size(
    plan: *const unikv_decode_plan,
    bytes: *mut usize,
) -> unikv_status {
    boundary(|| {
        let plan = handle("plan", plan)?;
        write_out("bytes", bytes, plan.inner.workspace_bytes())
    })
}

/// Creates a prefill plan; same rules as `unikv_decode_plan_create`.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_prefill_plan_create(
    ctx: *const unikv_context,
    params: *const unikv_attention_plan_params,
    out: *mut *mut unikv_prefill_plan,
) -> unikv_status {
    boundary(|| {
        ensure!(!out.is_null(), NullArgument, "out");
        let inner = create_plan(ctx, params, PlanKind::Prefill)?;
        out.write(new_handle(unikv_prefill_plan { inner }));
        Ok(())
    })
}

/// Destroys a prefill plan. NULL is accepted; a pointer that is not a live
/// prefill plan is ignored (the thread's last error says so). Externally
/// synchronized.
#[no_mangle]
pub unsafe extern "C" fn unikv_prefill_plan_destroy(plan: *mut unikv_prefill_plan) {
    let _ = boundary(|| destroy_handle("plan", plan));
}

/// Workspace bytes of a prefill plan; see `unikv_decode_plan_workspace_size`.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_prefill_plan_workspace_size(
    plan: *const unikv_prefill_plan,
    bytes: *mut usize,
) -> unikv_status {
    boundary(|| {
        let plan = handle("plan", plan)?;
        write_out("bytes", bytes, plan.inner.workspace_bytes())
    })
}

/// Sparse decode attention over one pool layer: for each token, the rows of its
/// slice `indices[indptr[t]..indptr[t+1])` act as keys and values (K = V), the
/// sink as a virtual key with zero value; an empty slice gives zeros. `num_tokens`
/// may not exceed the plan's `max_tokens`; H is the plan's. Tensors and
/// `workspace` (at least the plan's workspace size; may be NULL when that is 0)
/// are in the context's memory; `args` is host memory. Runs on `stream`,
/// without allocating or synchronizing (CUDA-graph capturable). Device values:
/// the CPU backend checks indptr monotonicity and every index (OUT_OF_RANGE,
/// nothing written). Overlap: `out` may be `q` itself (exact in-place);
/// otherwise `out`, `lse` and the workspace may not overlap each other, an
/// input or the layer's pool rows (UNIKV_OVERLAPPING_BUFFERS). Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_sparse_decode(
    plan: *const unikv_decode_plan,
    pool: *const unikv_pool,
    args: *const unikv_decode_args,
    workspace: *mut c_void,
    workspace_bytes: usize,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let plan = entered(&handle("plan", plan)?.inner);
        let pool = pool_of(pool)?;
        let a = read_params(args, std::mem::zeroed())?;
        ensure!(a.reserved == 0, InvalidArgument, "args.reserved: must be 0");
        let raw = AttentionRaw {
            layer: a.layer,
            num_tokens: a.num_tokens as usize,
            softmax_scale: a.softmax_scale,
            q: (&a.q).into(),
            indices: (&a.indices).into(),
            indptr: (&a.indptr).into(),
            sink: (&a.sink).into(),
            out: (&a.out).into(),
            lse: (&a.lse).into(),
        };
        let epilogue = InverseRopeRaw {
            rope_table: (&a.rope_table).into(),
            positions: (&a.positions).into(),
        };
        attention::decode(
            plan,
            pool,
            &raw,
            &epilogue,
            to_workspace(workspace, workspace_bytes),
            Stream(stream),
        )
    })
}

/// Sparse prefill attention with two key sources: the prefix stream into the
/// pool layer and the extend stream into `extend_kv`, sharing one softmax with
/// the sink. -1 entries in either stream are skipped. Rules as
/// `unikv_sparse_decode`, overlap included (`out` may be `q` itself).
/// Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_sparse_prefill(
    plan: *const unikv_prefill_plan,
    pool: *const unikv_pool,
    args: *const unikv_prefill_args,
    workspace: *mut c_void,
    workspace_bytes: usize,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let plan = entered(&handle("plan", plan)?.inner);
        let pool = pool_of(pool)?;
        let a = read_params(args, std::mem::zeroed())?;
        ensure!(a.reserved == 0, InvalidArgument, "args.reserved: must be 0");
        let raw = AttentionRaw {
            layer: a.layer,
            num_tokens: a.num_tokens as usize,
            softmax_scale: a.softmax_scale,
            q: (&a.q).into(),
            indices: (&a.indices).into(),
            indptr: (&a.indptr).into(),
            sink: (&a.sink).into(),
            out: (&a.out).into(),
            lse: (&a.lse).into(),
        };
        let extend = ExtendRaw {
            kv: (&a.extend_kv).into(),
            indices: (&a.extend_indices).into(),
            indptr: (&a.extend_indptr).into(),
        };
        attention::prefill(
            plan,
            pool,
            &raw,
            &extend,
            to_workspace(workspace, workspace_bytes),
            Stream(stream),
        )
    })
}

/// Arguments of `unikv_attention_merge`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_merge_args {
    /// sizeof(unikv_merge_args).
    pub struct_size: usize,
    /// `[P, >= num_tokens, H, 512]` bf16: each part's normalized output over its
    /// own keys, computed without a sink.
    pub parts_out: unikv_tensor,
    /// `[P, >= num_tokens, H]` f32: each part's natural-log LSE (-inf when the
    /// part had no keys for that token; its output is then ignored).
    pub parts_lse: unikv_tensor,
    /// Optional `[H]` f32 sink logits, applied once; absent = -inf.
    pub sink: unikv_tensor,
    /// `[>= num_tokens, H, 512]` bf16 merged output.
    pub out: unikv_tensor,
    /// Optional `[>= num_tokens, H]` f32 merged LSE (sink included).
    pub lse: unikv_tensor,
    /// Tokens to merge (rows of every part).
    pub num_tokens: u32,
    /// Must be 0.
    pub reserved: u32,
}

unsafe impl Versioned for unikv_merge_args {
    const NAME: &'static str = "args";
}

/// Merges partial attention results computed over disjoint key sets (for
/// example by GPUs that each hold part of the pool, or by decode calls over
/// parts of a slice run without a sink) into the exact result over the union,
/// with the sink applied once. Tensors are in the context's memory; `args` is
/// host memory. Runs on `stream` without allocating or synchronizing. No
/// in-place use: `out` and `lse` may not overlap each other or an input
/// (UNIKV_OVERLAPPING_BUFFERS). Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_attention_merge(
    ctx: *const unikv_context,
    args: *const unikv_merge_args,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let ctx = context(ctx)?;
        let a = read_params(args, std::mem::zeroed())?;
        ensure!(a.reserved == 0, InvalidArgument, "args.reserved: must be 0");
        let raw = MergeRaw {
            num_tokens: a.num_tokens as usize,
            parts_out: (&a.parts_out).into(),
            parts_lse: (&a.parts_lse).into(),
            sink: (&a.sink).into(),
            out: (&a.out).into(),
            lse: (&a.lse).into(),
        };
        merge::merge(ctx, &raw, Stream(stream))
    })
}
