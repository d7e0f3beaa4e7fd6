//! Index-stream builders on the host. Each builder computes and checks every
//! token's lengths and rows first, then writes, so a rejected call writes nothing.

use crate::args::index::{CsaTailArgs, DecodeStreamsArgs, PrefillStreamsArgs, StreamOut};
use crate::backend::host::{put, row};
use crate::backend::rules::index::{csa_tails, decode_plan, prefill_plan};
use crate::error::Result;

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

pub fn build_decode_streams(a: &DecodeStreamsArgs) -> Result<()> {
    let g = a.geometry;
    let plan = decode_plan(a)?;
    let swa_start = write_indptr(&a.swa, &plan.iter().map(|p| p.swa).collect::<Vec<_>>());
    let hca_start = a
        .hca
        .as_ref()
        .map(|hca| write_indptr(hca, &plan.iter().map(|p| p.swa + p.hca).collect::<Vec<_>>()));
    let csa_start = a
        .csa
        .as_ref()
        .map(|csa| write_indptr(csa, &plan.iter().map(|p| p.swa + p.csa).collect::<Vec<_>>()));
    for (t, p) in plan.iter().enumerate() {
        for i in 0..p.swa {
            let r = g.swa_row(p.slot, p.pos + 1 + i - p.swa) as i32;
            // SAFETY: offsets stay below the checked worst-case capacities.
            unsafe {
                put(&a.swa.indices, swa_start[t] + i, r);
                if let (Some(hca), Some(start)) = (&a.hca, &hca_start) {
                    put(&hca.indices, start[t] + i, r);
                }
                if let (Some(csa), Some(start)) = (&a.csa, &csa_start) {
                    put(&csa.indices, start[t] + i, r);
                }
            }
        }
        if let (Some(table), Some(hca), Some(start)) = (&a.c128_page_indices, &a.hca, &hca_start) {
            // SAFETY: t < rows of the table.
            let entries = unsafe { row(table, t) };
            for (j, &pi) in entries.iter().take(p.hca).enumerate() {
                let r = g.compressed_row(pi as usize) as i32;
                // SAFETY: within the HCA capacity (win + table width per token).
                unsafe { put(&hca.indices, start[t] + p.swa + j, r) };
            }
        }
    }
    Ok(())
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
