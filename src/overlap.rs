//! Byte footprints of tensor views, and an exact test of whether two share a
//! byte.
//!
//! A validated view (`tensor::View`) addresses, for every index of its outer
//! axes, one contiguous run of `shape[N-1] * elem` bytes, and each outer
//! stride is at least the extent of one sub-block of the axis below, so the
//! sub-blocks of every axis are disjoint and ordered by address. A
//! `Footprint` keeps exactly that structure in bytes; `overlaps` decides
//! whether two footprints meet without enumerating their bytes. The
//! operations use it to refuse an output that overlaps another argument
//! (`ops::aliasing`); separate allocations are settled by their bounding
//! intervals, interleaved slices of one buffer by a few sub-block pairs.
//!
//! Addresses and extents are i128: an address (below 2^64) plus extents
//! (each below 2^63, as `RawTensor::view` checks) cannot wrap.

use crate::tensor::{View, MAX_DIMS};

/// Outer axes a footprint keeps; the innermost axis is its run.
const MAX_OUTER: usize = MAX_DIMS - 1;

/// Sub-block pairs `overlaps` examines before it answers "overlap" without
/// looking further. Interleaved slices of one buffer with a common row stride
/// need a handful; only unrelated strides inside one buffer need many.
const BUDGET: u32 = 1 << 16;

/// The bytes a view addresses. Empty (a zero extent) by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint {
    base: i128,
    /// Outer axes, outermost first: (count >= 2, stride in bytes); `rank` used.
    axes: [(i128, i128); MAX_OUTER],
    rank: usize,
    /// `extents[k]`: bytes from the first to one past the last byte of one
    /// sub-block of level k (axes k..); `extents[rank]` is the run. All 0 for
    /// an empty footprint.
    extents: [i128; MAX_OUTER + 1],
}

impl Footprint {
    /// The bytes of a validated view.
    pub fn of<T, const N: usize>(view: &View<T, N>) -> Self {
        let elem = std::mem::size_of::<T>() as i128;
        let mut outer = [(0i128, 0i128); MAX_OUTER];
        let outer_axes = N.saturating_sub(1);
        for (axis, o) in outer.iter_mut().enumerate().take(outer_axes) {
            *o = (view.shape[axis] as i128, view.strides[axis] as i128 * elem);
        }
        let run = view.shape.last().map_or(1, |&n| n as i128) * elem;
        Self::new(view.as_ptr() as usize as i128, &outer[..outer_axes], run)
    }

    /// `len` contiguous bytes from `ptr`.
    pub fn bytes(ptr: *const u8, len: usize) -> Self {
        Self::new(ptr as usize as i128, &[], len as i128)
    }

    /// `run` bytes at `base + sum_k i_k * stride_k` for every index with
    /// `i_k < count_k` (`outer` outermost first). Each stride must be at least
    /// the extent of one sub-block below it (the view rule). Axes of extent
    /// one are dropped and abutting axes merged, so a contiguous view is one
    /// run.
    fn new(base: i128, outer: &[(i128, i128)], run: i128) -> Self {
        let mut f = Footprint::default();
        if run == 0 || outer.iter().any(|&(count, _)| count == 0) {
            return f;
        }
        f.base = base;
        for &(count, stride) in outer.iter().filter(|&&(count, _)| count > 1) {
            match f.rank.checked_sub(1) {
                // The previous axis steps over exactly `count` of these.
                Some(k) if f.axes[k].1 == count * stride => {
                    f.axes[k] = (f.axes[k].0 * count, stride);
                }
                _ => {
                    f.axes[f.rank] = (count, stride);
                    f.rank += 1;
                }
            }
        }
        let mut run = run;
        while f.rank > 0 && f.axes[f.rank - 1].1 == run {
            f.rank -= 1;
            run *= f.axes[f.rank].0;
            f.axes[f.rank] = (0, 0); // unused slots stay zero: equal layouts compare equal
        }
        f.extents[f.rank] = run;
        for k in (0..f.rank).rev() {
            let (count, stride) = f.axes[k];
            debug_assert!(stride >= f.extents[k + 1], "sub-blocks of axis {k} overlap");
            f.extents[k] = (count - 1) * stride + f.extents[k + 1];
        }
        f
    }

    pub fn is_empty(&self) -> bool {
        self.extents[0] == 0
    }

