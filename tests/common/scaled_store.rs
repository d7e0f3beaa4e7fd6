//! One `unikv_store_scaled_fp8` call (docs/fp8.md §8) with its inputs, shared
//! by tests/kv_sources (CPU backend, against the test's own model) and
//! tests/gpu/scaled_store.rs (GPU against the CPU backend).

use std::ptr;

use half::bf16;
use rand::seq::SliceRandom;
use rand::Rng;
use unikv::ffi::cache_store::{unikv_store_scaled_fp8, unikv_store_scaled_fp8_args};
use unikv::ffi::status::unikv_status;
use unikv::ffi::types::unikv_dtype;

use super::{Ctx, Dev};

/// Dims per row.
pub const DIMS: usize = 512;

/// The (flavour, divisor) pairs a store accepts: 0 is the flavour's maximum.
pub const FLAVOURS: [(unikv_dtype, u32); 7] = [
    (unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN, 0),
    (unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN, 448),
    (unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN, 240),
    (unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN, 224),
    (unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ, 0),
    (unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ, 240),
    (unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ, 224),
];

/// The inputs of one store: `rows` latents, each to `locations[t]` (negative:
/// skipped) of a `num_rows`-row output.
#[derive(Debug, Clone)]
pub struct ScaledCase {
    pub dtype: unikv_dtype,
    pub divisor: u32,
    pub num_rows: usize,
    pub rows: Vec<bf16>,
    pub locations: Vec<i64>,
    pub loc_i64: bool,
}

impl ScaledCase {
    /// Random latents whose tiles span many binades, to distinct rows of a
    /// larger output (a few skipped).
    pub fn random(rng: &mut impl Rng, dtype: unikv_dtype, divisor: u32, tokens: usize) -> Self {
        let num_rows = tokens + tokens / 2 + 3;
        let mut slots: Vec<i64> = (0..num_rows as i64).collect();
        slots.shuffle(rng);
        let mut locations = slots[..tokens].to_vec();
        for l in locations.iter_mut() {
            if rng.random_bool(0.1) {
                *l = -1;
            }
        }
        let mut rows = Vec::with_capacity(tokens * DIMS);
        for _ in 0..tokens * DIMS / 64 {
            let magnitude = 2f32.powi(rng.random_range(-20..12));
            for _ in 0..64 {
                rows.push(bf16::from_f32(rng.random_range(-1.0f32..1.0) * magnitude));
            }
        }
        ScaledCase {
            dtype,
            divisor,
            num_rows,
            rows,
            locations,
            loc_i64: rng.random(),
        }
    }

    pub fn tokens(&self) -> usize {
        self.locations.len()
    }

    /// Edge-case tiles over the first rows: zeros, a NaN, ±Inf, values near
    /// the bf16 maximum, bf16 subnormals, and values whose scaled codes are
    /// ties between FP8 neighbours.
    pub fn with_specials(mut self) -> Self {
        let tiles = super::cache_store::codec_edge_tiles();
        let values: Vec<bf16> = tiles.iter().flatten().map(|&x| bf16::from_f32(x)).collect();
        let n = values.len().min(self.rows.len());
        self.rows[..n].copy_from_slice(&values[..n]);
        self
    }

    /// Runs the store on `ctx` into `codes` / `scales` (`num_rows` rows).
    pub fn run(&self, ctx: &Ctx, codes: &Dev, scales: &Dev) -> unikv_status {
        self.run_with(ctx, codes, scales, &|_| {})
    }

    /// `run` after `edit` changed the arguments.
    pub fn run_with(
        &self,
        ctx: &Ctx,
        codes: &Dev,
        scales: &Dev,
        edit: &dyn Fn(&mut unikv_store_scaled_fp8_args),
    ) -> unikv_status {
        let rows = Dev::upload(ctx, &self.rows);
        let (loc, loc_t) = if self.loc_i64 {
            let d = Dev::upload(ctx, &self.locations);
            let t = d.t::<i64>(&[self.tokens()]);
            (d, t)
        } else {
            let l32: Vec<i32> = self.locations.iter().map(|&l| l as i32).collect();
            let d = Dev::upload(ctx, &l32);
            let t = d.t::<i32>(&[self.tokens()]);
            (d, t)
        };
        let mut a = unikv_store_scaled_fp8_args {
            struct_size: std::mem::size_of::<unikv_store_scaled_fp8_args>(),
            codes: codes.t::<u8>(&[self.num_rows, DIMS]),
            scales: scales.t::<f32>(&[self.num_rows, 8]),
            kv: rows.t::<bf16>(&[self.tokens(), DIMS]),
            loc: loc_t,
            cache_dtype: self.dtype as u32,
            scale_divisor: self.divisor,
            num_tokens: self.tokens() as u32,
            reserved: 0,
        };
        edit(&mut a);
        let status = unsafe { unikv_store_scaled_fp8(ctx.0, &a, ptr::null_mut()) };
        drop(loc);
        status
    }

    /// Poisoned output buffers of this case's size on `ctx`.
    pub fn outputs<'a>(&self, ctx: &'a Ctx) -> (Dev<'a>, Dev<'a>) {
        let codes = Dev::zeroed(ctx, self.num_rows * DIMS);
        let scales = Dev::zeroed(ctx, self.num_rows * 8 * 4);
        codes.poison();
        scales.poison();
        (codes, scales)
    }
}
