//! Attention plans and the sparse decode / prefill entry points.

use std::os::raw::c_void;

use crate::args::attention::{KvLayout, PlanKind, PlanShape, Workspace};
use crate::backend::Stream;
use crate::dtype::DType;
use crate::error::{ensure, Result};
use crate::ffi::boundary::{boundary, enter_context, read_params, write_out, Versioned};
use crate::ffi::context::{context, unikv_context};
use crate::ffi::handles::{destroy_handle, handle, new_handle, Handle};
use crate::ffi::pool::{pool_of, unikv_pool};
use crate::ffi::status::unikv_status;
use crate::ffi::types::unikv_tensor;
use crate::ops::attention::{self, AttentionRaw, ExtendRaw, ExtraRaw, InverseRopeRaw, KvCacheRaw};
use crate::ops::merge::{self, MergeRaw};
use crate::plan::AttentionPlan;
use crate::pool::Pool;

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

/// Layout of a key source (`unikv_kv_cache.layout`) and of the key sources
/// an attention plan is made for (`unikv_attention_plan_params.kv_layout`);
/// docs/attention.md §6.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum unikv_kv_layout {
    /// unikv's own rows: a layer of the call's pool (bf16 rows or the pool's
    /// FP8 rows, docs/fp8.md §4); for prefill's extend source, `extend_kv`.
    /// The value of a zeroed descriptor, so callers that predate the layouts
    /// keep their meaning.
    UNIKV_KV_LAYOUT_POOL = 0,
    /// FlashMLA's MODEL1 FP8 paged KV cache (584 bytes per token,
    /// docs/fp8.md §5), as sglang, vLLM and TensorRT-LLM keep it and
    /// `unikv_store_flashmla` writes it. Indices are token ids
    /// `page * page_size + slot`, as FlashMLA takes them.
    UNIKV_KV_LAYOUT_FLASHMLA = 1,
    /// Scaled FP8 rows (docs/fp8.md §8): 512 FP8 codes per row and, in a
    /// separate tensor, 8 fp32 scales per row (one per 64 dims, any value),
    /// the single-buffer FP8 layout of sglang's / ATOM's unified-pool kernels
    /// (`kv_scales`); `unikv_store_scaled_fp8` writes it. Indices are row ids.
    UNIKV_KV_LAYOUT_SCALED_FP8 = 2,
}

const _: () = assert!(unikv_kv_layout::UNIKV_KV_LAYOUT_POOL as u32 == 0);
const _: () = assert!(unikv_kv_layout::UNIKV_KV_LAYOUT_FLASHMLA as u32 == 1);
const _: () = assert!(unikv_kv_layout::UNIKV_KV_LAYOUT_SCALED_FP8 as u32 == 2);

/// Where a key source's rows live when they are not the call's default rows
/// (a pool layer, or prefill's `extend_kv`): a caller-owned cache of another
/// layout, read in place. All zero (UNIKV_KV_LAYOUT_POOL): the default rows.
/// Tensors are in the context's memory.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_kv_cache {
    /// A `unikv_kv_layout`. It must be the plan's `kv_layout` unless it is
    /// UNIKV_KV_LAYOUT_POOL, whose other fields must all be zero.
    pub layout: u32,
    /// The codes' flavour, UNIKV_DTYPE_FP8_E4M3FN or UNIKV_DTYPE_FP8_E4M3FNUZ:
    /// the plan's `kv_dtype` (UNIKV_BAD_DTYPE otherwise).
    pub fp8_dtype: u32,
    /// FLASHMLA: tokens per page, 2, 64 or 256. SCALED_FP8: 0.
    pub page_size: u32,
    /// Must be 0.
    pub reserved: u32,
    /// FLASHMLA: the cache, `[num_pages, bytes_per_page]` UNIKV_DTYPE_U8,
    /// 16-byte aligned, row stride exactly bytes_per_page =
    /// ceil(584 * page_size / 576) * 576 (the layout of
    /// `unikv_store_flashmla_args.cache`); indices address its
    /// num_pages * page_size token slots. SCALED_FP8: the codes,
    /// `[rows, 512]` UNIKV_DTYPE_U8, 16-byte aligned rows.
    pub data: unikv_tensor,
    /// SCALED_FP8: `[rows, 8]` UNIKV_DTYPE_F32 scales (the rows of `data`),
    /// 16-byte aligned rows; scale k multiplies dims 64k..64k+63. FLASHMLA:
    /// absent (NULL data).
    pub scales: unikv_tensor,
}

