//! Fused Q/KV preparation on the host: every position and pool row is checked
//! first, then tokens run in parallel, each writing only its own `q_out` rows,
//! `kv_out` row and pool row, so a rejected call writes nothing.

use half::bf16;
use rayon::prelude::*;

use crate::args::prepare::PrepareQkvArgs;
use crate::backend::host::{put_layer_row, put_row, put_row3, row, row3, slice};
use crate::backend::rules::prepare::{destinations, Destination};
use crate::error::Result;
use crate::geometry::HEAD_DIM;
use crate::rope::{prepare_kv_row, prepare_q_row};

pub fn prepare_qkv(threads: &rayon::ThreadPool, a: &PrepareQkvArgs) -> Result<()> {
    let dst = destinations(a)?;
    // SAFETY: host view of exactly HEAD_DIM values (checked by `ops::prepare`).
    let weight: Vec<f32> = unsafe { slice(&a.kv_weight, HEAD_DIM) }
        .iter()
        .map(|w| w.to_f32())
        .collect();
    threads.install(|| {
        dst.par_iter()
            .enumerate()
            .for_each_init(Vec::new, |scratch, (t, d)| {
                // SAFETY: positions and rows were checked; token t's outputs
                // are its own (distinct pool rows were checked too).
                unsafe { prepare_token(a, t, *d, &weight, scratch) }
            })
    });
    Ok(())
}

/// # Safety
/// `d` came from `destinations(a)` for token `t`.
unsafe fn prepare_token(
    a: &PrepareQkvArgs,
    t: usize,
    d: Destination,
    weight: &[f32],
    x: &mut Vec<f32>,
) {
    let table = row(&a.rope_table, d.position);
    // Each input row is copied out before its output is written: `kv_out` may
    // be `kv_in` itself, and `q_out` may be `q_in`.
    x.clear();
    x.extend(row(&a.kv_in, t).iter().map(|v| v.to_f32()));
    prepare_kv_row(x, weight, a.kv_eps, table);
    let mut out = [bf16::ZERO; HEAD_DIM];
    to_bf16(x, &mut out);
    if let Some(kv_out) = &a.kv_out {
        put_row(kv_out, t, &out);
    }
    if let Some(r) = d.row {
        put_layer_row(&a.pool_layer, r, &out);
    }
    for h in 0..a.num_heads {
        x.clear();
        x.extend(row3(&a.q_in, t, h).iter().map(|v| v.to_f32()));
        prepare_q_row(x, a.q_eps, table);
        to_bf16(x, &mut out);
        put_row3(&a.q_out, t, h, &out);
    }
}

/// Exact: the row preparation leaves bf16 values.
fn to_bf16(x: &[f32], out: &mut [bf16; HEAD_DIM]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = bf16::from_f32(v);
    }
}
