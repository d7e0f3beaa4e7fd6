//! Indexer query and key preparation on the host: positions (and key
//! locations) are checked first, then tokens run in parallel, each writing
//! only its own outputs, so a rejected call writes nothing.

use rayon::prelude::*;

use crate::args::indexer::{IndexerKeyArgs, IndexerQueryArgs, IndexerTopkArgs};
use crate::backend::host::{contiguous, contiguous_mut, put, put_row, put_row3, row, row3, slice};
use crate::backend::rules::cache_store::destinations;
use crate::backend::rules::indexer::{topk_csa_tails, topk_rows, TopkRow, INDEXER_PAGE};
use crate::backend::rules::rope::checked_positions;
use crate::cache_layouts::indexer::{store_token, stored_key, KEY_DIMS};
use crate::error::Result;
use crate::indexer::{key_score, prepare_key, prepare_query, query_weight, top_k};
use crate::tensor::FloatRows;

/// The device-value checks of `indexer_prepare_q` (its positions).
pub fn check_query(a: &IndexerQueryArgs) -> Result<Vec<i64>> {
    // SAFETY: host view with extent checked by `ops::indexer`.
    unsafe { checked_positions(&a.positions, a.num_tokens, a.rope_table.shape[0]) }
}

pub fn indexer_prepare_q(threads: &rayon::ThreadPool, a: &IndexerQueryArgs) -> Result<()> {
    let positions = check_query(a)?;
    // SAFETY: checked just above.
    unsafe { run_query(threads, a, &positions) };
    Ok(())
}

/// `indexer_prepare_q` after its checks.
///
/// # Safety
/// `positions` came from `check_query(a)`.
pub unsafe fn run_query(threads: &rayon::ThreadPool, a: &IndexerQueryArgs, positions: &[i64]) {
    threads.install(|| {
        positions.par_iter().enumerate().for_each(|(t, &p)| {
            // SAFETY: `p` was checked against the table; token t's outputs are
            // its own rows.
            unsafe {
                let table = row(&a.rope_table, p as usize);
                let weights = row(&a.weights, t);
                let weights_out = a.weights_out.as_ptr().add(a.weights_out.offset([t, 0]));
                for (h, w) in weights.iter().enumerate() {
                    let mut x: Vec<f32> = row3(&a.q, t, h).iter().map(|v| v.to_f32()).collect();
                    let (codes, scale) = prepare_query(&mut x, table, a.fmt);
                    put_row3(&a.q_fp8, t, h, &codes);
                    weights_out
                        .add(h)
                        .write(query_weight(w.to_f32(), a.weight_scale, scale));
                }
            }
        })
    });
}

pub fn indexer_prepare_k(a: &IndexerKeyArgs) -> Result<()> {
    let n = a.target.num_tokens;
    // SAFETY: host view with extent checked by `ops::indexer`.
    let positions = unsafe { checked_positions(&a.positions, n, a.rope_table.shape[0])? };
    let moves = destinations(&a.target)?;
    // SAFETY: host views; the norm weight has exactly KEY_DIMS values and the
    // cache is whole pages (both checked by `ops`).
    let (weight, cache): (Vec<f32>, _) = unsafe {
        (
            slice(&a.norm_weight, KEY_DIMS)
                .iter()
                .map(|w| w.to_f32())
                .collect(),
            contiguous_mut(&a.target.cache),
        )
    };
    for (t, loc) in moves {
        // SAFETY: t < num_tokens <= key rows; its position was checked.
        let mut x: Vec<f32> = unsafe {
            match &a.key {
                FloatRows::Bf16(m) => row(m, t).iter().map(|v| v.to_f32()).collect(),
                FloatRows::F32(m) => row(m, t).to_vec(),
            }
        };
        let table = unsafe { row(&a.rope_table, positions[t] as usize) };
        prepare_key(&mut x, &weight, a.eps, table);
        store_token(cache, &a.geometry, loc, &x)?;
    }
    Ok(())
}

pub fn indexer_topk(threads: &rayon::ThreadPool, a: &IndexerTopkArgs) -> Result<()> {
    let rows = topk_rows(a)?;
    let tails = match &a.csa {
        Some(csa) => topk_csa_tails(a, &rows, csa)?,
        None => Vec::new(),
    };
    threads.install(|| {
        rows.par_iter().enumerate().try_for_each(|(t, r)| {
            // SAFETY: the rows were checked; token t writes only its own
            // logits and topk_indices rows.
            unsafe { topk_token(a, t, *r) }
        })
    })?;
    if let Some(csa) = &a.csa {
        for (t, base, tail) in tails {
            // SAFETY: t < rows of the table, whose first `tail` entries were
            // just written (valid: tail <= the token's selected keys, each
            // page index below csa_rows); base + tail <= indptr[T] <= capacity.
            let entries = unsafe { row(&a.select.topk_indices, t) };
            for (j, &pi) in entries[..tail].iter().enumerate() {
                unsafe {
                    put(
                        &csa.stream.indices,
                        base + j,
                        (csa.row_base + pi as usize) as i32,
                    )
                };
            }
        }
    }
    Ok(())
}

/// # Safety
/// `r` came from `topk_rows(a)` for token `t`.
unsafe fn topk_token(a: &IndexerTopkArgs, t: usize, r: Option<TopkRow>) -> Result<()> {
    let s = &a.select;
    let width = s.topk_indices.shape[1];
    let mut out = vec![-1i32; width];
    if let Some(r) = r {
        let pages = row(&s.page_table, r.request);
        let index =
            |i: usize| pages[i / INDEXER_PAGE] * INDEXER_PAGE as i32 + (i % INDEXER_PAGE) as i32;
        let logits = s.logits.as_ptr().add(s.logits.offset([t, 0]));
        if let Some(sc) = &a.score {
            let q: Vec<u8> = (0..sc.num_heads)
                .flat_map(|h| row3(&sc.q_fp8, t, h).to_vec())
                .collect();
            let weights = row(&sc.weights, t);
            let cache = contiguous(&sc.cache);
            for i in 0..r.keys {
                let (codes, scale) = stored_key(cache, &sc.geometry, index(i).into())?;
                logits
                    .add(i)
                    .write(key_score(&q, weights, codes, scale, sc.geometry.format()));
            }
        }
        let scores = std::slice::from_raw_parts(logits, r.keys);
        for (j, i) in top_k(scores, s.topk).into_iter().enumerate() {
            out[j] = index(i);
        }
    }
    put_row(&s.topk_indices, t, &out);
    Ok(())
}