impl Default for unikv_kv_cache {
    /// All zero: the call's default rows.
    fn default() -> Self {
        // SAFETY: integers and descriptors with NULL data; every bit pattern is valid.
        unsafe { std::mem::zeroed() }
    }
}

impl From<&unikv_kv_cache> for KvCacheRaw {
    fn from(c: &unikv_kv_cache) -> Self {
        KvCacheRaw {
            layout: c.layout,
            fp8_dtype: c.fp8_dtype,
            page_size: c.page_size,
            reserved: c.reserved,
            data: (&c.data).into(),
            scales: (&c.scales).into(),
        }
    }
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
    /// The key rows' dtype. UNIKV_KV_LAYOUT_POOL plans: the pool's
    /// `kv_dtype` (bf16 or an FP8 flavour); a launch on a pool of another
    /// dtype is UNIKV_BAD_DTYPE. FLASHMLA and SCALED_FP8 plans: the caches'
    /// FP8 flavour (UNIKV_DTYPE_FP8_E4M3FN or UNIKV_DTYPE_FP8_E4M3FNUZ).
    pub kv_dtype: u32,
    /// `unikv_dtype` of out: UNIKV_DTYPE_BF16.
    pub out_dtype: u32,
    /// The `unikv_kv_layout` of the key sources of every launch through the
    /// plan (docs/attention.md §6): each source is of this layout, or bf16
    /// rows (prefill's `extend_kv`). 0 (UNIKV_KV_LAYOUT_POOL, and what a
    /// caller whose struct predates this field gets): a pool layer.
    pub kv_layout: u32,
    /// Must be 0.
    pub reserved: u32,
}

unsafe impl Versioned for unikv_attention_plan_params {
    const NAME: &'static str = "params";
    const MIN_SIZE: usize = std::mem::offset_of!(unikv_attention_plan_params, kv_layout);
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
    /// Where the rows `indices` names live (docs/attention.md §6). Zeroed
    /// (UNIKV_KV_LAYOUT_POOL): layer `layer` of the pool. Otherwise a cache
    /// of the plan's `kv_layout`, and `pool` may be NULL unless the extra
    /// source is a pool layer.
    pub kv: unikv_kv_cache,
    /// The optional second key source's rows (`extra_indices`): zeroed, the
    /// pool's layer `layer`; otherwise a cache of the plan's `kv_layout`.
    /// Must be zeroed when `extra_indices` is absent.
    pub extra_kv: unikv_kv_cache,
    /// Optional second key source, as FlashMLA's `extra_k_cache` with its
    /// `extra_indices` (for example the SWA window in one cache and the
    /// compressed rows in another): i32 indices into `extra_kv`; token t's
    /// keys are its `indices` slice followed by
    /// `extra_indices[extra_indptr[t]..extra_indptr[t+1])`, in one softmax.
    /// Absent (NULL data): one source.
    pub extra_indices: unikv_tensor,
    /// `[>= num_tokens + 1]` i32 offsets of each token's extra slice; given
    /// exactly when `extra_indices` is.
    pub extra_indptr: unikv_tensor,
}

unsafe impl Versioned for unikv_decode_args {
    const NAME: &'static str = "args";
    const MIN_SIZE: usize = std::mem::offset_of!(unikv_decode_args, kv);
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
    /// `[rows, 512]` bf16: the chunk's normed, rotated K rows; absent when
    /// `extend_cache` names the extend source.
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
    /// Where the prefix stream's rows live (docs/attention.md §6). Zeroed
    /// (UNIKV_KV_LAYOUT_POOL): layer `layer` of the pool. Otherwise a cache
    /// of the plan's `kv_layout`.
    pub kv: unikv_kv_cache,
    /// Where the extend stream's rows live. Zeroed: `extend_kv`. Otherwise a
    /// cache of the plan's `kv_layout`, and `extend_kv` must be absent.
    pub extend_cache: unikv_kv_cache,
}

