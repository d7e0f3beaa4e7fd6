//! The FlashMLA FP8 KV cache (docs/fp8.md §5), used for the SWA pool and
//! the C4 and C128 compressed pools: one 512-dim latent per token, whose 448
//! "nope" dims are stored as FP8 codes with one UE8M0 scale per 64-dim tile and
//! whose 64 RoPE dims stay bf16.
//!
//! A page of P tokens holds P value slots, then P scale slots, then zero padding
//! up to a multiple of 576 bytes:
//!
//! ```text
//! [ P × 576 value slots ][ P × 8 scale slots ][ zero padding ]
//! value slot: 448 FP8 codes (dims 0..448) | 64 bf16, little-endian (dims 448..512)
//! scale slot: 7 UE8M0 bytes (tile k = dims 64k..64k+64) | 1 padding byte
//! ```

use half::bf16;

use super::Paging;
use crate::error::{ensure, Result};
use crate::fp8::{self, Fp8Format};

/// Latent dims per token (K and V are the same vector, MQA).
pub const TOKEN_DIMS: usize = 512;
/// Dims 0..448 are quantized to FP8; dims 448..512 (the RoPE'd part) stay bf16.
pub const NOPE_DIMS: usize = 448;
/// Dims per UE8M0 scale.
pub const TILE_DIMS: usize = 64;
/// Scales per token.
pub const NOPE_TILES: usize = NOPE_DIMS / TILE_DIMS;
/// 448 one-byte codes plus 64 two-byte bf16 values.
pub const VALUE_SLOT_BYTES: u64 = 576;
/// 7 scale bytes plus one padding byte that is never read or written.
pub const SCALE_SLOT_BYTES: u64 = 8;
/// The page sizes of docs/fp8.md §5: SWA pool 256, C4 pool 256/4, C128 pool 256/128.
pub const PAGE_SIZES: [u64; 3] = [256, 64, 2];

/// Where a FlashMLA pool puts each token's bytes, and the FP8 flavour its codes
/// are in (writer and reader must agree on it, docs/fp8.md §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlashMlaGeometry {
    paging: Paging,
    fmt: Fp8Format,
}

impl FlashMlaGeometry {
    /// The geometry of pages of `page_size` tokens: 2, 64 or 256, else
    /// `InvalidArgument`. The page stride is `ceil(584·P / 576)·576` (docs/fp8.md §5): the
    /// 584 bytes a token uses, rounded up to whole value slots.
    pub fn new(page_size: u64, fmt: Fp8Format) -> Result<Self> {
        let slots = (VALUE_SLOT_BYTES, SCALE_SLOT_BYTES);
        let paging = Paging::new("FlashMLA", page_size, &PAGE_SIZES, slots, VALUE_SLOT_BYTES)?;
        Ok(FlashMlaGeometry { paging, fmt })
    }

    pub fn page_size(&self) -> u64 {
        self.paging.page_size
    }

    pub fn format(&self) -> Fp8Format {
        self.fmt
    }

    /// The page stride: 1 728, 37 440 or 149 760 bytes for P = 2, 64, 256.
    pub fn bytes_per_page(&self) -> u64 {
        self.paging.bytes_per_page
    }

    /// `value(loc) = page·bytes_per_page + slot·576` (docs/fp8.md §5): the token's 448
    /// codes. Offsets are 64-bit: a per-layer cache passes 2 GiB in production.
    pub fn value_offset(&self, location: u64) -> u64 {
        self.paging.value_offset(location)
    }

    /// `rope(loc) = value(loc) + 448` (docs/fp8.md §5): the token's 64 bf16 values,
    /// 16-byte aligned.
    pub fn rope_offset(&self, location: u64) -> u64 {
        self.value_offset(location) + NOPE_DIMS as u64
    }

    /// `scale(loc, 0) = page·bytes_per_page + 576·P + slot·8` (docs/fp8.md §5): the
    /// token's scale slot; tile k's byte is at `+k`, the padding byte at `+7`.
    pub fn scale_offset(&self, location: u64) -> u64 {
        self.paging.scale_offset(location)
    }
}

