//! Device-value rules: the checks every backend's data must satisfy before an
//! operation writes anything (indices in range, positions in the table, no two
//! tokens writing one row). `ops` cannot check these values, which live in
//! backend memory. Each rule reads host views only: the CPU backend runs it on
//! its arguments as they are, `Validating` on host copies of a device
//! backend's arguments. Rules that also derive what to write (moves, slice
//! plans, destinations) return it, so the CPU backend computes from what was
//! checked.

pub(crate) mod attention;
pub(crate) mod cache_store;
pub(crate) mod compressor;
pub(crate) mod index;
pub(crate) mod indexer;
pub(crate) mod prepare;
pub(crate) mod rope;
pub(crate) mod routing;
pub(crate) mod store;
