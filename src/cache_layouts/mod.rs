//! The two cache layouts of FlashMLA-based serving stacks (spec store_fused
//! §1.1 and §1.2): where a token's bytes live in a paged cache, how one token is
//! quantized into them, and a dequantizer for tests.
//!
//! Pure host code. The GPU store kernels are tested against these functions byte
//! for byte, so each follows the spec's arithmetic step by step and says where
//! it rounds.
//!
//! Both layouts address a token by a flat location into a `[num_pages,
//! bytes_per_page]` byte buffer: `page = loc / P`, `slot = loc % P` (spec §0). A
//! negative location is the "do not write" sentinel (§1.1: out-of-window tokens,
//! CUDA-graph padding). Every check runs before the first byte is written, so a
//! call that fails writes nothing.

pub mod flashmla;
pub mod indexer;

use crate::error::{ensure, err, Result};

/// How a layout cuts its cache into pages. The two layouts differ only in what
/// a page holds, not in how locations map to pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Paging {
    page_size: u64,
    bytes_per_page: u64,
}

impl Paging {
    /// Accepts only the page sizes the spec gives for the layout, so a pool
    /// built with another size fails at creation rather than producing a layout
    /// no reader expects. `bytes_per_page` runs only on a supported size, so it
    /// cannot overflow.
    fn new(
        layout: &str,
        page_size: u64,
        supported: &[u64],
        bytes_per_page: impl FnOnce(u64) -> u64,
    ) -> Result<Self> {
        ensure!(
            supported.contains(&page_size),
            InvalidArgument,
            "page_size: {page_size} is not supported by the {layout} layout (supported: {supported:?})"
        );
        Ok(Paging {
            page_size,
            bytes_per_page: bytes_per_page(page_size),
        })
    }

    /// The page and the slot in that page of a location.
    fn split(self, location: u64) -> (u64, u64) {
        (location / self.page_size, location % self.page_size)
    }

    /// The location a store writes, or None for the skip sentinel. Fails when
    /// the cache is not a whole number of pages (the CUDA kernels require a row
    /// stride of exactly `bytes_per_page`, §1.1) or the location lies past its
    /// last page. The cache is checked even for a skipped token, so a bad buffer
    /// is reported whatever the locations.
    fn store_location(self, cache_len: usize, location: i64) -> Result<Option<u64>> {
        let len = cache_len as u64;
        ensure!(
            len % self.bytes_per_page == 0,
            BadShape,
            "cache: {len} bytes is not a whole number of {}-byte pages",
            self.bytes_per_page
        );
        let Ok(location) = u64::try_from(location) else {
            return Ok(None);
        };
        let tokens = len / self.bytes_per_page * self.page_size;
        ensure!(
            location < tokens,
            OutOfRange,
            "location: {location} is past the cache's {tokens} token slots"
        );
        Ok(Some(location))
    }

    /// The location a read takes its token from: like a store's, except that
    /// the skip sentinel names no token.
    fn read_location(self, cache_len: usize, location: i64) -> Result<u64> {
        self.store_location(cache_len, location)?.ok_or_else(|| {
            err!(
                OutOfRange,
                "location: {location} is the skip sentinel, no token is stored there"
            )
        })
    }
}
