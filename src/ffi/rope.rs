//! RoPE table builder: the fp32 tables the Q/KV preparation and inverse RoPE
//! read (spec store_fused §3.3).

use crate::error::{ensure, Error};
use crate::ffi::boundary::{boundary, read_params, Versioned};
use crate::ffi::status::unikv_status;
use crate::rope::{self, RopeConfig, Yarn, ROPE_DIM};

/// YaRN frequency interpolation (spec store_fused §3.3); `factor = 0` means
/// none, and the other fields are then ignored.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_rope_yarn {
    /// Context extension factor (`rope_scaling.factor`), > 0; 0 = no YaRN.
    pub factor: f64,
    /// Pre-extension context length (`original_max_position_embeddings`), > 0.
    pub original_max_position: u64,
    /// Ramp ends in turns over that length: `beta_fast >= beta_slow > 0`.
    pub beta_fast: f64,
    pub beta_slow: f64,
}

/// How a layer's RoPE table is built. Dense layers use base 10000 without
/// YaRN; compressed layers base 40000 with YaRN (spec store_fused §3.3).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_rope_params {
    /// sizeof(unikv_rope_params).
    pub struct_size: usize,
    /// Frequency base theta, a finite number > 1.
    pub base: f64,
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