    /// Whether some byte belongs to both footprints. Exact, except that a
    /// pair of layouts needing more than `BUDGET` sub-block pairs counts as
    /// overlapping.
    pub fn overlaps(&self, other: &Footprint) -> bool {
        let mut budget = BUDGET;
        self.overlaps_within(other, &mut budget)
    }

    fn overlaps_within(&self, other: &Footprint, budget: &mut u32) -> bool {
        !self.is_empty() && !other.is_empty() && meet(self.block(), other.block(), budget)
    }

    fn block(&self) -> Block<'_> {
        Block {
            f: self,
            level: 0,
            start: self.base,
        }
    }
}

/// One sub-block of a footprint: its axes `level..` placed at `start`.
#[derive(Clone, Copy)]
struct Block<'a> {
    f: &'a Footprint,
    level: usize,
    start: i128,
}

impl Block<'_> {
    fn end(&self) -> i128 {
        self.start + self.f.extents[self.level]
    }

    /// (count, stride) of the block's outermost axis; None for a run.
    fn outer(&self) -> Option<(i128, i128)> {
        (self.level < self.f.rank).then(|| self.f.axes[self.level])
    }

    /// The extent of one of the block's sub-blocks.
    fn child_extent(&self) -> i128 {
        self.f.extents[self.level + 1]
    }

    fn child(&self, i: i128) -> Self {
        let (_, stride) = self.f.axes[self.level];
        Block {
            f: self.f,
            level: self.level + 1,
            start: self.start + i * stride,
        }
    }
}

/// `ceil(x / d)` for `d > 0`.
fn div_ceil(x: i128, d: i128) -> i128 {
    -(-x).div_euclid(d)
}

fn meet(a: Block, b: Block, budget: &mut u32) -> bool {
    if a.end() <= b.start || b.end() <= a.start {
        return false;
    }
    let (outer_a, outer_b) = (a.outer(), b.outer());
    if outer_a.is_none() && outer_b.is_none() {
        return true; // two runs whose intervals meet
    }
    if *budget == 0 {
        return true;
    }
    *budget -= 1;
    match (outer_a, outer_b) {
        (Some((count_a, sa)), Some((count_b, sb))) if sa == sb => {
            same_stride(a, b, (count_a, count_b), sa, budget)
        }
        // Split the block with the larger stride: fewer of its sub-blocks
        // fit in the other's interval.
        (Some((_, sa)), Some((_, sb))) if sa < sb => split(b, a, budget),
        (Some(_), _) => split(a, b, budget),
        _ => split(b, a, budget),
    }
}

/// Whether `small` meets one of `big`'s sub-blocks (`big` has an outer axis).
fn split(big: Block, small: Block, budget: &mut u32) -> bool {
    let Some((count, stride)) = big.outer() else {
        unreachable!("split of a run")
    };
    let extent = big.child_extent();
    // Sub-block i spans [big.start + i * stride, + extent): it meets small's
    // interval iff it starts before small.end() and ends after small.start.
    let first = ((small.start - extent - big.start).div_euclid(stride) + 1).max(0);
    let last = (div_ceil(small.end() - big.start, stride) - 1).min(count - 1);
    if first > last {
        return false;
    }
    // A contiguous `small` holding bytes of two sub-blocks holds every
    // sub-block between them whole (sub-blocks are ordered, extent <= stride).
    if small.outer().is_none() && last - first >= 2 {
        return true;
    }
    (first..=last).any(|i| meet(big.child(i), small, budget))
}

