//! Index-stream builders on the host. Each builder computes and checks every
//! token's lengths and rows first, then writes, so a rejected call writes nothing.

use crate::backend::cpu::host::{put, row, slice};
use crate::backend::cpu::store::{position, request_slot};
use crate::error::{ensure, Result};
use crate::geometry::Ratio;
use crate::ops::index::{CsaTailArgs, DecodeStreamsArgs, PrefillStreamsArgs, StreamOut};
use crate::tensor::Matrix;

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

/// Writes the exclusive prefix sum of `lens` into `out.indptr` and returns the
/// start offset of each slice.
fn write_indptr(out: &StreamOut, lens: &[usize]) -> Vec<usize> {
    let mut starts = Vec::with_capacity(lens.len());
    let mut acc = 0usize;
    for (t, len) in lens.iter().enumerate() {
        starts.push(acc);
        // SAFETY: indptr holds at least T + 1 entries; totals fit in i32 because
        // the index capacity was checked to.
        unsafe { put(&out.indptr, t, acc as i32) };
        acc += len;
    }
    // SAFETY: as above.
    unsafe { put(&out.indptr, lens.len(), acc as i32) };
    starts
}

/// Per-token plan of one decode slice.
#[derive(Default, Clone, Copy)]
struct DecodeToken {
    slot: usize,
    pos: usize,
    swa: usize,
    hca: usize,
    csa: usize,
}

/// Checks every token's values and computes its slice lengths. Reads only the
/// integer inputs (the GPU validate mode runs it on host copies).
fn decode_plan(a: &DecodeStreamsArgs) -> Result<Vec<DecodeToken>> {
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

#[cfg(unikv_gpu)]
pub(crate) fn check_decode_streams(a: &DecodeStreamsArgs) -> Result<()> {
    decode_plan(a).map(|_| ())
}

pub fn build_decode_streams(a: &DecodeStreamsArgs) -> Result<()> {
    let g = a.geometry;
    let plan = decode_plan(a)?;
    let swa_start = write_indptr(&a.swa, &plan.iter().map(|p| p.swa).collect::<Vec<_>>());
    let hca_start = write_indptr(
        &a.hca,
        &plan.iter().map(|p| p.swa + p.hca).collect::<Vec<_>>(),
    );
    let csa_start = write_indptr(
        &a.csa,
        &plan.iter().map(|p| p.swa + p.csa).collect::<Vec<_>>(),
    );
    for (t, p) in plan.iter().enumerate() {
        for i in 0..p.swa {
            let r = g.swa_row(p.slot, p.pos + 1 + i - p.swa) as i32;
            // SAFETY: offsets stay below the checked worst-case capacities.
            unsafe {
                put(&a.swa.indices, swa_start[t] + i, r);
                put(&a.hca.indices, hca_start[t] + i, r);
                put(&a.csa.indices, csa_start[t] + i, r);
            }
        }
        if let Some(table) = &a.c128_page_indices {
            // SAFETY: t < rows of the table.
            let entries = unsafe { row(table, t) };
            for (j, &pi) in entries.iter().take(p.hca).enumerate() {
                let r = g.compressed_row(pi as usize) as i32;
                // SAFETY: within the HCA capacity (win + table width per token).
                unsafe { put(&a.hca.indices, hca_start[t] + p.swa + j, r) };
            }
        }
    }
    Ok(())
}

/// Checks that `indptr[0..=T]` is non-negative, non-decreasing and ends within
/// `capacity`; returns it as a host slice.
pub(super) fn checked_indptr<'a>(
    name: &str,
    indptr: &'a crate::tensor::Vector<i32>,
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

/// Checks the CSA indptr and this layer's table; returns (token, first slot,
/// length) of every tail. Reads only the integer inputs.
fn csa_tails(a: &CsaTailArgs) -> Result<Vec<(usize, usize, usize)>> {
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
        let len = (indptr[t + 1] - indptr[t]) as usize;
        ensure!(
            len >= swa,
            OutOfRange,
            "csa_indptr[{t}]: slice of {len} entries is shorter than the {swa} SWA entries of position {pos}"
        );
        let tail = len - swa;
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

#[cfg(unikv_gpu)]
pub(crate) fn check_csa_tail(a: &CsaTailArgs) -> Result<()> {
    csa_tails(a).map(|_| ())
}

pub fn fill_csa_tail(a: &CsaTailArgs) -> Result<()> {
    let g = a.geometry;
    for (t, base, tail) in csa_tails(a)? {
        // SAFETY: t < rows of the table, and base + tail <= indptr[T] <= capacity.
        let entries = unsafe { row(&a.csa_page_indices, t) };
        for (j, &pi) in entries.iter().take(tail).enumerate() {
            unsafe {
                put(
                    &a.csa.indices,
                    base + j,
                    g.compressed_row(pi as usize) as i32,
                )
            };
        }
    }
    Ok(())
}

/// Per-token plan of one prefill slice pair.
#[derive(Default, Clone, Copy)]
struct PrefillToken {
    slot: usize,
    swa_low: usize,
    prefix_swa: usize,
    compressed: usize,
    extend_first: usize,
    extend: usize,
}

/// Checks every token's values and computes its prefix / extend slices.
/// Reads only the integer inputs.
fn prefill_plan(a: &PrefillStreamsArgs) -> Result<Vec<PrefillToken>> {
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

#[cfg(unikv_gpu)]
pub(crate) fn check_prefill_streams(a: &PrefillStreamsArgs) -> Result<()> {
    prefill_plan(a).map(|_| ())
}

pub fn build_prefill_streams(a: &PrefillStreamsArgs) -> Result<()> {
    let g = a.geometry;
    let plan = prefill_plan(a)?;
    let prefix_start = write_indptr(
        &a.prefix,
        &plan
            .iter()
            .map(|p| p.prefix_swa + p.compressed)
            .collect::<Vec<_>>(),
    );
    let extend_start_out = write_indptr(
        &a.extend,
        &plan.iter().map(|p| p.extend).collect::<Vec<_>>(),
    );
    for (t, p) in plan.iter().enumerate() {
        // SAFETY (all writes below): offsets stay below the checked worst-case
        // capacities (win + table width for prefix, win for extend).
        for k in 0..p.prefix_swa {
            let r = g.swa_row(p.slot, p.swa_low + k) as i32;
            unsafe { put(&a.prefix.indices, prefix_start[t] + k, r) };
        }
        if let Some(table) = &a.page_indices {
            let entries = unsafe { row(table, t) };
            for (j, &pi) in entries.iter().take(p.compressed).enumerate() {
                let r = g.compressed_row(pi as usize) as i32;
                unsafe { put(&a.prefix.indices, prefix_start[t] + p.prefix_swa + j, r) };
            }
        }
        for k in 0..p.extend {
            let r = (p.extend_first + k) as i32;
            unsafe { put(&a.extend.indices, extend_start_out[t] + k, r) };
        }
    }
    Ok(())
}
