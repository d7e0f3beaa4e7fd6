//! Store path (docs/pool.md §9): SWA ring scatter with the final-window
//! filter, and compressed-row scatter with negative locations skipped.

use crate::args::store::{StoreCompressedArgs, StoreSwaArgs};
use crate::backend::Stream;
use crate::error::Result;
use crate::geometry::HEAD_DIM;
use crate::ops::aliasing::{self, input, pool_output};
use crate::ops::tokens;
use crate::pool::Pool;
use crate::tensor::{Extent, RawTensor, ROW_ALIGN};

/// Caller arguments of `store_swa`.
#[derive(Debug, Clone, Copy)]
pub struct StoreSwaRaw {
    pub layer: u32,
    pub num_tokens: usize,
    pub kv: RawTensor,
    pub batch_id: RawTensor,
    pub req_slots: RawTensor,
    pub positions: RawTensor,
    pub final_pos: RawTensor,
}

/// Caller arguments of `store_compressed`.
#[derive(Debug, Clone, Copy)]
pub struct StoreCompressedRaw {
    pub layer: u32,
    pub num_rows: usize,
    pub kv: RawTensor,
    pub loc: RawTensor,
}

pub fn store_swa(pool: &Pool, raw: &StoreSwaRaw, stream: Stream) -> Result<()> {
    pool.context().check_usable()?;
    let layer = pool.geometry().check_layer(raw.layer)?;
    let n = raw.num_tokens;
    let req_slots = raw.req_slots.view("req_slots", [Extent::AtLeast(1)], 4)?;
    let requests = req_slots.shape[0];
    let args = StoreSwaArgs {
        geometry: pool.geometry(),
        pool_layer: pool.layer_rows(layer),
        num_tokens: n,
        kv: raw
            .kv
            .view("kv", [tokens(n), Extent::Exact(HEAD_DIM)], ROW_ALIGN)?,
        batch_id: raw.batch_id.view("batch_id", [tokens(n)], 4)?,
        req_slots,
        positions: raw.positions.view("positions", [tokens(n)], 4)?,
        final_pos: raw
            .final_pos
            .optional("final_pos", [Extent::AtLeast(requests)], 4)?,
    };
    aliasing::check(
        &[
            pool_output(raw.layer, Some(args.pool_layer)),
            input("kv", &args.kv),
            input("batch_id", &args.batch_id),
            input("req_slots", &args.req_slots),
            input("positions", &args.positions),
            input("final_pos", &args.final_pos),
        ],
        &[],
    )?;
    pool.context().backend().store_swa(&args, stream)
}

pub fn store_compressed(pool: &Pool, raw: &StoreCompressedRaw, stream: Stream) -> Result<()> {
    pool.context().check_usable()?;
    let layer = pool.geometry().check_layer(raw.layer)?;
    let n = raw.num_rows;
    let args = StoreCompressedArgs {
        geometry: pool.geometry(),
        pool_layer: pool.layer_rows(layer),
        compressed_rows: pool
            .geometry()
            .compressed_rows(pool.geometry().ratio(layer)),
        num_rows: n,
        kv: raw
            .kv
            .view("kv", [tokens(n), Extent::Exact(HEAD_DIM)], ROW_ALIGN)?,
        loc: raw.loc.view("loc", [tokens(n)], 4)?,
    };
    aliasing::check(
        &[
            pool_output(raw.layer, Some(args.pool_layer)),
            input("kv", &args.kv),
            input("loc", &args.loc),
        ],
        &[],
    )?;
    pool.context().backend().store_compressed(&args, stream)
}
