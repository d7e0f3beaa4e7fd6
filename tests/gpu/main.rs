//! The CUDA backend against the CPU backend (the oracle), through the C ABI,
//! one module per operation; the helpers they share are in harness.rs.
//! Without a usable GPU only `auto_context_falls_back_to_cpu` runs; set
//! UNIKV_EXPECT_GPU=1 to make a missing GPU a failure. UNIKV_GPU_TEST_SMALL=1
//! shrinks the shapes for compute-sanitizer runs.
#![cfg(all(feature = "cuda", feature = "devtools"))]

#[path = "../common/mod.rs"]
mod common;
mod harness;
// The key-source tests' caches, launches and checks (tests/kv_sources).
#[path = "../kv_sources/layouts.rs"]
mod layouts;
#[path = "../kv_sources/run.rs"]
mod run;

mod attention;
mod cache_stores;
mod compressor;
mod context;
mod fp8_codec;
mod graph;
mod index;
mod indexer;
mod introspection;
mod inverse_rope;
mod kv_sources;
mod merge;
mod prepare_qkv;
mod routing;
mod scaled_store;
mod stores;
mod validate_mode;

use std::os::raw::c_void;
use std::ptr;

use common::*;
use half::bf16;
use harness::*;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::Rng;
use unikv::cache_layouts::unified;
use unikv::ffi::attention::*;
use unikv::ffi::context::*;
use unikv::ffi::index::*;
use unikv::ffi::store::*;
use unikv::ffi::types::{unikv_dtype, unikv_tensor};
use unikv::fp8::Fp8Format;

/// Latent width (tests/kv_sources' modules name it `crate::D`).
const D: usize = 512;
/// DeepSeek-V4's softmax scale, 512^-0.5.
const SCALE: f32 = 0.044_194_173;
