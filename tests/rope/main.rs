//! `unikv::rope` against an independent float64 reference written here from
//! docs/prepare.md §1, §3, §4, §5 and docs/attention.md §4; no expectation is computed with the
//! code under test:
//!
//! * table (docs/prepare.md §3): `w_i = base^(-2i/64)` (here `exp(-(2i/64) ln base)`), YaRN
//!   `low = floor(64 ln(L0/(b_fast 2 pi)) / (2 ln base))`, `high = ceil(.. b_slow ..)`,
//!   both clamped to [0, 63], `high += 0.001` when equal,
//!   `ramp_i = clamp((i - low)/(high - low), 0, 1)`, `w_i <- w_i/factor ramp_i + w_i (1 - ramp_i)`;
//!   row p = `[cos(p w_0), sin(p w_0), cos(p w_1), ...]`;
//! * RoPE (docs/prepare.md §3): pairs of the last 64 dims times `cos + j sin` (inverse: the
//!   conjugate, docs/attention.md §4);
//! * RMSNorm (docs/prepare.md §1): `x / sqrt(mean(x^2) + eps) * w`;
//! * Q (docs/prepare.md §4, rounding as the CUDA kernel does): bf16(norm), then bf16(RoPE of those);
//!   KV (docs/prepare.md §5): bf16 of norm * w (nope) and of RoPE of the unrounded norm * w (rope).
//!
//! Tolerances. u = 2^-24 is the fp32 unit roundoff. The fp32 primitives are checked
//! against bounds of a few u derived from the operations they perform. A bf16
//! output is accepted when it is the bf16 nearest to some value within the
//! implementation's fp32 error bound E of the exact result, i.e. its rank lies in
//! `[bf16(exact - E), bf16(exact + E)]`: with E a few u this is the exact rounding
//! except within E of a bf16 rounding midpoint, where the neighbour is accepted too
//! (1 bf16 ulp). Every directly rounded output is held to that 1 ulp. The Q rope dims
//! round twice (before and after RoPE) and RoPE can cancel, so there E follows the
//! candidates of the first rounding and the cancellation; the tests count the
//! elements whose accepted range is wider than 1 ulp and require them to be rare.
//!
//! Every run draws fresh random inputs (never zeros); the seed is printed. Rerun a
//! failure with `UNIKV_TEST_SEED=<seed>`. Every test asserts how many elements it
//! checked, so none can pass by checking nothing.
//!
//! Helpers: inputs.rs (random inputs), reference.rs (the float64 reference),
//! acceptance.rs (bf16 rounding and the acceptance ranges); the tests in one
//! module per operation.

mod acceptance;
#[path = "../common/mod.rs"]
mod common;
mod inputs;
mod reference;

mod c_abi_table;
mod prepare;
mod rms_norm;
mod rotation;
mod table;

use acceptance::*;
use common::*;
use inputs::*;
// One random value (inputs.rs), not common's random vector.
use inputs::random_bf16;
use reference::*;
use std::f64::consts::PI;

use half::bf16;
use rand::rngs::StdRng;
use rand::Rng;
use unikv::error::Error;
use unikv::ffi::rope::{unikv_rope_params, unikv_rope_table, unikv_rope_yarn};
use unikv::rope::{
    build_table, inverse_rope_row, prepare_kv_row, prepare_q_row, rms_norm, rope_row, table_row,
    RopeConfig, Yarn,
};

/// Latent row width.
const D: usize = 512;
/// Rotated dims at the end of a row.
const R: usize = 64;
/// Dims before them.
const NOPE: usize = D - R;
/// `config.rms_norm_eps` (docs/prepare.md §1).
const EPS: f32 = 1e-6;
/// The fp32 unit roundoff, 2^-24.
const U: f64 = 1.0 / 16_777_216.0;
/// At most this fraction of rope elements may get an accepted range wider than 1
/// bf16 ulp (a first rounding within E of a midpoint, or cancellation of 2^8 or
/// more; each has a probability near 2^-13 per element).
const WIDE_FRACTION: f64 = 0.01;
