//! The KV compressor on the host: every device value is checked first
//! (`rules::compressor`), then each closed group is pooled from its window
//! rows (the call's own rows, or the state's for positions before the
//! request's first token in the call), normalized, rotated and stored, and
//! only then are the raw rows the state keeps written, so every group reads
//! the state as it was before the call and a rejected call writes nothing.

use half::bf16;
use rayon::prelude::*;

use crate::args::compressor::{CompressArgs, CompressTarget, NormWeight, StateView};
use crate::backend::host::{contiguous_mut, put_layer_row, put_row, row, slice};
use crate::backend::rules::compressor::{compress_plan, CompressPlan, Emission, Source};
use crate::cache_layouts::{flashmla, indexer};
use crate::compressor::{clear_row, pool_group, window_rows, window_start, Compressor};
use crate::error::Result;
use crate::geometry::HEAD_DIM;
use crate::rope::prepare_kv_row;
use crate::tensor::FloatRows;

pub fn clear_state(state: &StateView, slot: Option<usize>) {
    let rows = state.rows();
    let g = &state.geometry;
    let range = match slot {
        Some(s) => s * g.ring..(s + 1) * g.ring,
        None => 0..rows.shape[0],
    };
    let mut empty = vec![0.0f32; g.row_floats()];
    clear_row(&mut empty);
    for r in range {
        // SAFETY: r is a row of the state, host memory on this backend.
        unsafe { put_row(&rows, r, &empty) };
    }
}

/// A compressed vector ready to store.
enum Output {
    Row(Box<[bf16; HEAD_DIM]>),
    Key(Vec<f32>),
}

pub fn compress(threads: &rayon::ThreadPool, a: &CompressArgs) -> Result<()> {
    let plan = compress_plan(a)?;
    // SAFETY: host views of exactly `dim` values / `[ratio, values]` (ops).
    let dim = a.state.geometry.dim();
    let weight: Vec<f32> = unsafe {
        match &a.norm_weight {
            NormWeight::Bf16(w) => slice(w, dim).iter().map(|x| x.to_f32()).collect(),
            NormWeight::F32(w) => slice(w, dim).to_vec(),
        }
    };
    let ape: Vec<f32> = (0..a.ape.shape[0])
        // SAFETY: as above.
        .flat_map(|r| unsafe { row(&a.ape, r) }.to_vec())
        .collect();
    let stored: Vec<&Emission> = plan.emissions.iter().filter(|e| e.loc.is_some()).collect();
    let outputs: Vec<Output> = threads.install(|| {
        stored
            .par_iter()
            .map(|e| emit(a, &plan, e, &weight, &ape))
            .collect()
    });
    for (e, out) in stored.iter().zip(outputs) {
        let loc = e.loc.expect("stored groups have a location");
        store(a, loc, &out)?;
    }
    let state = a.state.rows();
    let mut raw = Vec::with_capacity(a.state.geometry.row_floats());
    for &(t, r) in &plan.writes {
        raw.clear();
        // SAFETY: t < num_tokens <= kv_score rows; r a state row (rules).
        unsafe {
            raw_row(&a.kv_score, t, &mut raw);
            put_row(&state, r, &raw);
        }
    }
    Ok(())
}

/// Row t of `kv_score` widened to f32 (exact for bf16).
///
/// # Safety
/// Host view with `t` below its rows.
unsafe fn raw_row(rows: &FloatRows, t: usize, out: &mut Vec<f32>) {
    match rows {
        FloatRows::Bf16(m) => out.extend(row(m, t).iter().map(|x| x.to_f32())),
        FloatRows::F32(m) => out.extend_from_slice(row(m, t)),
    }
}

/// Pools, normalizes and rotates (and for the indexer transforms) one group.
fn emit(
    a: &CompressArgs,
    plan: &CompressPlan,
    e: &Emission,
    weight: &[f32],
    ape: &[f32],
) -> Output {
    let g = &a.state.geometry;
    let ratio = g.ratio;
    let start = window_start(ratio, e.n);
    let state = a.state.rows();
    let mut owned: Vec<Vec<f32>> = Vec::with_capacity(window_rows(ratio));
    for i in 0..window_rows(ratio) {
        let q = start + i as i64;
        let mut r = Vec::new();
        if q >= 0 {
            // SAFETY: checked rows (rules): the run's own tokens or state rows.
            unsafe {
                match plan.source(a, e.t, q as u64) {
                    Source::Input(t) => raw_row(&a.kv_score, t, &mut r),
                    Source::State(s) => r.extend_from_slice(row(&state, s)),
                }
            }
        }
        owned.push(r);
    }
    let window: Vec<&[f32]> = owned.iter().map(|r| r.as_slice()).collect();
    let mut x = vec![0.0f32; g.dim()];
    pool_group(ratio, e.n, &window, ape, &mut x);
    let first = e.n as usize * ratio.value();
    // SAFETY: the group's first position was checked against the table.
    let table = unsafe { row(&a.rope_table, first) };
    match g.compressor {
        Compressor::Kv => {
            prepare_kv_row(&mut x, weight, a.eps, table);
            let mut out = [bf16::ZERO; HEAD_DIM];
            for (o, v) in out.iter_mut().zip(&x) {
                *o = bf16::from_f32(*v);
            }
            Output::Row(Box::new(out))
        }
        Compressor::Indexer => {
            crate::indexer::prepare_key(&mut x, weight, a.eps, table);
            Output::Key(x)
        }
    }
}

fn store(a: &CompressArgs, loc: u64, out: &Output) -> Result<()> {
    match (&a.target, out) {
        (CompressTarget::Pool { rows, swa_rows, .. }, Output::Row(r)) => {
            // SAFETY: loc < compressed_rows (rules), so the row is the layer's.
            unsafe { put_layer_row(rows, swa_rows + loc as usize, &r[..]) };
            Ok(())
        }
        (
            CompressTarget::FlashMla {
                geometry, cache, ..
            },
            Output::Row(r),
        ) => {
            // SAFETY: a host view of whole pages (ops).
            flashmla::store_token(
                unsafe { contiguous_mut(cache) },
                geometry,
                loc as i64,
                &r[..],
            )
        }
        (
            CompressTarget::Indexer {
                geometry, cache, ..
            },
            Output::Key(k),
        ) => {
            // SAFETY: as above.
            indexer::store_token(unsafe { contiguous_mut(cache) }, geometry, loc as i64, k)
        }
        _ => unreachable!("ops pairs the attention compressor with rows, the indexer's with keys"),
    }
}
