//! The indexer top-k's device values: batch ids, positions and page ids.

use crate::args::indexer::IndexerTopkArgs;
use crate::backend::host::{int_values, row, slice};
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
