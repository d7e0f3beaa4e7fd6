//! Indexer query and key preparation cases shared by tests/indexer.rs (CPU
//! backend against a float64 reference) and tests/gpu/indexer.rs (GPU against
//! CPU): random inputs, argument structs over buffers in any context's memory,
//! and the reference checks of docs/indexer.md §1, §2 (the Hadamard
//! transform as the explicit ±1 matrix).

use std::os::raw::c_void;

use half::bf16;
use rand::rngs::StdRng;
use rand::Rng;
use unikv::ffi::indexer::{unikv_indexer_prepare_k_args, unikv_indexer_prepare_q_args};
use unikv::ffi::types::{unikv_dtype, unikv_tensor};
use unikv::fp8::{decode, Fp8Format};

use super::cache_store::random_locations;
use super::*;

mod csa_tail;
mod fused_prepare;
mod key;
mod query;
mod topk;

// Re-exported for the test binaries, which each use only some of them.
#[allow(unused_imports)]
pub use csa_tail::{csa_pool, run_topk_csa, CsaStream};
#[allow(unused_imports)]
pub use fused_prepare::{untouched, FusedOutputs, FusedPrepare};
#[allow(unused_imports)]
pub use key::{KeyCase, KeyPointers};
#[allow(unused_imports)]
pub use query::{QueryCase, QueryPointers};
#[allow(unused_imports)]
pub use topk::{Spread, TopkCase, TopkPointers};

pub const DIM: usize = 128;
/// Keys per indexer cache page, and its page stride in bytes.
pub const PAGE: usize = 64;
pub const PAGE_BYTES: usize = 132 * PAGE;
/// Spare elements past each output head / row, which must stay poisoned.
const OUT_PAD: usize = 16;

/// Error bound of an indexer dot product on Hopper's FP8 tensor cores,
/// relative to the sum of its terms' magnitudes. The instruction keeps about
/// 13 mantissa bits: within a k-step each of the 32 products, aligned to the
/// largest, may lose up to 2^-13 of it, and each of the 4 chained k-steps
/// truncates the running sum once, so the error stays under
/// (32 + 4) 2^-13 < 2^-7 of the terms. Largest seen on the H200: 4.7e-4 (a
/// one-head case). A wrong key or head misses by about a tenth of the terms
/// on these random inputs (a dot product's sum against its terms' sum).
pub const FP8_TENSOR_CORE_EPS: f64 = 1.0 / 128.0;

/// Error bound of a dot product of 128 exact products summed in f32, in any
/// order, relative to its terms: 128 roundings of at most 2^-24 of a partial
/// sum, at most 2^-17 (largest seen on the H200: 2.5e-7 of the terms, about
/// 2^-22).
pub const F32_DOT_EPS: f64 = 1.0 / 131_072.0;

/// How closely a score must match the float64 reference: `rel` of the sum of
/// the weighted dot products' magnitudes (f32 sums), plus `dot_eps` of each
/// dot product's terms (a tensor core's own narrower sums).
#[derive(Clone, Copy, Debug)]
pub struct ScoreTol {
    pub rel: f64,
    pub dot_eps: f64,
}

impl ScoreTol {
    /// The CPU backend: f64 sums, one f32 rounding.
    pub const EXACT: ScoreTol = ScoreTol {
        rel: 1e-6,
        dot_eps: 0.0,
    };
    /// f32 sums of exact products (CUDA cores, f16 mma.sync): a dot product
    /// with cancelling terms keeps the sums' absolute error, not a relative
    /// one.
    pub const F32: ScoreTol = ScoreTol {
        rel: 1e-5,
        dot_eps: F32_DOT_EPS,
    };
    /// FP8 wgmma.
    pub const FP8_TENSOR_CORE: ScoreTol = ScoreTol {
        rel: 1e-5,
        dot_eps: FP8_TENSOR_CORE_EPS,
    };
}

/// A score's float64 value and the two magnitudes its tolerance scales with.
#[derive(Clone, Copy, Debug)]
pub struct RefScore {
    pub value: f64,
    /// `k_scale * sum_h |w_h * (q_h . k)|`.
    pub weighted: f64,
    /// `k_scale * sum_h |w_h| * sum_d |q_hd k_d|`.
    pub terms: f64,
}

impl RefScore {
    pub fn tolerance(&self, tol: ScoreTol) -> f64 {
        tol.rel * self.weighted + tol.dot_eps * self.terms + 1e-30
    }
}

