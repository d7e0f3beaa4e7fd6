//! Reference math of the fused Q/KV preparation (docs/prepare.md §1, §3, §4, §5) and of
//! the inverse RoPE applied to attention outputs (docs/attention.md §4): the CPU
//! backend computes with it and the GPU kernels must agree with it within 1 bf16
//! ulp per element.
//!
//! Rows hold values as `f32`; inputs are bf16 values widened (the production
//! tensors are bf16). Outputs are rounded to bf16 (`fp8::bf16_round`) exactly
//! where the production CUDA kernels round, and nowhere else:
//!
//! | path | rounds to bf16 | docs |
//! |---|---|---|
//! | Q | after RMSNorm, all 512 dims (the nope output and the RoPE input) | docs/prepare.md §4 step 1 |
//! | Q | after RoPE, the 64 rope dims | docs/prepare.md §4 step 3 |
//! | KV | once, after RMSNorm (nope) and RoPE of the fp32 normalized values (rope) | docs/prepare.md §5 steps 1-3 |
//! | inverse RoPE | once, the rotated output (the op's bf16 output) | docs/attention.md §4 |
//!
//! Where the production kernels disagree, the CUDA JIT kernels decide (docs/prepare.md §4): they
//! are the bit-exact target of docs/fp8.md §3 and the kernels this crate's CUDA backend follows.
//! The Triton kernels rotate Q from the fp32 normalized value; the CUDA Q kernel rounds to bf16
//! before RoPE, and so does `prepare_q_row`.
//!
//! Per-element arithmetic is plain fp32 multiplies and adds in a fixed order, never
//! fused (Rust does not contract `a * b + c`): a kernel that uses `__fmul_rn` /
//! `__fadd_rn` in the same order gets the same fp32 value before the bf16 rounding.

use crate::error::{ensure, err, Result};
use crate::fp8::bf16_round;
use crate::geometry::HEAD_DIM;

/// Rotated dims at the end of each 512-dim row (R in docs/fp8.md §5).
pub const ROPE_DIM: usize = 64;

/// YaRN frequency interpolation of the compressed layers (docs/prepare.md §3):
/// low-index (fast) frequencies keep their value, high-index (slow) ones are divided
/// by `factor`, with a linear ramp between the dims set by the two betas.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    /// Context extension factor (`rope_scaling.factor`).
    pub factor: f64,
    /// Pre-extension context length L0 (`rope_scaling.original_max_position_embeddings`).
    pub original_max_position: u64,
    /// A dim whose frequency turns more than `beta_fast` times over L0 keeps it
    /// (sets the ramp's low end).
    pub beta_fast: f64,
    /// A dim whose frequency turns fewer than `beta_slow` times over L0 is divided
    /// by `factor` in full (sets the ramp's high end).
    pub beta_slow: f64,
}

/// How a layer's RoPE table is built. Dense layers use `rope_theta` (10 000) with no
/// YaRN; compressed layers use `compress_rope_theta` (40 000) with YaRN (docs/prepare.md §3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeConfig {
    /// Frequency base theta: `omega_i = base^(-2i / rotary_dim)`.
    pub base: f64,
    /// Rotated dims per row; a table row holds `rotary_dim` floats.
    pub rotary_dim: usize,
    /// YaRN correction, `None` for `original_seq_len = 0`.
    pub yarn: Option<Yarn>,
}

impl RopeConfig {
    /// A DeepSeek-V4 table configuration: 64 rotated dims.
    pub fn new(base: f64, yarn: Option<Yarn>) -> Self {
        RopeConfig {
            base,
            rotary_dim: ROPE_DIM,
            yarn,
        }
    }

    fn validate(&self) -> Result<()> {
        ensure!(
            self.base.is_finite() && self.base > 1.0,
            InvalidArgument,
            "base: {} is not a finite number above 1",
            self.base
        );
        ensure!(
            self.rotary_dim > 0 && self.rotary_dim % 2 == 0,
            InvalidArgument,
            "rotary_dim: {} is not a positive even number (dims rotate in pairs)",
            self.rotary_dim
        );
        match &self.yarn {
            Some(yarn) => yarn.validate(),
            None => Ok(()),
        }
    }

    /// `omega_i` for each pair i, YaRN-corrected when configured.
    fn frequencies(&self) -> Vec<f64> {
        let dim = self.rotary_dim as f64;
        let mut omega: Vec<f64> = (0..self.rotary_dim / 2)
            .map(|i| self.base.powf(-2.0 * i as f64 / dim))
            .collect();
        if let Some(yarn) = &self.yarn {
            yarn.interpolate(&mut omega, self.base, self.rotary_dim);
        }
        omega
    }
}

