//! Index-stream builders' device values: requests, slots, positions, tables
//! and indptrs, checked and turned into each token's slice plan.

use crate::args::index::{CsaTailArgs, DecodeStreamsArgs, PrefillStreamsArgs};
use crate::backend::host::{row, slice};
use crate::backend::rules::store::{position, request_slot};
use crate::error::{ensure, Result};
use crate::geometry::Ratio;
use crate::tensor::{Matrix, Vector};

/// Counts the leading valid entries of `table[t]` within `limit`, checking each
/// against the compressed rows of the layer kind it addresses.
fn leading_valid(
    name: &str,
    table: &Matrix<i32>,
    t: usize,
    limit: usize,
    compressed_rows: usize,
) -> Result<usize> {
    // SAFETY: host view; t < num_tokens <= rows (checked by `ops::index`).
    let entries = unsafe { row(table, t) };
    let mut count = 0;
    for (j, &pi) in entries.iter().take(limit).enumerate() {
        if pi < 0 {
            break;
        }
        ensure!(
            (pi as usize) < compressed_rows,
            OutOfRange,
            "{name}[{t}][{j}]: {pi} is not below the {compressed_rows} compressed rows"
        );
        count += 1;
    }
    Ok(count)
}

/// Per-token plan of one decode slice.
#[derive(Default, Clone, Copy)]
pub(crate) struct DecodeToken {
    pub slot: usize,
    pub pos: usize,
    pub swa: usize,
    pub hca: usize,
    pub csa: usize,
}

/// Checks every token's values and computes its slice lengths. Reads only the
/// integer inputs (`Validating` runs it on host copies).
pub(crate) fn decode_plan(a: &DecodeStreamsArgs) -> Result<Vec<DecodeToken>> {
    let g = a.geometry;
    let n = a.num_tokens;
    let win = g.config.window;
    // SAFETY: host views with extents checked by `ops::index`.
    let (batch, slots, positions) = unsafe {
        (
            slice(&a.batch_id, n),
            slice(&a.req_slots, a.req_slots.shape[0]),
            slice(&a.positions, n),
        )
    };
    let hca_rows = g.compressed_rows(Ratio::Hca);
    let mut plan = vec![DecodeToken::default(); n];
    for t in 0..n {
        if batch[t] < 0 {
            continue;
        }
        let slot = request_slot(t, batch[t], slots, g.num_slots)?;
        let pos = position(t, positions[t])?;
        let hca = match &a.c128_page_indices {
            Some(table) => {
                let limit = Ratio::Hca.visible_groups(pos).min(table.shape[1]);
                leading_valid("c128_page_indices", table, t, limit, hca_rows)?
            }
            None => 0,
        };
        plan[t] = DecodeToken {
            slot,
            pos,
            swa: (pos + 1).min(win),
            hca,
            csa: Ratio::Csa.visible_groups(pos).min(a.csa_topk),
        };
    }
    Ok(plan)
}

/// Checks that `indptr[0..=T]` is non-negative, non-decreasing and ends within
/// `capacity`; returns it as a host slice.
pub(crate) fn checked_indptr<'a>(
    name: &str,
    indptr: &'a Vector<i32>,
    num_tokens: usize,
    capacity: usize,
) -> Result<&'a [i32]> {
    // SAFETY: host view with at least T + 1 entries (checked by `ops`).
    let ptr = unsafe { slice(indptr, num_tokens + 1) };
    ensure!(ptr[0] >= 0, OutOfRange, "{name}[0]: {} is negative", ptr[0]);
    for t in 0..num_tokens {
        ensure!(
            ptr[t + 1] >= ptr[t],
            OutOfRange,
            "{name}[{}]: {} is less than {name}[{t}] = {}",
            t + 1,
            ptr[t + 1],
            ptr[t]
        );
    }
    ensure!(
        (ptr[num_tokens] as usize) <= capacity,
        OutOfRange,
        "{name}[{num_tokens}]: {} is past the {capacity} entries of the index buffer",
        ptr[num_tokens]
    );
    Ok(ptr)
}

/// The entries of token t's CSA slice past its `swa` window entries (at
/// position `pos`): OUT_OF_RANGE when the slice is shorter than the window.
pub(crate) fn csa_tail_len(indptr: &[i32], t: usize, swa: usize, pos: u64) -> Result<usize> {
    let len = (indptr[t + 1] - indptr[t]) as usize;
    ensure!(
        len >= swa,
        OutOfRange,
        "csa_indptr[{t}]: slice of {len} entries is shorter than the {swa} SWA entries of position {pos}"
    );
    Ok(len - swa)
}