/// Both blocks step their sub-blocks by `stride`: sub-block i + k of `b`
/// starts `k * stride + d` after sub-block i of `a` (d = b.start - a.start),
/// so the pair's intervals meet only for the (at most two) k with
/// `-extent_b < k * stride + d < extent_a`, and by translation one pair per
/// such k decides for all of them.
fn same_stride(
    a: Block,
    b: Block,
    (count_a, count_b): (i128, i128),
    stride: i128,
    budget: &mut u32,
) -> bool {
    let (extent_a, extent_b) = (a.child_extent(), b.child_extent());
    let d = b.start - a.start;
    let k_min = (-extent_b - d).div_euclid(stride) + 1;
    let k_max = div_ceil(extent_a - d, stride) - 1;
    (k_min..=k_max).any(|k| {
        // The first i with both sub-block i of a and i + k of b present.
        let i = (-k).max(0);
        i < count_a.min(count_b - k) && meet(a.child(i), b.child(i + k), budget)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{Extent, RawTensor};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// A layout in bytes: base, outer (count, stride) outermost first, run.
    #[derive(Debug, Clone)]
    struct Layout {
        base: i128,
        outer: Vec<(i128, i128)>,
        run: i128,
    }

    impl Layout {
        fn footprint(&self) -> Footprint {
            Footprint::new(self.base, &self.outer, self.run)
        }

        /// Every byte, by enumeration.
        fn bytes(&self) -> Vec<i128> {
            let mut starts = vec![self.base];
            for &(count, stride) in &self.outer {
                starts = starts
                    .iter()
                    .flat_map(|&s| (0..count).map(move |i| s + i * stride))
                    .collect();
            }
            starts
                .iter()
                .flat_map(|&s| (0..self.run).map(move |b| s + b))
                .collect()
        }
    }

    /// Outer strides (innermost first) obeying the view rule, sometimes
    /// padded, for the given counts and run.
    fn strides(rng: &mut StdRng, counts: &[i128], run: i128) -> Vec<i128> {
        let mut below = run;
        let mut out = Vec::new();
        for &count in counts.iter().rev() {
            let stride = below
                + if rng.random_bool(0.5) {
                    0
                } else {
                    rng.random_range(1..=6)
                };
            out.push(stride);
            below = stride * count;
        }
        out.reverse();
        out
    }

    fn random_layout(rng: &mut StdRng) -> Layout {
        // A zero extent now and then: an empty view.
        let extent = |rng: &mut StdRng, max| {
            let min = if rng.random_bool(0.05) { 0 } else { 1 };
            rng.random_range(min..=max)
        };
        let rank = rng.random_range(0..=3);
        let counts: Vec<i128> = (0..rank).map(|_| extent(rng, 4)).collect();
        let run = extent(rng, 6);
        let s = strides(rng, &counts, run);
        Layout {
            base: rng.random_range(0..48),
            outer: counts.into_iter().zip(s).collect(),
            run,
        }
    }

    /// Another slice of `a`'s buffer: the same outer strides, another offset,
    /// no more sub-blocks per inner axis and a run within the innermost
    /// stride (column slices of one row-major buffer).
    fn sibling(rng: &mut StdRng, a: &Layout) -> Layout {
        let Some(&(_, inner_stride)) = a.outer.last() else {
            return random_layout(rng);
        };
        if a.run == 0 || a.outer.iter().any(|&(count, _)| count == 0) {
            return random_layout(rng);
        }
        let outer = a
            .outer
            .iter()
            .enumerate()
            .map(|(k, &(count, stride))| {
                let most = if k == 0 { 4 } else { count };
                (rng.random_range(1..=most), stride)
            })
            .collect();
        Layout {
            base: a.base + rng.random_range(-2 * inner_stride..=2 * inner_stride),
            outer,
            run: rng.random_range(1..=inner_stride),
        }
    }

    fn brute_force(a: &Layout, b: &Layout) -> bool {
        let bytes: std::collections::HashSet<i128> = a.bytes().into_iter().collect();
        b.bytes().iter().any(|x| bytes.contains(x))
    }

    #[test]
    fn matches_enumeration_on_random_layouts() {
        let mut rng = StdRng::seed_from_u64(21);
        let (mut met, mut apart) = (0, 0);
        for case in 0..20_000 {
            let a = random_layout(&mut rng);
            let b = if rng.random_bool(0.5) {
                sibling(&mut rng, &a)
            } else {
                random_layout(&mut rng)
            };
            let want = brute_force(&a, &b);
            let (fa, fb) = (a.footprint(), b.footprint());
            assert_eq!(fa.overlaps(&fb), want, "case {case}: {a:?} vs {b:?}");
            assert_eq!(fb.overlaps(&fa), want, "case {case} swapped");
            // Every case stays exact, far inside the budget.
            let mut budget = 64;
            assert_eq!(fa.overlaps_within(&fb, &mut budget), want, "case {case}");
            if want {
                met += 1;
            } else {
                apart += 1;
            }
        }
        assert!(
            met > 2_000 && apart > 2_000,
            "{met} overlapping, {apart} apart"
        );
    }

    /// A view of `shape` / `strides` (elements) at element offset `at` of a
    /// bf16 buffer at a fake, aligned address (views never dereference).
    fn bf16_view<const N: usize>(at: usize, shape: [usize; N], strides: [usize; N]) -> Footprint {
        let mut raw = RawTensor {
            data: (0x10_0000 + 2 * at) as *mut u8,
            dtype: crate::dtype::DType::Bf16.to_raw(),
            ndim: N as u32,
            shape: [0; MAX_DIMS],
            strides: [0; MAX_DIMS],
        };
        for axis in 0..N {
            raw.shape[axis] = shape[axis] as i64;
            raw.strides[axis] = strides[axis] as i64;
        }
        let view: View<half::bf16, N> = raw.view("x", [Extent::AtLeast(0); N], 16).unwrap();
        Footprint::of(&view)
    }

    #[test]
    fn column_slices_of_one_fused_buffer_are_apart() {
        // A fused [T, 3 * 512] bf16 projection: q = 2 heads, then kv.
        let t = 1000;
        let q = bf16_view(0, [t, 2, 512], [1536, 512, 1]);
        let kv = bf16_view(1024, [t, 512], [1536, 1]);
        assert!(!q.overlaps(&kv) && !kv.overlaps(&q));
        // Each head of q against kv and against the other head.
        let head = |h: usize| bf16_view(512 * h, [t, 512], [1536, 1]);
        assert!(!head(0).overlaps(&head(1)) && !head(1).overlaps(&kv));
        assert!(head(1).overlaps(&q) && q.overlaps(&head(0)));
        // kv moved 8 columns left into q's second head, or a token down (one
        // row stride) onto token 1's kv: overlapping.
        assert!(q.overlaps(&bf16_view(1016, [t, 512], [1536, 1])));
        assert!(kv.overlaps(&bf16_view(1024 + 1536, [t, 512], [1536, 1])));
        // q one head after itself (issue 21: q_out one head after q_in).
        assert!(q.overlaps(&bf16_view(512, [t, 2, 512], [1536, 512, 1])));
        // A contiguous [T, 3, 512] view is one run.
        let whole = bf16_view(0, [t, 3, 512], [1536, 512, 1]);
        assert_eq!(whole, Footprint::bytes(0x10_0000 as *const u8, t * 3072));
    }

    #[test]
    fn empty_views_never_overlap() {
        let full = bf16_view(0, [4, 512], [512, 1]);
        for empty in [
            bf16_view(0, [0, 512], [512, 1]),
            bf16_view(0, [4, 0], [512, 1]),
            Footprint::bytes(0x10_0000 as *const u8, 0),
            Footprint::default(),
        ] {
            assert!(empty.is_empty());
            assert!(!empty.overlaps(&full) && !full.overlaps(&empty) && !empty.overlaps(&empty));
        }
    }

    #[test]
    fn extreme_addresses_do_not_wrap() {
        let top = u64::MAX as i128;
        // Rows ending at the last byte of the address space.
        let high = Footprint::new(top - 4095, &[(4, 1024)], 512);
        let low = Footprint::new(0, &[(1 << 40, 1 << 22)], 16);
        assert!(!high.overlaps(&low) && !low.overlaps(&high));
        // The last row is [top - 1023, top - 511); the gap before it is free.
        assert!(!high.overlaps(&Footprint::new(top, &[], 1)));
        assert!(!high.overlaps(&Footprint::new(top - 1024, &[], 1)));
        assert!(high.overlaps(&Footprint::new(top - 1023, &[], 1)));
        // Extents near 2^63 with strides that are not multiples of each other.
        let wide = Footprint::new(top / 2, &[(1 << 30, (1 << 32) + 16)], 16);
        let other = Footprint::new(top / 2 + 8, &[(1 << 30, 1 << 32)], 8);
        assert!(wide.overlaps(&other));
    }

    #[test]
    fn an_exhausted_budget_reports_overlap() {
        // Interleaved rows that never meet, with unrelated strides.
        let a = Footprint::new(0, &[(100, 64)], 16);
        let b = Footprint::new(32, &[(50, 128)], 8);
        assert!(!a.overlaps(&b));
        assert!(a.overlaps_within(&b, &mut 3));
        // Disjoint intervals need no budget.
        let far = Footprint::new(1 << 20, &[(50, 128)], 8);
        assert!(!a.overlaps_within(&far, &mut 0));
    }
}
