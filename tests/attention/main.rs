//! `unikv_sparse_decode` / `unikv_sparse_prefill` on the CPU backend, through the
//! C ABI, against an independent float64 reference written here from
//! docs/attention.md §1, §2 (it shares no code with the implementation):
//!
//! for token t, head h and key set K_t (K = V):
//! `s_j = scale * <q, k_j>`, `z = sink[h]` (-inf when absent),
//! `M = max(z, max_j s_j)`, `den = e^(z-M) + sum_j e^(s_j-M)`,
//! `out = sum_j e^(s_j-M) k_j / den` (exact zeros for an empty key set),
//! `lse = M + ln(den)` (the sink itself for an empty key set, -inf without sink).
//!
//! Every run draws fresh random inputs; the seed is printed (and in every
//! assertion message). Rerun a failure with `UNIKV_TEST_SEED=<seed>`.
//!
//! The helpers are in inputs.rs (random inputs, host buffers), handles.rs
//! (plans, the pool), reference.rs (the float64 reference) and launch.rs
//! (batches run and checked); the tests in one module per concern.

#[path = "../common/mod.rs"]
mod common;
mod handles;
mod inputs;
mod launch;
mod reference;

mod argument_checks;
mod decode;
mod determinism;
mod prefill;
mod strided_buffers;

use std::marker::PhantomData;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use half::bf16;
use handles::*;
use inputs::*;
use launch::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use reference::*;
// The reference check, not the status check of common::*.
use reference::check;
use unikv::ffi::attention::*;
use unikv::ffi::status::unikv_status;
use unikv::ffi::types::{unikv_dtype, unikv_tensor};

/// Latent width.
const D: usize = 512;
/// DeepSeek-V4's softmax scale, 512^-0.5.
const SCALE: f32 = 0.044_194_173;
/// The pool layer the tests attend over (layer 0 holds other random data).
const LAYER: u32 = 1;
/// Slice lengths the ragged batches draw from (0, 1 and > 2048 included).
const LENGTHS: [usize; 8] = [0, 1, 2, 17, 128, 640, 1152, 2300];
/// Rows of the extend K tensor in prefill tests.
const EXTEND_ROWS: usize = 300;
/// bf16 bit pattern of the poison byte pair.
const POISON_BF16: u16 = u16::from_ne_bytes([POISON_BYTE, POISON_BYTE]);
const POISON_F32: u32 = u32::from_ne_bytes([POISON_BYTE; 4]);
