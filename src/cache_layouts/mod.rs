//! FP8 byte layouts: the two cache layouts of FlashMLA-based serving stacks
//! (docs/fp8.md §5, §6), the unified pool's FP8 row (docs/fp8.md §4) and
//! the scaled FP8 rows of the unified-pool kernels (docs/fp8.md §8): where a token's bytes live, how one token is quantized
//! into them, and a dequantizer.
//!
//! Pure host code. The GPU store kernels are tested against these functions byte
//! for byte, so each follows the documented arithmetic (docs/fp8.md) step by step and says where
//! it rounds.
//!
//! Both layouts address a token by a flat location into a `[num_pages,
//! bytes_per_page]` byte buffer: `page = loc / P`, `slot = loc % P` (docs/fp8.md §5). A
//! negative location is the "do not write" sentinel (docs/fp8.md §5: out-of-window tokens,
//! CUDA-graph padding). Every check runs before the first byte is written, so a
//! call that fails writes nothing.

pub mod flashmla;
pub mod indexer;
pub mod scaled;
pub mod unified;

use crate::error::{ensure, err, Result};

/// How a layout cuts its cache into pages. Both layouts put a page's value
/// slots first and its scale slots after them (docs/fp8.md §5, §6); they differ only in
/// the slot sizes and in whether the page stride is rounded up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Paging {
    page_size: u64,
    bytes_per_page: u64,
    value_slot: u64,
    scale_slot: u64,
}

impl Paging {
    /// Accepts only the page sizes docs/fp8.md gives for the layout, so a pool
    /// built with another size fails at creation rather than producing a layout
    /// no reader expects. The page stride is the slots of `page_size` tokens
    /// rounded up to a multiple of `stride_unit`; it is computed only for a
    /// supported size, so it cannot overflow.
    fn new(
        layout: &str,
        page_size: u64,
        supported: &[u64],
        (value_slot, scale_slot): (u64, u64),
        stride_unit: u64,
    ) -> Result<Self> {
        ensure!(
            supported.contains(&page_size),
            InvalidArgument,
            "page_size: {page_size} is not supported by the {layout} layout (supported: {supported:?})"
        );
        let bytes_per_page =
            ((value_slot + scale_slot) * page_size).div_ceil(stride_unit) * stride_unit;
        Ok(Paging {
            page_size,
            bytes_per_page,
            value_slot,
            scale_slot,
        })
    }

    /// The page and the slot in that page of a location.
    fn split(self, location: u64) -> (u64, u64) {
        (location / self.page_size, location % self.page_size)
    }

    /// `page·bytes_per_page + slot·value_slot`: a token's value slot.
    fn value_offset(self, location: u64) -> u64 {
        let (page, slot) = self.split(location);
        page * self.bytes_per_page + slot * self.value_slot
    }

    /// `page·bytes_per_page + value_slot·P + slot·scale_slot`: a token's scale
    /// slot, after the page's value slots.
    fn scale_offset(self, location: u64) -> u64 {
        let (page, slot) = self.split(location);
        page * self.bytes_per_page + self.value_slot * self.page_size + slot * self.scale_slot
    }

    /// The location a store writes, or None for the skip sentinel. Fails when
    /// the cache is not a whole number of pages (the CUDA kernels require a row
    /// stride of exactly `bytes_per_page`, docs/fp8.md §5) or the location lies past its
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
