//! Sparse attention on the host: f32 scores and accumulation, exact maximum
//! (two passes over the scores), direct division by the denominator.
//!
//! Work is split into (token, head group) items; every item reads only its own
//! token's keys in a fixed order, so results are deterministic and independent
//! of the other tokens in the batch.

use half::bf16;
use rayon::prelude::*;

use crate::args::attention::{AttentionArgs, KernelFamily, LaunchSummary, PlanShape};
use crate::backend::host::{extend_with_key, row, slice};
use crate::backend::rules::attention::check_source;
use crate::backend::rules::rope::checked_positions;
use crate::error::Result;
use crate::geometry::HEAD_DIM;
use crate::rope::inverse_rope_row;

/// Heads that share one gathered copy of a token's keys.
const HEAD_GROUP: usize = 16;

pub fn attention(threads: &rayon::ThreadPool, a: &AttentionArgs) -> Result<()> {
    for src in a.sources() {
        check_source(src, a.num_tokens, a.skip_negative)?;
    }
    let positions = match &a.inverse_rope {
        Some(e) => {
            // SAFETY: host view with extent checked by `ops::attention`.
            unsafe { checked_positions(&e.positions, a.num_tokens, e.table.shape[0])? }
        }
        None => Vec::new(),
    };
    let groups = a.num_heads.div_ceil(HEAD_GROUP);
    threads.install(|| {
        (0..a.num_tokens * groups).into_par_iter().for_each_init(
            Scratch::default,
            |scratch, item| {
                let (t, g) = (item / groups, item % groups);
                let heads = g * HEAD_GROUP..((g + 1) * HEAD_GROUP).min(a.num_heads);
                // SAFETY: indices (and positions) were checked above; outputs of
                // distinct items are disjoint (token t, heads of group g).
                let table_row = a
                    .inverse_rope
                    .map(|e| unsafe { row(&e.table, positions[t] as usize) });
                unsafe { attend_token(a, t, heads, table_row, scratch) };
            },
        )
    });
    Ok(())
}

#[derive(Default)]
struct Scratch {
    q: Vec<f32>,
    keys: Vec<f32>,
    scores: Vec<f32>,
    acc: Vec<f32>,
}

/// Gathers token t's keys as f32 rows into `keys` (FP8 rows dequantized:
/// exactly for the pool's and FlashMLA's power-of-two scales, rounded to bf16
/// for scaled FP8 rows); returns how many.
///
/// # Safety
/// The sources' indices were checked by `check_source`.
unsafe fn gather(a: &AttentionArgs, t: usize, keys: &mut Vec<f32>) -> usize {
    keys.clear();
    let mut count = 0;
    for src in a.sources() {
        let indptr = slice(&src.indptr, a.num_tokens + 1);
        let (lo, hi) = (indptr[t] as usize, indptr[t + 1] as usize);
        for &r in &slice(&src.indices, hi)[lo..] {
            if r < 0 {
                continue;
            }
            extend_with_key(&src.kv, r as usize, keys);
            count += 1;
        }
    }
    count
}

/// Dot product with a fixed 16-lane accumulation order (vectorises, deterministic).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    for (ca, cb) in a.chunks_exact(16).zip(b.chunks_exact(16)) {
        for i in 0..16 {
            lanes[i] += ca[i] * cb[i];
        }
    }
    lanes.iter().sum()
}

/// # Safety
/// Indices checked; `heads` are this item's exclusive output rows.
/// `inverse_rope`: the epilogue's table row of token t.
unsafe fn attend_token(
    a: &AttentionArgs,
    t: usize,
    heads: std::ops::Range<usize>,
    inverse_rope: Option<&[f32]>,
    scratch: &mut Scratch,
) {
    let count = gather(a, t, &mut scratch.keys);
    let keys = &scratch.keys;
    for h in heads {
        let q_ptr = a.q.as_ptr().add(a.q.offset([t, h, 0]));
        scratch.q.clear();
        scratch.q.extend(
            std::slice::from_raw_parts(q_ptr, HEAD_DIM)
                .iter()
                .map(|x| x.to_f32()),
        );
        let q = &scratch.q;
        let sink = match &a.sink {
            Some(s) => *s.as_ptr().add(h),
            None => f32::NEG_INFINITY,
        };
        scratch.scores.clear();
        scratch.scores.extend(
            keys.chunks_exact(HEAD_DIM)
                .map(|k| dot(q, k) * a.softmax_scale),
        );
        scratch.acc.clear();
        scratch.acc.resize(HEAD_DIM, 0.0);
        let lse = if count == 0 {
            // No keys: zero output; the log-sum-exp is the sink's alone.
            sink
        } else {
            let max = scratch.scores.iter().copied().fold(sink, f32::max);
            let mut denom = (sink - max).exp();
            for (s, k) in scratch.scores.iter().zip(keys.chunks_exact(HEAD_DIM)) {
                let w = (s - max).exp();
                denom += w;
                for (acc, x) in scratch.acc.iter_mut().zip(k) {
                    *acc += w * x;
                }
            }
            for acc in scratch.acc.iter_mut() {
                *acc /= denom;
            }
            if let Some(cs) = inverse_rope {
                inverse_rope_row(&mut scratch.acc, cs);
            }
            max + denom.ln()
        };
        let out_ptr = a.out.as_ptr().add(a.out.offset([t, h, 0]));
        for (d, acc) in scratch.acc.iter().enumerate() {
            out_ptr.add(d).write(bf16::from_f32(*acc));
        }
        if let Some(l) = &a.lse {
            l.as_ptr().add(l.offset([t, h])).write(lse);
        }
    }
}

/// The CPU plan: (token, 16-head group) work items, no splits, no workspace.
pub fn summary(shape: &PlanShape) -> LaunchSummary {
    LaunchSummary {
        family: KernelFamily::CpuReference,
        head_block: HEAD_GROUP,
        head_blocks: shape.num_heads.div_ceil(HEAD_GROUP),
        max_splits: 1,
        cluster_merge: false,
        stages: 0,
        dependent_launch: false,
        raw_fp8_variant: false,
        sm_count: 0,
        long_splits: 0,
        long_keys: 0,
    }
}
