//! Merge of partial attention results on the host (see `ops::merge`).

use half::bf16;
use rayon::prelude::*;

use crate::args::merge::MergeArgs;
use crate::geometry::HEAD_DIM;

pub fn merge(threads: &rayon::ThreadPool, a: &MergeArgs) {
    threads.install(|| {
        (0..a.num_tokens * a.num_heads)
            .into_par_iter()
            .for_each(|item| {
                let (t, h) = (item / a.num_heads, item % a.num_heads);
                // SAFETY: extents checked by `ops::merge`; each item writes its own row.
                unsafe { merge_row(a, t, h) };
            })
    });
}

/// # Safety
/// Host views checked by `ops::merge`; (t, h) is this call's exclusive output row.
unsafe fn merge_row(a: &MergeArgs, t: usize, h: usize) {
    let lse_of = |p: usize| *a.parts_lse.as_ptr().add(a.parts_lse.offset([p, t, h]));
    let sink = a.sink.map_or(f32::NEG_INFINITY, |s| *s.as_ptr().add(h));
    let max = (0..a.num_parts).map(lse_of).fold(sink, f32::max);
    let mut acc = [0f32; HEAD_DIM];
    let lse = if max == f32::NEG_INFINITY {
        f32::NEG_INFINITY
    } else {
        let mut denom = (sink - max).exp();
        for p in 0..a.num_parts {
            let l = lse_of(p);
            if l == f32::NEG_INFINITY {
                continue; // an empty part: its output is not read
            }
            let w = (l - max).exp();
            denom += w;
            let row = a.parts_out.as_ptr().add(a.parts_out.offset([p, t, h, 0]));
            for (d, x) in acc.iter_mut().enumerate() {
                *x += w * (*row.add(d)).to_f32();
            }
        }
        for x in acc.iter_mut() {
            *x /= denom;
        }
        max + denom.ln()
    };
    let out = a.out.as_ptr().add(a.out.offset([t, h, 0]));
    for (d, x) in acc.iter().enumerate() {
        out.add(d).write(bf16::from_f32(*x));
    }
    if let Some(l) = &a.lse {
        l.as_ptr().add(l.offset([t, h])).write(lse);
    }
}
