//! Attention's device values: each key source's indptr and row indices.

use crate::args::attention::KvSource;
use crate::backend::host::slice;
use crate::backend::rules::index::checked_indptr;
use crate::error::{ensure, Result};

/// Checks every index of one source before any output is written: each lies
/// below the source's rows (a FlashMLA cache's `num_pages * page_size` token
/// slots), or is -1 where `skip_negative` allows it.
pub(crate) fn check_source(src: &KvSource, num_tokens: usize, skip_negative: bool) -> Result<()> {
    let (indices_name, indptr_name) = src.names;
    let indptr = checked_indptr(indptr_name, &src.indptr, num_tokens, src.indices.shape[0])?;
    let (first, last) = (indptr[0] as usize, indptr[num_tokens] as usize);
    // SAFETY: host view; last <= capacity was just checked.
    let indices = unsafe { slice(&src.indices, last) };
    let rows = src.kv.rows();
    for (offset, &r) in indices.iter().enumerate().skip(first) {
        let skipped = skip_negative && r == -1;
        ensure!(
            skipped || (r >= 0 && (r as usize) < rows),
            OutOfRange,
            "{indices_name}[{offset}]: {r} is not a row of the {rows}-row key source"
        );
    }
    Ok(())
}
