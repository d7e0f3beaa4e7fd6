//! Attention over foreign key layouts (docs/attention.md §6) on the CPU
//! backend, through the C ABI: FlashMLA's paged FP8 cache (docs/fp8.md §5) and
//! scaled FP8 rows (docs/fp8.md §8) as key sources of `unikv_sparse_decode`
//! and `unikv_sparse_prefill`, alone and mixed in one call.
//!
//! The claims checked:
//! - equality: attention over a cache is bit for bit attention over a bf16
//!   pool layer holding the cache's dequantized values, which the test
//!   computes itself (an f64 decoder written here from docs/fp8.md, sharing no
//!   code with the library): exact for FlashMLA (power-of-two scales), and
//!   `bf16(f32(decode · scale))` for scaled rows, whose reader rounds;
//! - accuracy: both are within the attention tests' bound (relative L2 error
//!   < 1e-2 per (token, head), LSE within 1e-3) of a float64 reference over
//!   those values;
//! - bad input: every new argument class fails with its status and a message
//!   naming it, and nothing is written;
//! - the scaled store (`unikv_store_scaled_fp8`): its bytes against the
//!   test's model of docs/fp8.md §8, and the round trip through attention.
//!
//! Every run draws fresh random inputs and poisons the outputs; the seed is
//! printed. Rerun a failure with `UNIKV_TEST_SEED=<seed>`.

#[path = "../common/mod.rs"]
mod common;
mod layouts;
mod run;

mod bad_input;
mod equality;
mod mixed;
mod store;

/// Latent width.
const D: usize = 512;
/// DeepSeek-V4's softmax scale, 512^-0.5.
const SCALE: f32 = 0.044_194_173;
