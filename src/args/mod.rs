//! The contract between validation and the backends: `ops` checks a call's
//! descriptors into these typed views and hands them to one `Backend` method.
//! It sits below both, so backends never import the layer that calls them.
//! Device-resident values (indices, positions, locations) are not checked
//! here; `backend::rules` holds the checks every backend applies to them.

pub mod attention;
pub mod cache_store;
pub mod compressor;
pub mod index;
pub mod indexer;
pub mod merge;
pub mod prepare;
pub mod rope;
pub mod routing;
pub mod store;

use half::bf16;

use crate::fp8::Fp8Format;
use crate::tensor::Matrix;

/// One layer's rows as operations see them. Row ids are the same in both
/// kinds; an FP8 row is quantized on store and dequantized inside attention.
#[derive(Debug, Clone, Copy)]
pub enum LayerRows {
    Bf16(Matrix<bf16>),
    Fp8 {
        /// `[rows, 512]` bytes: 448 codes, 7 scale bytes twice, zero padding.
        nope: Matrix<u8>,
        /// `[rows, 64]` bf16.
        rope: Matrix<bf16>,
        format: Fp8Format,
    },
}

impl LayerRows {
    pub fn rows(&self) -> usize {
        match self {
            LayerRows::Bf16(m) => m.shape[0],
            LayerRows::Fp8 { nope, .. } => nope.shape[0],
        }
    }
}