impl Yarn {
    fn validate(&self) -> Result<()> {
        ensure!(
            self.factor.is_finite() && self.factor > 0.0,
            InvalidArgument,
            "yarn.factor: {} is not a finite positive number",
            self.factor
        );
        ensure!(
            self.original_max_position > 0,
            InvalidArgument,
            "yarn.original_max_position: must be positive (no YaRN is `yarn: None`)"
        );
        ensure!(
            self.beta_slow.is_finite() && self.beta_slow > 0.0,
            InvalidArgument,
            "yarn.beta_slow: {} is not a finite positive number",
            self.beta_slow
        );
        // low <= high before clamping needs beta_fast >= beta_slow; otherwise the
        // ramp would run backwards.
        ensure!(
            self.beta_fast.is_finite() && self.beta_fast >= self.beta_slow,
            InvalidArgument,
            "yarn.beta_fast: {} is not a finite number at least beta_slow ({})",
            self.beta_fast,
            self.beta_slow
        );
        Ok(())
    }

    /// The (fractional) dim whose frequency turns `beta` times over L0:
    /// `dim * ln(L0 / (beta * 2 pi)) / (2 ln base)`.
    fn correction_dim(&self, beta: f64, base: f64, rotary_dim: usize) -> f64 {
        let l0 = self.original_max_position as f64;
        rotary_dim as f64 * (l0 / (beta * std::f64::consts::TAU)).ln() / (2.0 * base.ln())
    }

    /// `omega_i <- omega_i / factor * ramp_i + omega_i * (1 - ramp_i)` with
    /// `ramp_i = clamp((i - low) / (high - low), 0, 1)`, `low = floor(..beta_fast..)`
    /// and `high = ceil(..beta_slow..)` clamped to `[0, rotary_dim - 1]`, and
    /// `high += 0.001` when they meet (docs/prepare.md §3).
    fn interpolate(&self, omega: &mut [f64], base: f64, rotary_dim: usize) {
        let top = (rotary_dim - 1) as f64;
        let low = self
            .correction_dim(self.beta_fast, base, rotary_dim)
            .floor()
            .clamp(0.0, top);
        let mut high = self
            .correction_dim(self.beta_slow, base, rotary_dim)
            .ceil()
            .clamp(0.0, top);
        if high == low {
            high += 0.001;
        }
        for (i, w) in omega.iter_mut().enumerate() {
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            *w = *w / self.factor * ramp + *w * (1.0 - ramp);
        }
    }
}

/// Builds the fp32 RoPE table `[max_pos, rotary_dim]` the kernels take (docs/prepare.md
/// §3): row p is `freqs_cis[p]` as interleaved
/// `[cos(p w_0), sin(p w_0), cos(p w_1), sin(p w_1), ...]`, i.e. pair i's
/// `(cos, sin)` sits at `2i, 2i + 1`, next to the pair it rotates.
///
/// Frequencies, angles and cos/sin are computed in f64 and rounded to f32 once, so
/// each entry is within half an f32 ulp (plus ~1e-10 at the largest positions) of
/// the exact value. Building in f32 (as the PyTorch reference does) rounds the
/// angle `p * w` to f32 first, an error of up to half an f32 ulp of the angle that
/// grows with the position (up to 0.004 rad at p = 100 000 for w_0 = 1) and depends
/// on the library's fp32 sin/cos; the f64 table has no position-dependent error.
/// The GPU reads this same table, so the choice does not affect CPU/GPU agreement.
///
/// The table has unit magnitude: docs/prepare.md §3 defines `freqs_cis = exp(j p w_i)` with no
/// YaRN magnitude (mscale) factor, and no attention-scale correction is folded in.
pub fn build_table(cfg: &RopeConfig, max_pos: usize) -> Result<Vec<f32>> {
    ensure!(max_pos > 0, InvalidArgument, "max_pos: must be positive");
    let len = max_pos
        .checked_mul(cfg.rotary_dim)
        .filter(|&n| n <= isize::MAX as usize / 4)
        .ok_or_else(|| {
            err!(
                InvalidArgument,
                "max_pos: {max_pos} rows of {} floats do not fit in memory",
                cfg.rotary_dim
            )
        })?;
    let mut table = vec![0.0; len];
    fill_table(cfg, &mut table)?;
    Ok(table)
}

/// `build_table` into a caller's buffer: one row per whole `rotary_dim` floats of
/// `table` (a trailing partial row is left alone). The config is checked before
/// anything is written.
pub fn fill_table(cfg: &RopeConfig, table: &mut [f32]) -> Result<()> {
    cfg.validate()?;
    let omega = cfg.frequencies();
    for (p, row) in table.chunks_exact_mut(cfg.rotary_dim).enumerate() {
        for (pair, w) in row.chunks_exact_mut(2).zip(&omega) {
            let (sin, cos) = (p as f64 * w).sin_cos();
            pair[0] = cos as f32;
            pair[1] = sin as f32;
        }
    }
    Ok(())
}

/// Row `position` of a table built by `build_table`, or `None` when the position is
/// negative or not below `max_pos`. Positions arrive as int32 or int64; callers
/// widen them to i64.
pub fn table_row(table: &[f32], rotary_dim: usize, position: i64) -> Option<&[f32]> {
    let p = usize::try_from(position).ok()?;
    let start = p.checked_mul(rotary_dim)?;
    table.get(start..start.checked_add(rotary_dim)?)
}

