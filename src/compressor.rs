//! The KV compressor of DeepSeek-V4's compressed layers (docs/compressor.md):
//! its state geometry (per request slot a ring of raw fp32 `kv_score` rows)
//! and the gated pooling of one group of raw tokens into one compressed
//! vector. The CPU backend computes with this module; kernels/compressor.cu
//! performs the same fp32 operations in the same order (`exp_f32`'s
//! polynomial included), so pooled values agree bit for bit. What follows the
//! pooling (RMSNorm, RoPE, the indexer's Hadamard transform, bf16 or FP8 and
//! the store) is `rope::prepare_kv_row` and `indexer::prepare_key`.
//!
//! A ratio-4 layer (CSA) has two compressors, the attention one (`Kv`, 512
//! channels) and the indexer's (`Indexer`, 128 channels, its output rotated
//! by the Hadamard transform); a ratio-128 layer (HCA) has the attention one.
//! A token's `kv_score` row (the caller's GEMM output) is laid out as the
//! state keeps it:
//!
//! ```text
//! ratio 4:    | kv_overlap (D) | kv (D) | score_overlap (D) | score (D) |   (4 D floats)
//! ratio 128:  | kv (D) | score (D) |                                       (2 D floats)
//! ```

use crate::error::{err, Result};
use crate::geometry::{Geometry, Ratio};

/// Channels of the attention compressor (the latent row width).
pub const KV_DIM: usize = 512;
/// Channels of the indexer compressor (the indexer key width).
pub const INDEXER_DIM: usize = 128;
/// Candidates pooled per block of the pooling (`pool_channel`).
pub const POOL_BLOCK: usize = 8;

/// Which compressor of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compressor {
    /// The attention compressor: 512 channels, stored as latent rows.
    Kv,
    /// The indexer compressor of ratio-4 layers: 128 channels, stored as
    /// indexer keys.
    Indexer,
}

impl Compressor {
    pub fn from_raw(raw: u32) -> Result<Self> {
        match raw {
            0 => Ok(Compressor::Kv),
            1 => Ok(Compressor::Indexer),
            _ => Err(err!(
                BadEnum,
                "compressor: {raw} is not a unikv_compressor (0 = KV, 1 = INDEXER)"
            )),
        }
    }

    /// Channels D.
    pub fn dim(self) -> usize {
        match self {
            Compressor::Kv => KV_DIM,
            Compressor::Indexer => INDEXER_DIM,
        }
    }
}

/// One compressor's state inside its layer's state buffer: `slots` rings of
/// `ring` rows of `row_floats()` f32 each, slot-major, starting
/// `offset_floats` floats into the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateGeometry {
    pub ratio: Ratio,
    pub compressor: Compressor,
    pub ring: usize,
    pub slots: usize,
    pub offset_floats: usize,
}

impl StateGeometry {
    pub fn dim(&self) -> usize {
        self.compressor.dim()
    }

    /// Value (and score) channels per row: 2 D for ratio 4 (the overlap
    /// channel and the own one), D for ratio 128.
    pub fn value_floats(&self) -> usize {
        overlap_factor(self.ratio) * self.dim()
    }

    /// Floats of one raw row: values then scores.
    pub fn row_floats(&self) -> usize {
        2 * self.value_floats()
    }

    /// Floats of one slot's ring.
    pub fn slot_floats(&self) -> usize {
        self.ring * self.row_floats()
    }

    /// Floats of the whole state (every slot, 0 included).
    pub fn floats(&self) -> usize {
        self.slots * self.slot_floats()
    }

    /// State row of request slot `slot` at absolute position `pos`: rows are
    /// position-addressed, so a length rollback needs no bookkeeping.
    pub fn row(&self, slot: usize, pos: u64) -> usize {
        slot * self.ring + (pos % self.ring as u64) as usize
    }

    /// Tokens a caller may roll back after appending (speculative decoding):
    /// every row a later group needs is still in the ring after appending up
    /// to this many tokens past the length it returns to.
    pub fn max_rollback(&self) -> usize {
        self.ring + 1 - window_rows(self.ratio)
    }
}

/// A compressor's state in its layer's state buffer: None for a pool
/// without state, a dense layer, or the indexer compressor of a ratio-128
/// layer. Ratio-4 layers keep the attention state first, then the indexer's.
pub fn layer_state(g: &Geometry, layer: usize, compressor: Compressor) -> Option<StateGeometry> {
    let rings = g.config.state?;
    let ratio = g.ratio(layer);
    if ratio == Ratio::Dense || (compressor == Compressor::Indexer && ratio != Ratio::Csa) {
        return None;
    }
    let kv = StateGeometry {
        ratio,
        compressor: Compressor::Kv,
        ring: rings.ring(ratio),
        slots: g.num_slots,
        offset_floats: 0,
    };
    Some(match compressor {
        Compressor::Kv => kv,
        Compressor::Indexer => StateGeometry {
            compressor,
            offset_floats: kv.floats(),
            ..kv
        },
    })
}

