//! The cache stores' device values: token locations.

use std::collections::HashMap;

use crate::args::cache_store::CacheTarget;
use crate::backend::host::slice;
use crate::error::{ensure, err, Result};
use crate::tensor::IndexVector;

/// The (token, location) pairs a store writes, after checking every location:
/// negative ones are skipped, one at or past the cache's token slots is
/// `OutOfRange`, and two tokens aimed at one location (a race on a GPU) are
/// `InvalidArgument`. Reads only the locations, so `Validating` runs it on a host
/// copy.
pub(crate) fn destinations(target: &CacheTarget) -> Result<Vec<(usize, i64)>> {
    let n = target.num_tokens;
    // SAFETY: host views with extents checked by `ops::cache_store`.
    let locations: Vec<i64> = unsafe {
        match &target.loc {
            IndexVector::I32(v) => slice(v, n).iter().map(|&l| l.into()).collect(),
            IndexVector::I64(v) => slice(v, n).to_vec(),
        }
    };
    let slots = target.token_slots();
    let mut owner = HashMap::with_capacity(n);
    let mut moves = Vec::with_capacity(n);
    for (t, &l) in locations.iter().enumerate() {
        if l < 0 {
            continue;
        }
        ensure!(
            (l as u64) < slots,
            OutOfRange,
            "loc[{t}]: {l} is past the cache's {slots} token slots{}",
            if target.page_size > 1 {
                format!(" ({} pages of {})", target.cache.shape[0], target.page_size)
            } else {
                String::new()
            }
        );
        if let Some(first) = owner.insert(l, t) {
            return Err(err!(
                InvalidArgument,
                "loc[{t}]: tokens {first} and {t} both store to location {l}"
            ));
        }
        moves.push((t, l));
    }
    Ok(moves)
}