/// Checks the CSA indptr and this layer's table; returns (token, first slot,
/// length) of every tail. Reads only the integer inputs.
pub(crate) fn csa_tails(a: &CsaTailArgs) -> Result<Vec<(usize, usize, usize)>> {
    let g = a.geometry;
    let n = a.num_tokens;
    let win = g.config.window;
    let csa_rows = g.compressed_rows(Ratio::Csa);
    // SAFETY: host views with extents checked by `ops::index`.
    let (batch, positions) = unsafe { (slice(&a.batch_id, n), slice(&a.positions, n)) };
    let indptr = checked_indptr("csa_indptr", &a.csa.indptr, n, a.csa.indices.shape[0])?;
    let width = a.csa_page_indices.shape[1];
    let mut tails = Vec::with_capacity(n);
    for t in 0..n {
        if batch[t] < 0 {
            continue;
        }
        let pos = position(t, positions[t])?;
        let swa = (pos + 1).min(win);
        let tail = csa_tail_len(indptr, t, swa, pos as u64)?;
        ensure!(
            tail <= width,
            BadShape,
            "csa_page_indices: width {width} is less than token {t}'s {tail} top-k entries"
        );
        let valid = leading_valid("csa_page_indices", &a.csa_page_indices, t, tail, csa_rows)?;
        ensure!(
            valid == tail,
            OutOfRange,
            "csa_page_indices[{t}][{valid}]: -1 inside the first {tail} entries (the indexer's top-k must be front-packed)"
        );
        tails.push((t, indptr[t] as usize + swa, tail));
    }
    Ok(tails)
}

/// Per-token plan of one prefill slice pair.
#[derive(Default, Clone, Copy)]
pub(crate) struct PrefillToken {
    pub slot: usize,
    pub swa_low: usize,
    pub prefix_swa: usize,
    pub compressed: usize,
    pub extend_first: usize,
    pub extend: usize,
}

/// Checks every token's values and computes its prefix / extend slices.
/// Reads only the integer inputs.
pub(crate) fn prefill_plan(a: &PrefillStreamsArgs) -> Result<Vec<PrefillToken>> {
    let g = a.geometry;
    let n = a.num_tokens;
    let win = g.config.window;
    // SAFETY: host views with extents checked by `ops::index`.
    let (batch, slots, positions, chunk_start, extend_start) = unsafe {
        let requests = a.req_slots.shape[0];
        (
            slice(&a.batch_id, n),
            slice(&a.req_slots, requests),
            slice(&a.positions, n),
            slice(&a.chunk_start, requests),
            slice(&a.extend_start, requests),
        )
    };
    let compressed_rows = g.compressed_rows(a.ratio);
    let mut plan = vec![PrefillToken::default(); n];
    for t in 0..n {
        let b = batch[t];
        if b < 0 {
            continue;
        }
        let slot = request_slot(t, b, slots, g.num_slots)?;
        let pos = position(t, positions[t])?;
        let start = chunk_start[b as usize];
        ensure!(
            start >= 0 && start as usize <= pos,
            OutOfRange,
            "chunk_start[{b}]: {start} is not in 0..={pos} (positions[{t}])"
        );
        let first_row = extend_start[b as usize];
        ensure!(
            first_row >= 0,
            OutOfRange,
            "extend_start[{b}]: {first_row} is negative"
        );
        let start = start as usize;
        let in_chunk = pos - start;
        let swa_low = (pos + 1).saturating_sub(win);
        let extend = (in_chunk + 1).min(win);
        let extend_first = first_row as usize + in_chunk + 1 - extend;
        ensure!(
            extend_first + extend <= i32::MAX as usize,
            OutOfRange,
            "extend_start[{b}]: {first_row} puts token {t}'s rows past 32-bit row ids"
        );
        let compressed = match &a.page_indices {
            Some(table) => {
                let limit = a.ratio.visible_groups(pos).min(table.shape[1]);
                leading_valid("page_indices", table, t, limit, compressed_rows)?
            }
            None => 0,
        };
        plan[t] = PrefillToken {
            slot,
            swa_low,
            prefix_swa: start.saturating_sub(swa_low).min(win),
            compressed,
            extend_first,
            extend,
        };
    }
    Ok(plan)
}
