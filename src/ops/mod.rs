//! Operations: each turns caller descriptors into validated typed arguments
//! (shapes, dtypes, strides, alignment, capacities: everything knowable without
//! reading device memory) and hands them to the context's backend.

pub(crate) mod aliasing;
pub mod attention;
pub mod cache_store;
pub mod compressor;
pub mod index;
pub mod indexer;
pub mod merge;
pub mod rope;
pub mod routing;

pub mod prepare;
pub mod store;

use crate::tensor::Extent;

/// Extent for an axis indexed by token: buffers may be sized for a larger
/// capture-time maximum than this call's token count.
pub(crate) fn tokens(n: usize) -> Extent {
    Extent::AtLeast(n)
}