unsafe impl Versioned for unikv_prefill_args {
    const NAME: &'static str = "args";
    const MIN_SIZE: usize = std::mem::offset_of!(unikv_prefill_args, kv);
}

fn plan_shape(kind: PlanKind, p: &unikv_attention_plan_params) -> Result<PlanShape> {
    ensure!(
        p.reserved == 0,
        InvalidArgument,
        "params.reserved: must be 0"
    );
    Ok(PlanShape {
        kv_layout: KvLayout::from_raw("params.kv_layout", p.kv_layout)?,
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

/// The pool of a call: NULL is accepted (the sources then name no pool
/// layer, checked by `ops::attention`).
unsafe fn optional_pool<'a>(pool: *const unikv_pool) -> Result<Option<&'a Pool>> {
    if pool.is_null() {
        Ok(None)
    } else {
        pool_of(pool).map(Some)
    }
}

/// Sparse decode attention: for each token, the rows of its slice
/// `indices[indptr[t]..indptr[t+1])` (followed by its `extra_indices` slice
/// when given) act as keys and values (K = V), the sink as a virtual key with
/// zero value; an empty slice gives zeros. Key rows come from the pool's layer
/// `layer` or, per source, from a FlashMLA cache or scaled FP8 rows
/// (`args.kv`, `args.extra_kv`; docs/attention.md §6); `pool` may be NULL when
/// no source is a pool layer. `num_tokens` may not exceed the plan's
/// `max_tokens`; H is the plan's. Tensors and `workspace` (at least the
/// plan's workspace size; may be NULL when that is 0) are in the context's
/// memory; `args` is host memory. Runs on `stream`, without allocating or
/// synchronizing (CUDA-graph capturable). Device values: the CPU backend (and
/// GPU backends in `validate` mode) checks indptr monotonicity and every index
/// against its source's rows (a FlashMLA cache's num_pages * page_size token
/// slots): OUT_OF_RANGE, nothing written; otherwise GPU backends skip an index
/// outside its source. Overlap: `out` may be `q` itself (exact in-place);
/// otherwise `out`, `lse` and the workspace may not overlap each other, an
/// input, a cache or the layer's pool rows (UNIKV_OVERLAPPING_BUFFERS).
/// Thread-safe.
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
        let pool = optional_pool(pool)?;
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
            kv: (&a.kv).into(),
        };
        let extra = ExtraRaw {
            cache: (&a.extra_kv).into(),
            indices: (&a.extra_indices).into(),
            indptr: (&a.extra_indptr).into(),
        };
        let epilogue = InverseRopeRaw {
            rope_table: (&a.rope_table).into(),
            positions: (&a.positions).into(),
        };
        attention::decode(
            plan,
            pool,
            &raw,
            &extra,
            &epilogue,
            to_workspace(workspace, workspace_bytes),
            Stream(stream),
        )
    })
}

/// Sparse prefill attention with two key sources: the prefix stream into the
/// pool layer (or the cache `args.kv`) and the extend stream into `extend_kv`
/// (or the cache `args.extend_cache`), sharing one softmax with the sink. -1
/// entries in either stream are skipped. `pool` may be NULL when neither
/// source is a pool layer. Rules as `unikv_sparse_decode`, overlap included
/// (`out` may be `q` itself). Thread-safe.
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
        let pool = optional_pool(pool)?;
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
            kv: (&a.kv).into(),
        };
        let extend = ExtendRaw {
            kv: (&a.extend_kv).into(),
            indices: (&a.extend_indices).into(),
            indptr: (&a.extend_indptr).into(),
            cache: (&a.extend_cache).into(),
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
