//! MoE routing entry point: hash-routed gating of the first MoE layers (see
//! docs/routing.md §1).

use std::os::raw::c_void;

use crate::backend::Stream;
use crate::ffi::boundary::{boundary, read_params, Versioned};
use crate::ffi::context::{context, unikv_context};
use crate::ffi::status::unikv_status;
use crate::ffi::types::unikv_tensor;
use crate::ops::routing::{self, HashTopkRaw};

/// Arguments of `unikv_hash_topk`. K = `tid2eid.shape[1]` routed experts per
/// row, E = `router_logits.shape[1]` experts, S = `num_shared`; K + S <= 32.
///
/// Math per real row n, with `e_j = tid2eid[input_ids[n]][j]` (table order):
/// `w_j = sqrt(softplus(router_logits[n][e_j]))`, `softplus(x) = max(x, 0) +
/// log1p(exp(-|x|))`; slot j < K is `(e_j, w_j / sum_j w_j)` (no epsilon), slot
/// K + s is the fused shared expert `(E + s, 1 / routed_scaling_factor)`.
/// Computed in double, each weight rounded to f32 once (backends agree within
/// 1 f32 ulp). Rows n >= the number of real tokens are padding: ids -1,
/// weights 0.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_hash_topk_args {
    /// sizeof(unikv_hash_topk_args).
    pub struct_size: usize,
    /// `[>= num_tokens, E]` f32 router logits (any row stride).
    pub router_logits: unikv_tensor,
    /// `[>= num_tokens]` i32 or i64 token id of each row.
    pub input_ids: unikv_tensor,
    /// `[vocab, K]` i32 expert table (checkpoint `tid2eid`, any row stride).
    pub tid2eid: unikv_tensor,
    /// `[>= num_tokens, K + S]` f32 output weights (any row stride).
    pub topk_weights: unikv_tensor,
    /// `[>= num_tokens, K + S]` i32 output expert ids (any row stride).
    pub topk_ids: unikv_tensor,
    /// Optional `[>= 1]` i32 or i64 in the context's memory: element 0 is the
    /// number of real rows (a device value under CUDA graphs). Absent (NULL
    /// data): `num_real_tokens_host` counts them.
    pub num_real_tokens: unikv_tensor,
    /// Real rows when `num_real_tokens` is absent; at most `num_tokens`.
    pub num_real_tokens_host: u32,
    /// Rows to write (< 2^31).
    pub num_tokens: u32,
    /// S: fused shared-expert slots after the K routed ones (0 or 1 in
    /// DeepSeek-V4).
    pub num_shared: u32,
    /// `routed_scaling_factor` (1.5 in DeepSeek-V4), finite and > 0.
    pub routed_scaling_factor: f32,
}

unsafe impl Versioned for unikv_hash_topk_args {
    const NAME: &'static str = "args";
}

/// Writes `topk_ids` and `topk_weights` for rows 0..num_tokens (math in
/// `unikv_hash_topk_args`). Tensors are in the context's memory; `args` is
/// host memory read during the call. Runs on `stream` (ignored by the CPU
/// backend). Device values: the CPU backend (and GPU backends in `validate`
/// mode) checks the real-token count (OUT_OF_RANGE outside 0..num_tokens),
/// every real row's token id against the table and its K experts against E
/// (OUT_OF_RANGE), nothing written. Otherwise GPU backends write such a row as
/// padding (ids -1, weights 0) and clamp nothing else. No in-place use:
/// `topk_weights` and `topk_ids` may not overlap each other or an input
/// (UNIKV_OVERLAPPING_BUFFERS). Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_hash_topk(
    ctx: *const unikv_context,
    args: *const unikv_hash_topk_args,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let ctx = context(ctx)?;
        let a = read_params(args, std::mem::zeroed())?;
        let raw = HashTopkRaw {
            router_logits: (&a.router_logits).into(),
            input_ids: (&a.input_ids).into(),
            tid2eid: (&a.tid2eid).into(),
            topk_weights: (&a.topk_weights).into(),
            topk_ids: (&a.topk_ids).into(),
            num_real_tokens: (&a.num_real_tokens).into(),
            num_real_tokens_host: a.num_real_tokens_host,
            num_tokens: a.num_tokens as usize,
            num_shared: a.num_shared,
            routed_scaling_factor: a.routed_scaling_factor,
        };
        routing::hash_topk(ctx, &raw, Stream(stream))
    })
}
