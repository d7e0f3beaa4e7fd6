//! Fused Q/KV preparation (docs/prepare.md §4): per token, weightless RMSNorm +
//! RoPE of every Q head, RMSNorm with `kv_weight` + RoPE of the KV row, the KV
//! row optionally written out and stored into a pool row (quantized for FP8
//! pools). The math, and where it rounds to bf16, is `crate::rope`'s
//! `prepare_q_row` / `prepare_kv_row`; the stored row is the bf16 KV row, so an
//! FP8 pool gets exactly the codes `unikv_store_swa` would give that row.

use crate::args::prepare::PrepareQkvArgs;
use crate::backend::Stream;
use crate::error::{ensure, Result};
use crate::geometry::HEAD_DIM;
use crate::ops::aliasing::{self, input, output, pool_output, Operand};
use crate::ops::indexer::{query_args, query_operands, IndexerQueryRaw};
use crate::ops::rope::rope_table;
use crate::ops::tokens;
use crate::pool::Pool;
use crate::tensor::{Extent, RawTensor, ROW_ALIGN};

/// Caller arguments of `prepare_qkv`.
#[derive(Debug, Clone, Copy)]
pub struct PrepareQkvRaw {
    pub layer: u32,
    pub num_tokens: usize,
    pub num_heads: usize,
    pub q_eps: f32,
    pub kv_eps: f32,
    pub reserved: u32,
    pub q_in: RawTensor,
    pub q_out: RawTensor,
    pub kv_in: RawTensor,
    pub kv_weight: RawTensor,
    pub kv_out: RawTensor,
    pub rope_table: RawTensor,
    pub positions: RawTensor,
    pub rows: RawTensor,
}

/// Exact in-place pairs: every backend reads a Q head's row or a token's KV
/// row whole before writing the row computed from it to the same place, and
/// no other item reads it (the CPU backend copies each input row out first;
/// in kernels/prepare.cu a warp loads its rows into registers and each lane
/// stores only the vectors it loaded).
const IN_PLACE: &[(&str, &str)] = &[("q_out", "q_in"), ("kv_out", "kv_in")];

fn check_eps(name: &str, eps: f32) -> Result<()> {
    // eps keeps an all-zero row finite: rsqrt(0 + eps).
    ensure!(
        eps.is_finite() && eps > 0.0,
        InvalidArgument,
        "{name}: {eps} is not a finite positive number"
    );
    Ok(())
}

pub fn prepare_qkv(pool: &Pool, raw: &PrepareQkvRaw, stream: Stream) -> Result<()> {
    pool.context().check_usable()?;
    let (args, operands) = qkv_args(pool, raw)?;
    aliasing::check(&operands, IN_PLACE)?;
    pool.context().backend().prepare_qkv(&args, None, stream)
}

/// `prepare_qkv` and `indexer_prepare_q` in one call (one launch on a GPU
/// backend): both calls' checks, and no output of either may overlap an
/// argument of the other.
pub fn prepare_qkv_indexer_q(
    pool: &Pool,
    raw: &PrepareQkvRaw,
    indexer: &IndexerQueryRaw,
    stream: Stream,
) -> Result<()> {
    pool.context().check_usable()?;
    let (args, operands) = qkv_args(pool, raw)?;
    let query = query_args(indexer)?;
    let all: Vec<Operand> = operands.into_iter().chain(query_operands(&query)).collect();
    aliasing::check(&all, IN_PLACE)?;
    pool.context()
        .backend()
        .prepare_qkv(&args, Some(&query), stream)
}

/// The validated arguments and their overlap operands.
fn qkv_args(pool: &Pool, raw: &PrepareQkvRaw) -> Result<(PrepareQkvArgs, [Operand; 9])> {
    let layer = pool.geometry().check_layer(raw.layer)?;
    let (t, h) = (raw.num_tokens, raw.num_heads);
    ensure!(raw.reserved == 0, InvalidArgument, "reserved: must be 0");
    ensure!(h > 0, InvalidArgument, "num_heads: must be positive");
    // Kernels index (token, head) items with 32-bit integers.
    ensure!(
        t.checked_mul(h).is_some_and(|n| n <= i32::MAX as usize),
        InvalidArgument,
        "num_heads: {t} tokens x {h} heads exceed 2^31 - 1 (token, head) pairs"
    );
    check_eps("q_eps", raw.q_eps)?;
    check_eps("kv_eps", raw.kv_eps)?;
    let q_row = [tokens(t), Extent::Exact(h), Extent::Exact(HEAD_DIM)];
    let kv_row = [tokens(t), Extent::Exact(HEAD_DIM)];
    let args = PrepareQkvArgs {
        pool_layer: pool.layer_rows(layer),
        num_tokens: t,
        num_heads: h,
        q_eps: raw.q_eps,
        kv_eps: raw.kv_eps,
        q_in: raw.q_in.view("q_in", q_row, ROW_ALIGN)?,
        q_out: raw.q_out.view("q_out", q_row, ROW_ALIGN)?,
        kv_in: raw.kv_in.view("kv_in", kv_row, ROW_ALIGN)?,
        kv_weight: raw
            .kv_weight
            .view("kv_weight", [Extent::Exact(HEAD_DIM)], ROW_ALIGN)?,
        kv_out: raw.kv_out.optional("kv_out", kv_row, ROW_ALIGN)?,
        rope_table: rope_table(&raw.rope_table)?,
        positions: raw.positions.index_vector("positions", tokens(t))?,
        rows: raw.rows.optional_index_vector("rows", tokens(t))?,
    };
    let operands = [
        output("q_out", &args.q_out),
        output("kv_out", &args.kv_out),
        pool_output(raw.layer, args.rows.map(|_| args.pool_layer)),
        input("q_in", &args.q_in),
        input("kv_in", &args.kv_in),
        input("kv_weight", &args.kv_weight),
        input("rope_table", &args.rope_table),
        input("positions", &args.positions),
        input("rows", &args.rows),
    ];
    Ok((args, operands))
}
