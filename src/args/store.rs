//! The pool stores' contract.

use half::bf16;

use crate::args::LayerRows;
use crate::geometry::Geometry;
use crate::tensor::{Matrix, Vector};

/// Validated `store_swa` (FP8 pools quantize each row on the way in, see
/// `cache_layouts::unified`): row t of `kv` goes to ring row
/// `slot(batch_id[t]) * ring + positions[t] % ring` unless `batch_id[t] < 0`
/// (padding) or the position lies outside its request's final window
/// `(final_pos[b] - window, final_pos[b]]` when `final_pos` is given.
#[derive(Debug)]
pub struct StoreSwaArgs<'a> {
    pub geometry: &'a Geometry,
    pub pool_layer: LayerRows,
    pub num_tokens: usize,
    pub kv: Matrix<bf16>,
    pub batch_id: Vector<i32>,
    pub req_slots: Vector<i32>,
    pub positions: Vector<i32>,
    pub final_pos: Option<Vector<i32>>,
}

/// Validated `store_compressed`: row i of `kv` goes to pool row
/// `swa_rows + loc[i]`; rows with `loc[i] < 0` are skipped.
#[derive(Debug)]
pub struct StoreCompressedArgs<'a> {
    pub geometry: &'a Geometry,
    pub pool_layer: LayerRows,
    pub compressed_rows: usize,
    pub num_rows: usize,
    pub kv: Matrix<bf16>,
    pub loc: Vector<i32>,
}
