//! Indexer query and key preparation on the host: positions (and key
//! locations) are checked first, then tokens run in parallel, each writing
//! only its own outputs, so a rejected call writes nothing.

use rayon::prelude::*;

use crate::backend::cpu::cache_store::destinations;
use crate::backend::cpu::host::{
    contiguous, contiguous_mut, int_values, put_row, put_row3, row, row3, slice,
};
use crate::backend::cpu::rope::checked_positions;
use crate::cache_layouts::indexer::{store_token, stored_key, KEY_DIMS, PAGE_SIZES};
use crate::error::{ensure, Result};
use crate::indexer::{key_score, prepare_key, prepare_query, query_weight, top_k, visible_keys};
use crate::ops::indexer::{IndexerKeyArgs, IndexerQueryArgs, IndexerTopkArgs};
use crate::tensor::FloatRows;

/// Compressed keys per page of the indexer cache and of the page table.
const INDEXER_PAGE: usize = PAGE_SIZES[0] as usize;

pub fn indexer_prepare_q(threads: &rayon::ThreadPool, a: &IndexerQueryArgs) -> Result<()> {
    // SAFETY: host view with extent checked by `ops::indexer`.
    let positions =
        unsafe { checked_positions(&a.positions, a.num_tokens, a.rope_table.shape[0])? };
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
    Ok(())
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

/// What token t of a top-k call selects from: its page-table row and its
/// number of visible keys; None for padding (negative `batch_id`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TopkRow {
    pub request: usize,
    pub keys: usize,
}

/// Checks every real token's request, position, logits width and the page
/// ids its visible keys need (against the cache when scoring). Reads only the
/// integer arguments, so the GPU backend's validate mode runs it on host copies.
pub(crate) fn topk_rows(a: &IndexerTopkArgs) -> Result<Vec<Option<TopkRow>>> {
    let s = &a.select;
    let n = s.num_tokens;
    let (requests, max_pages) = (s.page_table.shape[0], s.page_table.shape[1]);
    let width = s.logits.shape[1];
    // SAFETY: host views with extents checked by `ops::indexer`.
    let (batch, positions) = unsafe { (slice(&s.batch_id, n), int_values(&s.positions, n)) };
    let cache_pages = a.score.map(|sc| sc.cache.shape[0]);
    let mut rows = Vec::with_capacity(n);
    for t in 0..n {
        let b = batch[t];
        if b < 0 {
            rows.push(None);
            continue;
        }
        ensure!(
            (b as usize) < requests,
            OutOfRange,
            "batch_id[{t}]: {b} is not below the page table's {requests} rows"
        );
        let p = positions[t];
        ensure!(p >= 0, OutOfRange, "positions[{t}]: {p} is negative");
        let keys = visible_keys(p);
        ensure!(
            keys <= width,
            OutOfRange,
            "positions[{t}]: the token sees {keys} keys, logits has {width} columns"
        );
        let pages = keys.div_ceil(INDEXER_PAGE);
        ensure!(
            pages <= max_pages,
            OutOfRange,
            "page_table: token {t} sees {keys} keys on {pages} pages, a row holds {max_pages}"
        );
        // SAFETY: b < rows of the page table.
        let ids = unsafe { row(&s.page_table, b as usize) };
        for (j, &id) in ids[..pages].iter().enumerate() {
            let limit = cache_pages.unwrap_or(i32::MAX as usize / INDEXER_PAGE);
            ensure!(
                id >= 0 && (id as usize) < limit,
                OutOfRange,
                "page_table[{b}][{j}]: page {id} is outside the {limit} pages of the cache (token {t})"
            );
        }
        rows.push(Some(TopkRow {
            request: b as usize,
            keys,
        }));
    }
    Ok(rows)
}

pub fn indexer_topk(threads: &rayon::ThreadPool, a: &IndexerTopkArgs) -> Result<()> {
    let rows = topk_rows(a)?;
    threads.install(|| {
        rows.par_iter().enumerate().try_for_each(|(t, r)| {
            // SAFETY: the rows were checked; token t writes only its own
            // logits and topk_indices rows.
            unsafe { topk_token(a, t, *r) }
        })
    })
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
