//! Fused Q/KV preparation on the host: every position and pool row is checked
//! first, then tokens run in parallel, each writing only its own `q_out` rows,
//! `kv_out` row and pool row, so a rejected call writes nothing.

use std::collections::HashMap;

use half::bf16;
use rayon::prelude::*;

use crate::backend::cpu::host::{int_values, put_layer_row, put_row, put_row3, row, row3, slice};
use crate::backend::cpu::rope::checked_positions;
use crate::error::{ensure, err, Result};
use crate::geometry::HEAD_DIM;
use crate::ops::prepare::PrepareQkvArgs;
use crate::rope::{prepare_kv_row, prepare_q_row};

/// Token t's table row and its pool row (None: no store).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Destination {
    pub position: usize,
    pub row: Option<usize>,
}

/// Checks every position against the table, every non-negative row against
/// the layer, and that no two tokens store into one row (they would race on a
/// GPU). Reads only the integer arguments, so the GPU backend's validate mode
/// runs it on host copies.
pub(crate) fn destinations(a: &PrepareQkvArgs) -> Result<Vec<Destination>> {
    let n = a.num_tokens;
    let max_pos = a.rope_table.shape[0];
    let layer_rows = a.pool_layer.rows();
    // SAFETY: host views with extents checked by `ops::prepare`.
    let positions = unsafe { checked_positions(&a.positions, n, max_pos)? };
    // SAFETY: as above.
    let rows = a.rows.map(|r| unsafe { int_values(&r, n) });
    let mut owner = HashMap::new();
    let mut out = Vec::with_capacity(n);
    for (t, &p) in positions.iter().enumerate() {
        let row = match rows.as_ref().map(|r| r[t]) {
            Some(r) if r >= 0 => {
                ensure!(
                    r < layer_rows as i64,
                    OutOfRange,
                    "rows[{t}]: {r} is not below the layer's {layer_rows} rows"
                );
                if let Some(first) = owner.insert(r, t) {
                    return Err(err!(
                        InvalidArgument,
                        "rows[{t}]: token {t} and token {first} both store into pool row {r}"
                    ));
                }
                Some(r as usize)
            }
            _ => None,
        };
        out.push(Destination {
            position: p as usize,
            row,
        });
    }
    Ok(out)
}

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
