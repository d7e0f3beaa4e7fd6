//! The FlashMLA FP8 KV cache and indexer key cache layouts
//! (`unikv::cache_layouts`, docs/fp8.md §3, §5, §6).
//!
//! Three kinds of check:
//! * literal bytes for hand-computed inputs (each expected scale byte and code
//!   is derived in a comment), at literal offsets, comparing the whole buffer;
//! * bad input (unsupported page sizes, short rows, partial pages, locations
//!   past the end) fails with a typed error and leaves the buffer as it was, and
//!   negative locations write nothing;
//! * random rows at random locations across pages against an independent
//!   float64 reference written here from docs/fp8.md (code table from the format
//!   fields, nearest code with ties to even, UE8M0 as the smallest power of two
//!   not below the scale), byte for byte over the whole buffer, then the
//!   dequantized values against that reference exactly and against the input
//!   within half a quantization step and the docs/testing.md §2 tolerance.
//!
//! Random tests draw fresh inputs each run; the seed is printed. Rerun a failure
//! with `UNIKV_TEST_SEED=<seed>`.
//!
//! Helpers: inputs.rs (literal and random rows) and reference.rs (the float64
//! reference); the tests in one module per kind of check.

#[path = "../common/mod.rs"]
mod common;
mod inputs;
mod reference;

mod bad_input;
mod flashmla_literal_bytes;
mod geometry;
mod indexer_literal_bytes;
mod random_round_trips;

use common::seeded;
use half::bf16;
use inputs::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use reference::*;
use unikv::cache_layouts::flashmla::{self, FlashMlaGeometry};
use unikv::cache_layouts::indexer::{self, IndexerGeometry};
use unikv::error::Error;
use unikv::fp8::Fp8Format::{self, E4m3Fn, E4m3Fnuz};

/// Byte pattern a buffer starts with in the literal tests, so unwritten bytes
/// show.
const POISON: u8 = 0xA5;