/// Rotates the last `table_row.len()` dims of `row` by the table row's angles, GPT-J
/// style (docs/prepare.md §3): pair `(x[2i], x[2i+1])` is the complex number
/// `x[2i] + j x[2i+1]`, multiplied by `cos + j sin`. The dims before pass through.
/// Computed in fp32, not rounded: the callers round where their path does.
pub fn rope_row(row: &mut [f32], table_row: &[f32]) {
    rotate(row, table_row, 1.0);
}

/// The inverse rotation (multiplication by the conjugate `cos - j sin`), applied to
/// the rope dims of an attention output at the query's position before `wo_a`
/// (docs/attention.md §4, docs/prepare.md §3). The op rounds the result to its bf16
/// output once; the input is the bf16 attention output, so nothing rounds earlier.
pub fn inverse_rope_row(row: &mut [f32], table_row: &[f32]) {
    rotate(row, table_row, -1.0);
}

/// `out[2i] = x[2i] c - x[2i+1] s`, `out[2i+1] = x[2i] s + x[2i+1] c` with
/// `s = sign * sin`. Negating sin is exact, so the inverse is bit-identical to
/// writing the conjugate formula out.
fn rotate(row: &mut [f32], table_row: &[f32], sign: f32) {
    assert!(
        table_row.len() % 2 == 0 && table_row.len() <= row.len(),
        "the table row holds (cos, sin) pairs for the last dims of the row"
    );
    let tail = row.len() - table_row.len();
    for (x, cs) in row[tail..]
        .chunks_exact_mut(2)
        .zip(table_row.chunks_exact(2))
    {
        let (c, s) = (cs[0], sign * cs[1]);
        let (re, im) = (x[0], x[1]);
        x[0] = re * c - im * s;
        x[1] = re * s + im * c;
    }
}

/// RMSNorm over the whole row (docs/prepare.md §1):
/// `y = x * rsqrt(mean(x^2) + eps) * w`, without `w` for Q. Not rounded.
///
/// The production kernels reduce the squares in fp32 in a warp-tree order (docs/prepare.md §1) that a
/// sequential loop cannot reproduce, so here the sum is f64 (order-independent for
/// practical purposes) and the factor `rsqrt(mean + eps)` is rounded to f32 once.
/// A GPU's fp32 factor then differs by a few f32 ulps, which moves an element by at
/// most 1 bf16 ulp after rounding. The products stay f32, in the kernels' order:
/// `(x * factor) * w`.
pub fn rms_norm(row: &mut [f32], weight: Option<&[f32]>, eps: f32) {
    let sum_sq: f64 = row.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    let mean = sum_sq / row.len() as f64;
    let factor = (1.0 / (mean + f64::from(eps)).sqrt()) as f32;
    match weight {
        Some(w) => {
            assert_eq!(w.len(), row.len(), "one weight per dim");
            for (x, w) in row.iter_mut().zip(w) {
                *x = *x * factor * w;
            }
        }
        None => row.iter_mut().for_each(|x| *x *= factor),
    }
}

/// One token's Q, `[H * 512]` (docs/prepare.md §4, after the split-K sum): per
/// head, weightless RMSNorm, then bf16 rounding of all 512 dims, then RoPE of the
/// last 64 from those bf16 values, then bf16 rounding of the rope dims (docs/prepare.md §4, the CUDA
/// Q kernel; see the module docs for the Triton difference). The row then holds
/// `q_out[t]`.
pub fn prepare_q_row(q: &mut [f32], eps: f32, table_row: &[f32]) {
    assert!(
        !q.is_empty() && q.len() % HEAD_DIM == 0,
        "a Q row is H heads of {HEAD_DIM} dims"
    );
    assert_eq!(
        table_row.len(),
        ROPE_DIM,
        "one table row of {ROPE_DIM} floats"
    );
    for head in q.chunks_exact_mut(HEAD_DIM) {
        rms_norm(head, None, eps);
        round_bf16(head);
        rope_row(head, table_row);
        round_bf16(&mut head[HEAD_DIM - ROPE_DIM..]);
    }
}

/// One token's KV row, `[512]` (docs/prepare.md §5): RMSNorm with `weight`, kept
/// in fp32; RoPE of the last 64 dims from the fp32 values; then all 512 dims
/// rounded to bf16 once (docs/prepare.md §5 steps 1-3, as the CUDA K kernel does). The row then holds
/// what the optional `kv_out` receives: the normalized, rotated bf16 row. An FP8 store
/// quantizes the SWA store's nope tiles from these bf16 values (the JIT K
/// kernel quantizes the fp32 ones instead, docs/prepare.md §5).
pub fn prepare_kv_row(kv: &mut [f32], weight: &[f32], eps: f32, table_row: &[f32]) {
    assert_eq!(kv.len(), HEAD_DIM, "a KV row has {HEAD_DIM} dims");
    assert_eq!(
        table_row.len(),
        ROPE_DIM,
        "one table row of {ROPE_DIM} floats"
    );
    rms_norm(kv, Some(weight), eps);
    rope_row(kv, table_row);
    round_bf16(kv);
}

fn round_bf16(values: &mut [f32]) {
    values.iter_mut().for_each(|x| *x = bf16_round(*x));
}
