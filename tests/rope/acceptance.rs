//! Rounding and acceptance: bf16 ranks, the accepted range of an output, and
//! the tally of wide ranges.

use super::*;

/// The bf16 nearest to `x` (ties to even), rounded from f64 directly.
pub(crate) fn bf16_nearest(x: f64) -> f64 {
    if x == 0.0 {
        return x;
    }
    let exp = ((x.to_bits() >> 52) & 0x7FF) as i32 - 1023;
    assert!(
        (-126..=127).contains(&exp),
        "{x} is outside bf16's normal range"
    );
    let step = 2f64.powi(exp - 7);
    (x / step).round_ties_even() * step
}

/// The spacing of f32 values in the binade of `x` (floored at the subnormal step).
pub(crate) fn f32_ulp(x: f64) -> f64 {
    let exp = (((x.abs() as f32).to_bits() >> 23) & 0xFF) as i32 - 127;
    2f64.powi(exp.max(-126) - 23)
}

/// The spacing of bf16 values in the binade of `x`.
pub(crate) fn bf16_ulp(x: f64) -> f64 {
    f32_ulp(x) * 65536.0
}

/// The index of a bf16 value on the ordered line of bf16 values (adjacent values
/// differ by 1, both zeros are 0).
pub(crate) fn bf16_rank(v: f64) -> i64 {
    let f = v as f32;
    assert_eq!(f64::from(f), v, "{v} is not an f32");
    let bits = f.to_bits();
    assert_eq!(bits & 0xFFFF, 0, "{v} is not a bf16 value");
    let magnitude = i64::from((bits >> 16) & 0x7FFF);
    if bits >> 31 == 1 {
        -magnitude
    } else {
        magnitude
    }
}

/// The bf16 values, by rank, a result within `err` of `exact` may round to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Accept {
    pub(crate) lo: i64,
    pub(crate) hi: i64,
}

impl Accept {
    pub(crate) fn new(exact: f64, err: f64) -> Self {
        Accept {
            lo: bf16_rank(bf16_nearest(exact - err)),
            hi: bf16_rank(bf16_nearest(exact + err)),
        }
    }

    pub(crate) fn union(self, other: Accept) -> Accept {
        Accept {
            lo: self.lo.min(other.lo),
            hi: self.hi.max(other.hi),
        }
    }

    /// How many bf16 ulps the accepted range spans.
    pub(crate) fn width(&self) -> i64 {
        self.hi - self.lo
    }

    pub(crate) fn contains(&self, got: f32) -> bool {
        (self.lo..=self.hi).contains(&bf16_rank(f64::from(got)))
    }

    /// The accepted bf16 values themselves (one or two for a 1-ulp range).
    pub(crate) fn values(&self) -> Vec<f64> {
        (self.lo..=self.hi).map(value_of_rank).collect()
    }
}

pub(crate) fn value_of_rank(rank: i64) -> f64 {
    let sign = if rank < 0 { 1 << 31 } else { 0 };
    let bits = ((rank.unsigned_abs() as u32) << 16) | sign;
    f64::from(f32::from_bits(bits))
}

/// Counts of the row-preparation checks.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) checked: usize,
    /// Elements whose accepted range is wider than 1 bf16 ulp.
    pub(crate) wide: usize,
}

impl Tally {
    pub(crate) fn add(&mut self, accept: &Accept) {
        self.checked += 1;
        self.wide += usize::from(accept.width() > 1);
    }

    pub(crate) fn assert_rare_wide(&self, what: &str) {
        eprintln!(
            "{what}: {} elements, {} with a range over 1 bf16 ulp",
            self.checked, self.wide
        );
        assert!(
            (self.wide as f64) <= WIDE_FRACTION * self.checked as f64,
            "{what}: {} of {} elements needed more than 1 bf16 ulp",
            self.wide,
            self.checked
        );
    }
}
