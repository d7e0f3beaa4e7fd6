//! Fused Q/KV preparation entry point (docs/prepare.md §4): RMSNorm + RoPE of
//! Q and KV, and the KV row's store into the pool, in one call.

use std::os::raw::c_void;

use crate::backend::Stream;
use crate::ffi::boundary::{boundary, read_params, Versioned};
use crate::ffi::indexer::{query_raw, unikv_indexer_prepare_q_args};
use crate::ffi::pool::{pool_of, unikv_pool};
use crate::ffi::status::unikv_status;
use crate::ffi::types::unikv_tensor;
use crate::ops::prepare::{self, PrepareQkvRaw};

/// Arguments of `unikv_prepare_qkv`. bf16 tensors have 16-byte aligned rows.
///
/// Math per token t, with `(c_i, s_i)` = `rope_table[positions[t], 2i..2i+2]`
/// and RoPE the GPT-J rotation of dims 448..511 (pair i = dims
/// `448 + 2i, 449 + 2i`: `re' = re*c - im*s`, `im' = re*s + im*c`). The norm
/// factor `f = 1 / sqrt(sum(x^2) / 512 + eps)` (per row) is computed in
/// double and rounded to f32 once; every other step is one f32 multiply or
/// add, never fused, in the order written; `bf16()` rounds to nearest even:
///
/// * Q, each head h: `n = bf16(x * f)` for all 512 dims (the nope output and
///   the RoPE input), then `q_out = n` on dims 0..447 and `bf16(RoPE(n))` on
///   448..511 (the CUDA kernels' order, docs/prepare.md §4).
/// * KV: `k = (x * f) * kv_weight` in f32, RoPE of dims 448..511 from those
///   f32 values, then `bf16()` once for all 512 dims: that row goes to
///   `kv_out` and to the pool. An FP8 pool quantizes the bf16 row exactly as
///   `unikv_store_swa` does (same codes and scale bytes).
///
/// Backends agree within 1 bf16 ulp per element (the sum of squares may
/// round differently) and 1 FP8 code.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_prepare_qkv_args {
    /// sizeof(unikv_prepare_qkv_args).
    pub struct_size: usize,
    /// `[>= num_tokens, num_heads, 512]` bf16: Q per head (any token and head
    /// strides).
    pub q_in: unikv_tensor,
    /// `[>= num_tokens, num_heads, 512]` bf16 output; may be a slice of a
    /// head-padded buffer, or `q_in` itself (exact in-place: the same data,
    /// shape and strides; any other overlap is UNIKV_OVERLAPPING_BUFFERS).
    pub q_out: unikv_tensor,
    /// `[>= num_tokens, 512]` bf16 KV latent rows (any row stride, e.g. a
    /// slice of a fused projection's output).
    pub kv_in: unikv_tensor,
    /// `[512]` bf16 RMSNorm weight of the KV row (`kv_norm.weight`).
    pub kv_weight: unikv_tensor,
    /// Optional `[>= num_tokens, 512]` bf16 output: the normalized, rotated KV
    /// rows (prefill's extend source); may be `kv_in` itself (exact
    /// in-place, as `q_out`).
    pub kv_out: unikv_tensor,
    /// `[max_pos, 64]` f32 RoPE table of the layer (`unikv_rope_table`).
    pub rope_table: unikv_tensor,
    /// `[>= num_tokens]` i32 or i64 absolute positions: table rows.
    pub positions: unikv_tensor,
    /// Optional `[>= num_tokens]` i32 or i64 pool rows of `layer` receiving
    /// each token's KV row; negative = no store (decode / verify pass ring rows,
    /// prefill passes -1 or leaves it absent and stores its final window later
    /// with `unikv_store_swa`).
    pub rows: unikv_tensor,
    /// Pool layer receiving the KV rows.
    pub layer: u32,
    /// Tokens of this forward.
    pub num_tokens: u32,
    /// Q heads H (> 0); num_tokens * H < 2^31.
    pub num_heads: u32,
    /// Q RMSNorm epsilon (config.rms_norm_eps, 1e-6), finite and > 0.
    pub q_eps: f32,
    /// KV RMSNorm epsilon (config.rms_norm_eps, 1e-6), finite and > 0.
    pub kv_eps: f32,
    /// Must be 0.
    pub reserved: u32,
}

unsafe impl Versioned for unikv_prepare_qkv_args {
    const NAME: &'static str = "args";
}

/// Prepares one layer's Q and KV for attention (docs/prepare.md §4, §5,
/// math in `unikv_prepare_qkv_args`): writes `q_out`, the optional `kv_out`,
/// and each token's KV row into pool row `rows[t]` (bf16, or quantized for FP8
/// pools). Tensors are in the context's memory; `args` is host memory read
/// during the call. Runs on `stream` (ignored by the CPU backend) as one
/// kernel launch on GPUs. Device values: the CPU backend checks every position
/// (a row of `rope_table`) and row (below the layer's rows, no two tokens on
/// one row) before writing anything (OUT_OF_RANGE / INVALID_ARGUMENT); GPU
/// backends write nothing for a token whose position is outside the table and
/// skip the store of a row past the layer's rows. Overlap: `q_out` may be
/// `q_in` and `kv_out` may be `kv_in` exactly; no other output may overlap an
/// argument, nor (when `rows` is given) may any tensor overlap the layer's
/// pool rows (UNIKV_OVERLAPPING_BUFFERS). Thread-safe for disjoint outputs
/// and pool rows.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_prepare_qkv(
    pool: *const unikv_pool,
    args: *const unikv_prepare_qkv_args,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let pool = pool_of(pool)?;
        let a = read_params(args, std::mem::zeroed())?;
        prepare::prepare_qkv(pool, &qkv_raw(&a), Stream(stream))
    })
}

fn qkv_raw(a: &unikv_prepare_qkv_args) -> PrepareQkvRaw {
    PrepareQkvRaw {
        layer: a.layer,
        num_tokens: a.num_tokens as usize,
        num_heads: a.num_heads as usize,
        q_eps: a.q_eps,
        kv_eps: a.kv_eps,
        reserved: a.reserved,
        q_in: (&a.q_in).into(),
        q_out: (&a.q_out).into(),
        kv_in: (&a.kv_in).into(),
        kv_weight: (&a.kv_weight).into(),
        kv_out: (&a.kv_out).into(),
        rope_table: (&a.rope_table).into(),
        positions: (&a.positions).into(),
        rows: (&a.rows).into(),
    }
}

/// `unikv_prepare_qkv` and `unikv_indexer_prepare_q` (on the pool's
/// context) in one call: on GPUs one kernel launch runs both, so a CSA
/// layer's chain has one launch fewer. Results equal the two calls'. Checks
/// are both calls' (an indexer field is named as in its own struct), all
/// made before anything is written; in addition no output of one struct may
/// overlap an argument of the other (UNIKV_OVERLAPPING_BUFFERS). Thread-safe
/// for disjoint outputs and pool rows.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_prepare_qkv_indexer_q(
    pool: *const unikv_pool,
    args: *const unikv_prepare_qkv_args,
    indexer: *const unikv_indexer_prepare_q_args,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let pool = pool_of(pool)?;
        let a = read_params(args, std::mem::zeroed())?;
        let q = read_params(indexer, std::mem::zeroed())?;
        prepare::prepare_qkv_indexer_q(pool, &qkv_raw(&a), &query_raw(&q), Stream(stream))
    })
}