/// Floats of a layer's state buffer (0 for dense layers and pools without
/// state), or None when the count overflows.
pub fn state_floats(g: &Geometry, layer: usize) -> Option<usize> {
    let Some(rings) = g.config.state else {
        return Some(0);
    };
    let ratio = g.ratio(layer);
    let row = |c: Compressor| 2 * overlap_factor(ratio) * c.dim();
    let per_row = match ratio {
        Ratio::Dense => 0,
        Ratio::Csa => row(Compressor::Kv) + row(Compressor::Indexer),
        Ratio::Hca => row(Compressor::Kv),
    };
    g.num_slots
        .checked_mul(rings.ring(ratio))?
        .checked_mul(per_row)
}

/// 2 for ratio 4 (overlapping windows), 1 for ratio 128.
pub fn overlap_factor(ratio: Ratio) -> usize {
    match ratio {
        Ratio::Csa => 2,
        _ => 1,
    }
}

/// Raw rows a group's pooling reads: 8 for ratio 4 (the previous group's 4
/// overlap rows and its own 4), 128 for ratio 128.
pub fn window_rows(ratio: Ratio) -> usize {
    match ratio {
        Ratio::Csa => 8,
        r => r.value(),
    }
}

/// Absolute position of the first window row of group `n` (which may be
/// negative for ratio 4's first group: those candidates are masked).
pub fn window_start(ratio: Ratio, n: u64) -> i64 {
    let first = (n * ratio.value() as u64) as i64;
    first - (window_rows(ratio) as i64 - ratio.value() as i64)
}

/// The group that a token at `pos` closes, if its position is the group's last.
pub fn closed_group(ratio: Ratio, pos: u64) -> Option<u64> {
    let r = ratio.value() as u64;
    (r > 0 && (pos + 1) % r == 0).then(|| (pos + 1) / r - 1)
}

/// `exp(x)` in f32 by a fixed sequence of correctly rounded f32 operations
/// (no fused multiply-add), which kernels/compressor.cu repeats exactly:
/// `k = rint(x * log2(e))`, `r = (x - k * ln2_hi) - k * ln2_lo`, a degree-6
/// Taylor polynomial of `exp(r)` in Horner form, times `2^k`. 0 for
/// `x <= -86` (and NaN), so no subnormal is ever produced; within 2 ulps of
/// `exp(x)` for `-86 < x <= 0`, the range the pooling uses.
pub fn exp_f32(x: f32) -> f32 {
    let log2e = f32::from_bits(0x3FB8_AA3B);
    let ln2_hi = f32::from_bits(0x3F31_7200);
    let ln2_lo = f32::from_bits(0x35BF_BE8E);
    let c = [
        f32::from_bits(0x3F00_0000), // 1/2
        f32::from_bits(0x3E2A_AAAB), // 1/6
        f32::from_bits(0x3D2A_AAAB), // 1/24
        f32::from_bits(0x3C08_8889), // 1/120
        f32::from_bits(0x3AB6_0B61), // 1/720
    ];
    // Also catches NaN.
    if x.partial_cmp(&-86.0) != Some(std::cmp::Ordering::Greater) {
        return 0.0;
    }
    let x = x.min(88.0);
    let k = (x * log2e).round_ties_even();
    let r = (x - k * ln2_hi) - k * ln2_lo;
    let mut p = c[4];
    for &ci in c[..4].iter().rev() {
        p = p * r + ci;
    }
    p = p * r + 1.0;
    p = p * r + 1.0;
    let scale = f32::from_bits(((k as i32 + 127) as u32) << 23);
    p * scale
}

