//! RoPE: the fp32 table builder (docs/prepare.md §3) and the inverse RoPE of
//! an attention output (docs/attention.md §4), which reads such a table.

use std::os::raw::c_void;

use crate::backend::Stream;
use crate::error::{ensure, Error};
use crate::ffi::boundary::{boundary, read_params, Versioned};
use crate::ffi::context::{context, unikv_context};
use crate::ffi::status::unikv_status;
use crate::ffi::types::unikv_tensor;
use crate::ops::rope::{self as rope_op, InverseRopeRaw};
use crate::rope::{self, RopeConfig, Yarn, ROPE_DIM};

/// YaRN frequency interpolation (docs/prepare.md §3); `factor = 0` means
/// none, and the other fields are then ignored.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_rope_yarn {
    /// Context extension factor (`rope_scaling.factor`), > 0; 0 = no YaRN.
    pub factor: f64,
    /// Pre-extension context length (`original_max_position_embeddings`), > 0.
    pub original_max_position: u64,
    /// Fast end of the ramp in turns over that length (`beta_fast`):
    /// `beta_fast >= beta_slow > 0`.
    pub beta_fast: f64,
    /// Slow end of the ramp (`beta_slow`), > 0 and <= `beta_fast`.
    pub beta_slow: f64,
}

/// How a layer's RoPE table is built. Dense layers use base 10000 without
/// YaRN; compressed layers base 40000 with YaRN (docs/prepare.md §3).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_rope_params {
    /// sizeof(unikv_rope_params).
    pub struct_size: usize,
    /// Frequency base theta, a finite number > 1.
    pub base: f64,
    /// YaRN interpolation; `yarn.factor = 0` for none.
    pub yarn: unikv_rope_yarn,
}

unsafe impl Versioned for unikv_rope_params {
    const NAME: &'static str = "params";
}

/// Fills `table` (host memory, at least `max_pos * 64` floats) with the RoPE
/// table of `params` for positions 0..max_pos: row p holds the 32 pairs
/// (cos, sin) of p times each frequency, interleaved, as the GPT-J rotation of
/// the last 64 dims of a 512-dim row reads them. Computed in f64 and rounded
/// once, so every backend reads identical values. Host function, no context;
/// INVALID_ARGUMENT names a bad field of `params` or `max_pos`,
/// CAPACITY_EXCEEDED a short `table`; nothing is written on error.
/// Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_rope_table(
    params: *const unikv_rope_params,
    max_pos: u32,
    table: *mut f32,
    table_len: usize,
) -> unikv_status {
    boundary(|| {
        let zero_yarn = unikv_rope_yarn {
            factor: 0.0,
            original_max_position: 0,
            beta_fast: 0.0,
            beta_slow: 0.0,
        };
        let defaults = unikv_rope_params {
            struct_size: 0,
            base: 0.0,
            yarn: zero_yarn,
        };
        let p = read_params(params, defaults)?;
        ensure!(!table.is_null(), NullArgument, "table");
        ensure!(
            table.is_aligned(),
            BadAlignment,
            "table: {table:p} is not 4-byte aligned"
        );
        let yarn = (p.yarn.factor != 0.0).then_some(Yarn {
            factor: p.yarn.factor,
            original_max_position: p.yarn.original_max_position,
            beta_fast: p.yarn.beta_fast,
            beta_slow: p.yarn.beta_slow,
        });
        ensure!(max_pos > 0, InvalidArgument, "max_pos: must be positive");
        let len = max_pos as usize * ROPE_DIM;
        ensure!(
            table_len >= len,
            CapacityExceeded,
            "table_len: {table_len} floats hold fewer than max_pos ({max_pos}) rows of {ROPE_DIM}"
        );
        let out = std::slice::from_raw_parts_mut(table, len);
        rope::fill_table(&RopeConfig::new(p.base, yarn), out).map_err(name_fields)
    })
}

/// The builder names its config's fields; here they are fields of `params`.
fn name_fields(e: Error) -> Error {
    match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("params.{m}")),
        other => other,
    }
}

/// Arguments of `unikv_inverse_rope`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_inverse_rope_args {
    /// sizeof(unikv_inverse_rope_args).
    pub struct_size: usize,
    /// Attention output `[>= num_tokens, num_heads, 512]` bf16, rotated in
    /// place; data and outer strides 8-byte aligned (head padding allowed).
    pub x: unikv_tensor,
    /// `[>= num_tokens]` UNIKV_DTYPE_I32 or UNIKV_DTYPE_I64: each token's
    /// position, the row of `rope_table` it is rotated back by.
    pub positions: unikv_tensor,
    /// `[max_pos, 64]` f32 as `unikv_rope_table` fills it (the layer's table);
    /// data and row stride 16-byte aligned.
    pub rope_table: unikv_tensor,
    /// Tokens to rotate.
    pub num_tokens: u32,
    /// Heads per token, > 0; must equal `x.shape[1]`.
    pub num_heads: u32,
}

unsafe impl Versioned for unikv_inverse_rope_args {
    const NAME: &'static str = "args";
}

/// Inverse RoPE of an attention output before `wo_a` (docs/attention.md §4):
/// for every token t < num_tokens and head h, the pairs (2i, 2i+1) of dims
/// 448..511 of `x[t, h]` are multiplied by the conjugate of row
/// `positions[t]` of `rope_table` (c, s = its pair i):
/// `x[2i] <- x[2i] c + x[2i+1] s`, `x[2i+1] <- x[2i+1] c - x[2i] s`,
/// computed in fp32 from the bf16 values and rounded once to bf16 (nearest
/// even); the backends agree bit for bit. Dims 0..447 are not touched.
/// Tensors are in the context's memory; `args` is host memory read during the
/// call. Runs on `stream` without allocating or synchronizing. Device values:
/// the CPU backend checks every position (OUT_OF_RANGE when negative or not
/// below the table's rows; nothing written); GPU backends leave such tokens
/// unchanged. `positions` and `rope_table` may not overlap `x`
/// (UNIKV_OVERLAPPING_BUFFERS). Thread-safe for disjoint `x`.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_inverse_rope(
    ctx: *const unikv_context,
    args: *const unikv_inverse_rope_args,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let ctx = context(ctx)?;
        let a = read_params(args, std::mem::zeroed())?;
        let raw = InverseRopeRaw {
            num_tokens: a.num_tokens as usize,
            num_heads: a.num_heads as usize,
            x: (&a.x).into(),
            positions: (&a.positions).into(),
            rope_table: (&a.rope_table).into(),
        };
        rope_op::inverse_rope(ctx, &raw, Stream(stream))
    })
}
