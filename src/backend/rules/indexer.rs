//! The indexer top-k's device values: batch ids, positions and page ids.

use crate::args::indexer::{IndexerTopkArgs, TopkCsaTail};
use crate::backend::host::{int_values, row, slice};
use crate::backend::rules::index::{checked_indptr, csa_tail_len};
use crate::cache_layouts::indexer::PAGE_SIZES;
use crate::error::{ensure, Result};
use crate::indexer::visible_keys;

/// Compressed keys per page of the indexer cache and of the page table.
pub(crate) const INDEXER_PAGE: usize = PAGE_SIZES[0] as usize;

/// What token t of a top-k call selects from: its page-table row and its
/// number of visible keys; None for padding (negative `batch_id`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TopkRow {
    pub request: usize,
    pub keys: usize,
}

/// Checks every real token's request, position, logits width and the page
/// ids its visible keys need (against the cache when scoring). Reads only the
/// integer arguments, so `Validating` runs it on host copies.
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

/// The CSA slices `indexer_topk_fill_csa` completes: (token, first tail
/// entry, tail length) of every real token, from `rows` of `topk_rows`. A
/// slice must hold the token's `min(pos + 1, window)` SWA entries and then at
/// most the `min(keys, topk)` keys its top-k selects. Which keys those are
/// depends on the scores, so every key a token with a tail sees must have a
/// page index below the pool's CSA rows (`fill_csa_tail` checks only the
/// selected ones).
pub(crate) fn topk_csa_tails(
    a: &IndexerTopkArgs,
    rows: &[Option<TopkRow>],
    csa: &TopkCsaTail,
) -> Result<Vec<(usize, usize, usize)>> {
    let s = &a.select;
    let n = s.num_tokens;
    let indptr = checked_indptr(
        "csa_indptr",
        &csa.stream.indptr,
        n,
        csa.stream.indices.shape[0],
    )?;
    // SAFETY: host view with extents checked by `ops::indexer`.
    let positions = unsafe { int_values(&s.positions, n) };
    let mut tails = Vec::with_capacity(n);
    for (t, r) in rows.iter().enumerate() {
        let Some(r) = r else { continue };
        // Non-negative: `topk_rows` checked it.
        let pos = positions[t] as u64;
        let swa = pos.saturating_add(1).min(csa.window as u64) as usize;
        let tail = csa_tail_len(indptr, t, swa, pos)?;
        let selected = r.keys.min(s.topk);
        ensure!(
            tail <= selected,
            OutOfRange,
            "csa_indptr[{t}]: {tail} entries after the window, but the token's top-k selects {selected}"
        );
        if tail > 0 {
            // SAFETY: the request is below the page table's rows (`topk_rows`).
            let ids = unsafe { row(&s.page_table, r.request) };
            for (j, &id) in ids[..r.keys.div_ceil(INDEXER_PAGE)].iter().enumerate() {
                let last =
                    id as usize * INDEXER_PAGE + (r.keys - j * INDEXER_PAGE).min(INDEXER_PAGE) - 1;
                ensure!(
                    last < csa.csa_rows,
                    OutOfRange,
                    "page_table[{}][{j}]: page {id} holds CSA page index {last}, not below the pool's {} CSA rows (token {t})",
                    r.request,
                    csa.csa_rows
                );
            }
        }
        tails.push((t, indptr[t] as usize + swa, tail));
    }
    Ok(tails)
}