/// `k_scale * sum_h w_h * relu(q_h . k)` in float64 over `heads` query rows
/// of 128 codes (docs/indexer.md §3).
pub fn score_of(q: &[u8], weights: &[f32], key: &[u8], k_scale: f64, fmt: Fp8Format) -> RefScore {
    let (mut value, mut weighted, mut terms) = (0f64, 0f64, 0f64);
    for (qh, &w) in q.chunks_exact(DIM).zip(weights) {
        let (mut dot, mut abs) = (0f64, 0f64);
        for (&a, &b) in qh.iter().zip(key) {
            let t = f64::from(decode(a, fmt)) * f64::from(decode(b, fmt));
            dot += t;
            abs += t.abs();
        }
        let w = f64::from(w);
        value += w * dot.max(0.0);
        weighted += (w * dot).abs();
        terms += w.abs() * abs;
    }
    RefScore {
        value: k_scale * value,
        weighted: k_scale * weighted,
        terms: k_scale * terms,
    }
}

pub fn fp8_max(fmt: Fp8Format) -> f64 {
    match fmt {
        Fp8Format::E4m3Fn => 448.0,
        Fp8Format::E4m3Fnuz => 240.0,
    }
}

pub fn dtype_of(fmt: Fp8Format) -> unikv_dtype {
    match fmt {
        Fp8Format::E4m3Fn => unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
        Fp8Format::E4m3Fnuz => unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ,
    }
}

/// `y = H x`, H the 128 x 128 Sylvester matrix `(-1)^popcount(i & j) / sqrt(128)`.
pub fn hadamard_ref(x: &[f64]) -> Vec<f64> {
    (0..DIM)
        .map(|i| {
            let s: f64 = (0..DIM)
                .map(|j| {
                    if (i & j).count_ones() % 2 == 0 {
                        x[j]
                    } else {
                        -x[j]
                    }
                })
                .sum();
            s / (DIM as f64).sqrt()
        })
        .collect()
}

/// GPT-J rotation of dims 64..127 by a table row of (cos, sin) pairs.
pub fn rope_ref(x: &mut [f64], row: &[f32]) {
    for i in 0..32 {
        let (c, s) = (f64::from(row[2 * i]), f64::from(row[2 * i + 1]));
        let (re, im) = (x[64 + 2 * i], x[65 + 2 * i]);
        x[64 + 2 * i] = re * c - im * s;
        x[65 + 2 * i] = re * s + im * c;
    }
}

/// The scale docs/fp8.md §3 prescribes for exact transformed values `y`:
/// `max(amax, 1e-4) / fp8_max`.
pub fn ref_scale(y: &[f64], fmt: Fp8Format) -> f64 {
    y.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-4) / fp8_max(fmt)
}

/// Each code within half an FP8 step of `y / scale`, plus a slack of 1e-5 of
/// the format's max for the op's fp32 transform (a few ulps of the vector's
/// norm).
pub fn check_codes(codes: &[u8], scale: f64, y: &[f64], fmt: Fp8Format, what: &str) {
    let bias = match fmt {
        Fp8Format::E4m3Fn => 7,
        Fp8Format::E4m3Fnuz => 8,
    };
    for (i, (&c, &v)) in codes.iter().zip(y).enumerate() {
        let v = v / scale;
        let half_step = (v.abs() / 16.0).max(2f64.powi(-bias - 3));
        let got = f64::from(decode(c, fmt));
        assert!(
            (got - v).abs() <= half_step + 1e-5 * fp8_max(fmt),
            "{what} dim {i}: code {c:#04x} = {got}, want {v}"
        );
    }
}

/// `got` within 1e-5 relative of `want` (or both below 1e-30).
pub fn close(got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() <= 1e-5 * want.abs() + 1e-30,
        "{what}: {got}, want {want}"
    );
}

/// A 16-byte aligned host copy of `data` (the ops need aligned rows).
pub fn aligned<T>(data: &[T]) -> cache_store::HostBytes {
    cache_store::HostBytes::from_bytes(&bytes_of(data))
}

fn desc(data: *mut c_void, dtype: unikv_dtype, shape: &[usize], strides: &[usize]) -> unikv_tensor {
    let mut t = absent();
    t.data = data;
    t.dtype = dtype as u32;
    t.ndim = shape.len() as u32;
    for axis in 0..shape.len() {
        t.shape[axis] = shape[axis] as i64;
        t.strides[axis] = strides[axis] as i64;
    }
    t
}

fn index_bytes(values: &[i64], wide: bool) -> Vec<u8> {
    if wide {
        bytes_of(values)
    } else {
        bytes_of(&values.iter().map(|&v| v as i32).collect::<Vec<_>>())
    }
}

fn index_dtype(wide: bool) -> unikv_dtype {
    if wide {
        unikv_dtype::UNIKV_DTYPE_I64
    } else {
        unikv_dtype::UNIKV_DTYPE_I32
    }
}

/// A RoPE table of `max_pos` rows with angles of every size.
pub fn random_table(rng: &mut StdRng, max_pos: usize) -> Vec<f32> {
    (0..max_pos * 32)
        .flat_map(|_| {
            let a: f64 = rng.random_range(-10.0..10.0);
            [a.cos() as f32, a.sin() as f32]
        })
        .collect()
}