/// Quantizes one token's latent `row` (512 bf16 values) and writes it at
/// `location` of `cache`, a `[num_pages, bytes_per_page]` byte buffer.
///
/// Each 64-dim nope tile goes through `fp8::quantize_block` (docs/fp8.md §3): UE8M0 byte
/// from the tile's NaN-ignoring amax floored at 1e-4, codes `encode(x / 2^(e-127))`
/// with round-to-nearest-even and saturation. The division by a power of two is
/// exact, so FP8 encoding is the only rounding. A NaN element encodes to the
/// NaN code, not to +448 as the CUDA kernels' `fminf` clip makes it (the
/// codec's policy for docs/fp8.md §2). The RoPE dims are copied
/// bit for bit. The scale slot's padding byte and the page's tail padding are
/// never written: they keep whatever the allocation put there (zeros in docs/fp8.md §5).
///
/// The input is bf16 because the stored codes are those of the bf16-rounded
/// latent (docs/prepare.md §5, which notes that one production kernel
/// quantizes the fp32 value instead).
///
/// A negative location writes nothing and succeeds. A row that is not 512
/// values (`BadShape`), a cache that is not whole pages (`BadShape`) or a
/// location past the last page (`OutOfRange`) fail before anything is written.
pub fn store_token(
    cache: &mut [u8],
    geometry: &FlashMlaGeometry,
    location: i64,
    row: &[bf16],
) -> Result<()> {
    ensure!(
        row.len() == TOKEN_DIMS,
        BadShape,
        "row: {} values, expected {TOKEN_DIMS} (448 nope + 64 rope)",
        row.len()
    );
    let Some(location) = geometry.paging.store_location(cache.len(), location)? else {
        return Ok(());
    };
    let (nope, rope) = row.split_at(NOPE_DIMS);
    let (codes, scales) = quantize_nope(nope, geometry.fmt);

    let value = geometry.value_offset(location) as usize;
    cache[value..value + NOPE_DIMS].copy_from_slice(&codes);
    let rope_start = geometry.rope_offset(location) as usize;
    let rope_bytes = &mut cache[rope_start..value + VALUE_SLOT_BYTES as usize];
    for (bytes, x) in rope_bytes.chunks_exact_mut(2).zip(rope) {
        bytes.copy_from_slice(&x.to_le_bytes());
    }
    let scale = geometry.scale_offset(location) as usize;
    cache[scale..scale + NOPE_TILES].copy_from_slice(&scales);
    Ok(())
}

/// The 448 codes and 7 UE8M0 bytes of the nope dims, tile by tile (shared with
/// the unified pool's FP8 rows, which quantize the same way).
pub(crate) fn quantize_nope(nope: &[bf16], fmt: Fp8Format) -> ([u8; NOPE_DIMS], [u8; NOPE_TILES]) {
    let mut codes = [0u8; NOPE_DIMS];
    let mut scales = [0u8; NOPE_TILES];
    let tiles = nope
        .chunks_exact(TILE_DIMS)
        .zip(codes.chunks_exact_mut(TILE_DIMS));
    for ((tile, tile_codes), scale) in tiles.zip(&mut scales) {
        let values: [f32; TILE_DIMS] = std::array::from_fn(|i| tile[i].to_f32());
        *scale = fp8::quantize_block(&values, fmt, tile_codes);
    }
    (codes, scales)
}

/// The 512 values the attention reader sees for the token at `location` (docs/fp8.md §5):
/// `decode(code) · 2^(s_k - 127)` for nope dim d in tile k, the bf16 value for
/// the RoPE dims.
///
/// Exact for every byte `store_token` writes: an FP8 value times a power of two
/// within f32's normal range needs no rounding (only an Inf tile, scale 2^127,
/// overflows, to ±Inf). Fails like `store_token` on a bad cache or location,
/// and with `OutOfRange` for a negative location.
pub fn dequantize_token(
    cache: &[u8],
    geometry: &FlashMlaGeometry,
    location: i64,
) -> Result<Vec<f32>> {
    let location = geometry.paging.read_location(cache.len(), location)?;
    let mut out = vec![0.0; TOKEN_DIMS];
    dequantize_at(cache, geometry, location, &mut out);
    Ok(out)
}

/// `dequantize_token` of a location already checked against the cache (the
/// attention reader's per-key path): writes the 512 values into `out`.
///
/// # Panics
/// When the token's bytes lie past the end of `cache` or `out` is shorter
/// than 512 values.
pub fn dequantize_at(cache: &[u8], geometry: &FlashMlaGeometry, location: u64, out: &mut [f32]) {
    let value = geometry.value_offset(location) as usize;
    let codes = &cache[value..value + NOPE_DIMS];
    let scale = geometry.scale_offset(location) as usize;
    let scales = &cache[scale..scale + NOPE_TILES];
    let rope_start = geometry.rope_offset(location) as usize;
    let rope = &cache[rope_start..value + VALUE_SLOT_BYTES as usize];

    let (nope_out, rope_out) = out[..TOKEN_DIMS].split_at_mut(NOPE_DIMS);
    let tiles = codes
        .chunks_exact(TILE_DIMS)
        .zip(nope_out.chunks_exact_mut(TILE_DIMS));
    for ((tile, tile_out), &byte) in tiles.zip(scales) {
        let scale = fp8::ue8m0_to_f32(byte);
        for (o, &c) in tile_out.iter_mut().zip(tile) {
            *o = fp8::decode(c, geometry.fmt) * scale;
        }
    }
    for (o, b) in rope_out.iter_mut().zip(rope.chunks_exact(2)) {
        *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

/// Token slots of a cache of `num_pages` pages: the token ids
/// (`page * page_size + slot`) a reader accepts are below it.
pub fn token_slots(geometry: &FlashMlaGeometry, num_pages: usize) -> usize {
    num_pages * geometry.page_size() as usize
}
