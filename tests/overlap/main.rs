//! Issue 21 through the C ABI on the CPU backend: an output that shares bytes
//! with another argument of the call, or with the pool rows the call reads or
//! writes, is refused with UNIKV_OVERLAPPING_BUFFERS and a message naming
//! both, and nothing is written; the exact in-place uses a function allows
//! give the out-of-place result bit for bit; slices of one buffer that share
//! no byte are accepted. A case carves its tensors from one poisoned arena
//! (arena.rs), so that arguments can overlap, and every refusal compares the
//! whole arena (and the pool) before and after. One module per operation.

mod arena;
#[path = "../common/mod.rs"]
mod common;

mod attention;
mod cache_stores;
mod hash_topk;
mod index_builders;
mod indexer;
mod prepare_qkv;
mod stores;

use std::mem::size_of;
use std::os::raw::c_void;
use std::ptr;

use arena::*;
use common::*;
use half::bf16;
use rand::rngs::StdRng;
use unikv::ffi::attention::*;
use unikv::ffi::cache_store::*;
use unikv::ffi::index::*;
use unikv::ffi::indexer::*;
use unikv::ffi::prepare::*;
use unikv::ffi::rope::*;
use unikv::ffi::routing::*;
use unikv::ffi::status::unikv_status;
use unikv::ffi::store::*;
use unikv::ffi::types::{unikv_dtype, unikv_tensor};

const D: usize = 512;
/// Tokens and heads of the prepare and attention cases.
const T: usize = 2;
const H: usize = 2;
/// Rows of the RoPE tables.
const MAX_POS: usize = 8;
const FP8: u32 = unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN as u32;

/// Strides of q in the prepare and attention cases: one spare head per token.
const Q_STRIDES: [usize; 3] = [(H + 1) * D, D, 1];

/// Bytes of a FlashMLA cache page of 64 tokens and an indexer cache page.
const FLASHMLA_PAGE: usize = 37_440;
const INDEXER_PAGE: usize = 132 * 64;
