//! The indexer key cache of CSA layers (docs/fp8.md §6): one 128-dim
//! "lightning indexer" key per C4 compressed token, stored as 128 FP8 codes with
//! one plain fp32 scale per key (not a power of two).
//!
//! A page of P keys holds P value slots, then P scales:
//!
//! ```text
//! [ P × 128 FP8 codes ][ P × fp32 scale, little-endian ]     bytes_per_page = 132·P
//! ```
//!
//! The HIP "preshuffle" tiling and the FP4 variant of docs/fp8.md §6 are not implemented.

use super::Paging;
use crate::error::{ensure, Result};
use crate::fp8::{self, Fp8Format};

/// Dims per indexer key (Di).
pub const KEY_DIMS: usize = 128;
/// One fp32 scale per key.
pub const SCALE_BYTES: u64 = 4;
/// docs/fp8.md §6: one page per 256 raw tokens, i.e. 256/4 compressed entries.
pub const PAGE_SIZES: [u64; 1] = [64];

/// Where an indexer pool puts each key's bytes, and the FP8 flavour its codes
/// are in (writer and reader must agree on it, docs/fp8.md §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexerGeometry {
    paging: Paging,
    fmt: Fp8Format,
}

impl IndexerGeometry {
    /// The geometry of pages of `page_size` keys: only 64 is defined (docs/fp8.md §6),
    /// anything else is `InvalidArgument`. No padding: a page is `132·P` bytes.
    pub fn new(page_size: u64, fmt: Fp8Format) -> Result<Self> {
        let paging = Paging::new(
            "indexer",
            page_size,
            &PAGE_SIZES,
            (KEY_DIMS as u64, SCALE_BYTES),
            1,
        )?;
        Ok(IndexerGeometry { paging, fmt })
    }

    pub fn page_size(&self) -> u64 {
        self.paging.page_size
    }

    pub fn format(&self) -> Fp8Format {
        self.fmt
    }

    /// The page stride, `132·P` (8 448 bytes for P = 64).
    pub fn bytes_per_page(&self) -> u64 {
        self.paging.bytes_per_page
    }

    /// `value(loc) = page·132P + slot·128` (docs/fp8.md §6): the key's 128 codes.
    pub fn value_offset(&self, location: u64) -> u64 {
        self.paging.value_offset(location)
    }

    /// `scale(loc) = page·132P + 128·P + slot·4` (docs/fp8.md §6): the key's fp32 scale,
    /// naturally aligned.
    pub fn scale_offset(&self, location: u64) -> u64 {
        self.paging.scale_offset(location)
    }
}

/// Quantizes one indexer key (128 values) and writes it at `location` of
/// `cache`, a `[num_pages, bytes_per_page]` byte buffer.
///
/// The arithmetic is docs/fp8.md §3's, in fp32, rounding at each step:
/// `amax` = NaN-ignoring max of |x| (exact), `scale = max(amax, 1e-4) / fmt.max()`
/// (IEEE division), `inv = 1 / scale` (correctly rounded reciprocal, not a
/// power of two), `code = encode(x · inv)` (fp32 product, then FP8 rounding to
/// nearest even with saturation), and `scale` itself is stored. A device port
/// must round the same way: IEEE division and reciprocal, not the fast
/// approximations. For finite inputs `inv` lies in [7e-37, 4.5e6], normal, so
/// flush-to-zero cannot change it.
///
/// NaN elements encode to the NaN code (the codec's policy, docs/fp8.md §2). An
/// infinite element makes the scale Inf and `inv` 0, so that element encodes
/// to NaN (Inf · 0) and the others to zero: the kernels' reciprocal gives that
/// key no usable value, and dividing instead would change the rounding of
/// every finite key.
///
/// The input is fp32 because the production writer quantizes the key in fp32
/// right after the Hadamard transform (docs/indexer.md §2); bf16 keys widen exactly.
///
/// A negative location writes nothing and succeeds. A key that is not 128
/// values (`BadShape`), a cache that is not whole pages (`BadShape`) or a
/// location past the last page (`OutOfRange`) fail before anything is written.
pub fn store_token(
    cache: &mut [u8],
    geometry: &IndexerGeometry,
    location: i64,
    key: &[f32],
) -> Result<()> {
    ensure!(
        key.len() == KEY_DIMS,
        BadShape,
        "key: {} values, expected {KEY_DIMS}",
        key.len()
    );
    let Some(location) = geometry.paging.store_location(cache.len(), location)? else {
        return Ok(());
    };
    let (codes, scale) = quantize_key(key, geometry.fmt);
    let value = geometry.value_offset(location) as usize;
    cache[value..value + KEY_DIMS].copy_from_slice(&codes);
    let scale_at = geometry.scale_offset(location) as usize;
    cache[scale_at..scale_at + SCALE_BYTES as usize].copy_from_slice(&scale.to_le_bytes());
    Ok(())
}

/// The codes and fp32 scale of one key (see `store_token` for the rounding);
/// the indexer's queries are quantized the same way (docs/indexer.md §1 step 3).
pub fn quantize_key(key: &[f32], fmt: Fp8Format) -> ([u8; KEY_DIMS], f32) {
    let mut codes = [0u8; KEY_DIMS];
    let scale = fp8::quantize_fp32_scale(key, fmt, fmt.max(), &mut codes);
    (codes, scale)
}

/// The key at `location`, as stored: its 128 codes and its fp32 scale. Fails
/// like `dequantize_token`.
pub fn stored_key<'a>(
    cache: &'a [u8],
    geometry: &IndexerGeometry,
    location: i64,
) -> Result<(&'a [u8], f32)> {
    let location = geometry.paging.read_location(cache.len(), location)?;
    let value = geometry.value_offset(location) as usize;
    let scale_at = geometry.scale_offset(location) as usize;
    let scale_bytes = &cache[scale_at..scale_at + SCALE_BYTES as usize];
    let scale = f32::from_le_bytes(scale_bytes.try_into().expect("four scale bytes"));
    Ok((&cache[value..value + KEY_DIMS], scale))
}

/// The 128 values the indexer reads for the key at `location` (docs/fp8.md §6):
/// `decode(code) · scale`, one fp32 product, rounded to nearest even. Fails
/// like `store_token` on a bad cache or location, and with `OutOfRange` for a
/// negative location.
pub fn dequantize_token(
    cache: &[u8],
    geometry: &IndexerGeometry,
    location: i64,
) -> Result<Vec<f32>> {
    let (codes, scale) = stored_key(cache, geometry, location)?;
    Ok(codes
        .iter()
        .map(|&c| fp8::decode(c, geometry.fmt) * scale)
        .collect())
}