/// One channel's pooled value over its candidates `(logit, value)` in
/// order; `None` candidates are masked (weight 0). The candidates are cut
/// into blocks of `POOL_BLOCK`; block k has the maximum `m_k` of its logits,
/// `s_k = sum exp(l - m_k)` and `a_k = sum exp(l - m_k) * v` (in candidate
/// order); the blocks merge as `S = sum s_k * e_k`, `A = sum a_k * e_k` with
/// `e_k = exp(m_k - M)`, `M` the largest `m_k` (in block order); the result
/// is `A / S`. Maxima keep the first value unless a later one is larger (`l >
/// m`). Every step is one f32 operation or `exp_f32`, so a kernel that runs
/// the same blocks in the same order gets the same bits. A block with no
/// unmasked candidate takes no part; with none at all the result is 0.
pub fn pool_channel(candidates: &[Option<(f32, f32)>]) -> f32 {
    let block_max = |b: &[Option<(f32, f32)>]| {
        b.iter()
            .flatten()
            .map(|&(l, _)| l)
            .reduce(|m, l| if l > m { l } else { m })
    };
    let Some(big) = candidates
        .chunks(POOL_BLOCK)
        .filter_map(block_max)
        .reduce(|m, l| if l > m { l } else { m })
    else {
        return 0.0;
    };
    let (mut s, mut a) = (0.0f32, 0.0f32);
    for block in candidates.chunks(POOL_BLOCK) {
        let Some(m) = block_max(block) else { continue };
        let (mut sk, mut ak) = (0.0f32, 0.0f32);
        for &(l, v) in block.iter().flatten() {
            let e = exp_f32(l - m);
            sk += e;
            ak += e * v;
        }
        let e = exp_f32(m - big);
        s += sk * e;
        a += ak * e;
    }
    a / s
}

/// Group `n`'s pooled vector (docs/compressor.md §2), `out.len()` = D
/// channels. `window[i]` is the raw row of absolute position
/// `window_start(ratio, n) + i` (`window_rows(ratio)` rows, each
/// `row_floats` long); for ratio 4 the rows of negative positions (group 0's
/// overlap) are masked and never read. `ape` is the learned position bias
/// `[ratio, value_floats]` row-major: candidate j's logit is its score plus
/// `ape[j % ratio][offset + d]`, the offset being D for ratio 4's own
/// channel and 0 otherwise.
pub fn pool_group(ratio: Ratio, n: u64, window: &[&[f32]], ape: &[f32], out: &mut [f32]) {
    let dim = out.len();
    let values = overlap_factor(ratio) * dim;
    let rows = window_rows(ratio);
    assert_eq!(window.len(), rows, "one raw row per window position");
    assert_eq!(ape.len(), ratio.value() * values, "ape is [ratio, values]");
    let start = window_start(ratio, n);
    let mut candidates = [None; 128];
    for (d, o) in out.iter_mut().enumerate() {
        for (j, c) in candidates[..rows].iter_mut().enumerate() {
            if start + (j as i64) < 0 {
                *c = None;
                continue;
            }
            let row = window[j];
            // Ratio 4: candidates 0..3 read the overlap channel (offset 0) of
            // the previous group's rows, 4..7 the own channel (offset D).
            let (channel, bias) = match ratio {
                Ratio::Csa if j < 4 => (d, j * values + d),
                Ratio::Csa => (dim + d, (j - 4) * values + dim + d),
                _ => (d, j * values + d),
            };
            *c = Some((row[values + channel] + ape[bias], row[channel]));
        }
        *o = pool_channel(&candidates[..rows]);
    }
}

/// Sets a raw row to "empty": values 0, scores -inf (what a released slot's
/// rows hold).
pub fn clear_row(row: &mut [f32]) {
    let half = row.len() / 2;
    row[..half].fill(0.0);
    row[half..].fill(f32::NEG_INFINITY);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulps_over_the_pooling_range() {
        let mut x = -85.999f32;
        while x <= 0.0 {
            let want = (x as f64).exp();
            let got = exp_f32(x) as f64;
            let ulp = f32::EPSILON as f64 * want;
            assert!(
                (got - want).abs() <= 2.0 * ulp,
                "exp({x}) = {got}, want {want}"
            );
            x += 0.0137;
        }
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-86.0), 0.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(f32::NAN), 0.0);
    }

    #[test]
    fn pooling_one_candidate_returns_its_value() {
        assert_eq!(pool_channel(&[Some((3.0, 0.25))]), 0.25);
        assert_eq!(pool_channel(&[None, None]), 0.0);
    }

    #[test]
    fn rollback_allowance_follows_the_ring() {
        let g = |ratio, ring| StateGeometry {
            ratio,
            compressor: Compressor::Kv,
            ring,
            slots: 2,
            offset_floats: 0,
        };
        assert_eq!(g(Ratio::Csa, 8).max_rollback(), 1);
        assert_eq!(g(Ratio::Csa, 16).max_rollback(), 9);
        assert_eq!(g(Ratio::Hca, 128).max_rollback(), 1);
        assert_eq!(g(Ratio::Hca, 256).max_rollback(), 129);
    }
}
