//! Inputs and the host oracle of the cache-store tests (tests/cache_store.rs on
//! the CPU backend, tests/gpu/cache_stores.rs against it): both layouts behind
//! one call shape, random rows and locations, and the bytes
//! `unikv::cache_layouts` writes for them.

use std::os::raw::c_void;
use std::ptr;

use half::bf16;
use rand::seq::SliceRandom;
use rand::Rng;
use unikv::cache_layouts::flashmla::{self, FlashMlaGeometry};
use unikv::cache_layouts::indexer::{self, IndexerGeometry};
use unikv::ffi::cache_store::*;
use unikv::ffi::status::unikv_status;
use unikv::ffi::types::{unikv_dtype, unikv_tensor};
use unikv::fp8::Fp8Format;

use super::{Ctx, POISON_BYTE};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    FlashMla,
    Indexer,
}

impl Layout {
    pub const ALL: [Layout; 2] = [Layout::FlashMla, Layout::Indexer];

    /// Values per stored row.
    pub fn dims(self) -> usize {
        match self {
            Layout::FlashMla => 512,
            Layout::Indexer => 128,
        }
    }

    /// The page sizes docs/fp8.md defines (docs/fp8.md §5 table, docs/fp8.md §6).
    pub fn page_sizes(self) -> &'static [u64] {
        match self {
            Layout::FlashMla => &[2, 64, 256],
            Layout::Indexer => &[64],
        }
    }

    /// docs/fp8.md §5 `ceil(584·P / 576)·576`, docs/fp8.md §6 `132·P`.
    pub fn bytes_per_page(self, p: u64) -> u64 {
        match self {
            Layout::FlashMla => (584 * p).div_ceil(576) * 576,
            Layout::Indexer => 132 * p,
        }
    }
}

pub const FORMATS: [(Fp8Format, unikv_dtype); 2] = [
    (Fp8Format::E4m3Fn, unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN),
    (Fp8Format::E4m3Fnuz, unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ),
];

/// The descriptors and scalars of one store call, in either layout.
#[derive(Debug, Clone, Copy)]
pub struct StoreCall {
    pub layout: Layout,
    pub cache: unikv_tensor,
    pub rows: unikv_tensor,
    pub loc: unikv_tensor,
    pub page_size: u32,
    pub cache_dtype: u32,
    pub num_tokens: u32,
    pub reserved: u32,
}

impl StoreCall {
    /// `unikv_store_flashmla` or `unikv_store_indexer` on `ctx`.
    pub fn run(&self, ctx: &Ctx) -> unikv_status {
        match self.layout {
            Layout::FlashMla => {
                let args = unikv_store_flashmla_args {
                    struct_size: std::mem::size_of::<unikv_store_flashmla_args>(),
                    cache: self.cache,
                    kv: self.rows,
                    loc: self.loc,
                    page_size: self.page_size,
                    cache_dtype: self.cache_dtype,
                    num_tokens: self.num_tokens,
                    reserved: self.reserved,
                };
                unsafe { unikv_store_flashmla(ctx.0, &args, ptr::null_mut()) }
            }
            Layout::Indexer => {
                let args = unikv_store_indexer_args {
                    struct_size: std::mem::size_of::<unikv_store_indexer_args>(),
                    cache: self.cache,
                    key: self.rows,
                    loc: self.loc,
                    page_size: self.page_size,
                    cache_dtype: self.cache_dtype,
                    num_tokens: self.num_tokens,
                    reserved: self.reserved,
                };
                unsafe { unikv_store_indexer(ctx.0, &args, ptr::null_mut()) }
            }
        }
    }
}

/// A row-major 2-D descriptor with a row stride of `stride` elements.
pub fn strided(
    data: *const c_void,
    dtype: unikv_dtype,
    shape: [usize; 2],
    stride: usize,
) -> unikv_tensor {
    unikv_tensor {
        data: data as *mut c_void,
        dtype: dtype as u32,
        ndim: 2,
        shape: [shape[0] as i64, shape[1] as i64, 0, 0],
        strides: [stride as i64, 1, 0, 0],
    }
}

/// A 1-D descriptor of `len` elements.
pub fn vector(data: *const c_void, dtype: unikv_dtype, len: usize) -> unikv_tensor {
    unikv_tensor {
        data: data as *mut c_void,
        dtype: dtype as u32,
        ndim: 1,
        shape: [len as i64, 0, 0, 0],
        strides: [1, 0, 0, 0],
    }
}

/// A host byte buffer aligned to 16 bytes (caches need it), poisoned.
pub struct HostBytes {
    words: Vec<u128>,
    len: usize,
}

impl HostBytes {
    pub fn poisoned(len: usize) -> Self {
        let word = u128::from_ne_bytes([POISON_BYTE; 16]);
        HostBytes {
            words: vec![word; len.div_ceil(16) + 1],
            len,
        }
    }

    pub fn from_bytes(bytes: &[u8]) -> Self {
        let mut b = HostBytes::poisoned(bytes.len());
        b.bytes_mut().copy_from_slice(bytes);
        b
    }

    pub fn bytes(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast(), self.len) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast(), self.len) }
    }

    /// The first byte; the buffer has 16 spare bytes past `len` so a test may
    /// offset it (misalignment) without leaving the allocation.
    pub fn ptr(&self) -> *const c_void {
        self.words.as_ptr().cast()
    }
}

/// Random rows: each 64-dim group (a FlashMLA tile, half an indexer key) drawn
/// at its own magnitude, from below the 1e-4 amax floor up to a few thousand,
/// so scales and subnormal codes vary; rounded to bf16 values when `bf16`.
pub fn random_rows(rng: &mut impl Rng, layout: Layout, n: usize, bf16: bool) -> Vec<f32> {
    let magnitudes = [1e-6f32, 3e-3, 0.5, 1.0, 7.0, 300.0, 5000.0];
    let mut rows = Vec::with_capacity(n * layout.dims());
    for _ in 0..n * layout.dims() / 64 {
        let m = magnitudes[rng.random_range(0..magnitudes.len())];
        rows.extend((0..64).map(|_| {
            let x = rng.random_range(-m..m);
            if bf16 {
                half::bf16::from_f32(x).to_f32()
            } else {
                x
            }
        }));
    }
    rows
}

/// `n` locations into `slots` token slots of pages of `page_size`: distinct,
/// covering the first and last slot of pages where they fit, with about a
/// fifth negative (skipped; -1 and other negative values) but never the first,
/// so every case stores at least one token.
pub fn random_locations(rng: &mut impl Rng, slots: u64, page_size: u64, n: usize) -> Vec<i64> {
    let mut picks: Vec<i64> = (0..slots / page_size)
        .flat_map(|page| [page * page_size, page * page_size + page_size - 1])
        .map(|l| l as i64)
        .collect();
    picks.shuffle(rng);
    let mut rest: Vec<i64> = (0..slots as i64).filter(|l| !picks.contains(l)).collect();
    rest.shuffle(rng);
    picks.extend(rest);
    let negatives = [-1i64, -1, -1, -2, -(page_size as i64), i32::MIN as i64];
    let mut valid = picks.into_iter();
    (0..n)
        .map(|i| {
            if i > 0 && rng.random_bool(0.2) {
                negatives[rng.random_range(0..negatives.len())]
            } else {
                valid.next().unwrap_or(-1)
            }
        })
        .collect()
}

/// The cache `unikv::cache_layouts` makes from a poisoned one of `bytes`
/// bytes: row t of `rows` stored at `locations[t]`, negative ones skipped.
pub fn oracle(
    layout: Layout,
    page_size: u64,
    fmt: Fp8Format,
    bytes: usize,
    rows: &[f32],
    locations: &[i64],
) -> Vec<u8> {
    let mut cache = vec![POISON_BYTE; bytes];
    let dims = layout.dims();
    for (row, &l) in rows.chunks_exact(dims).zip(locations) {
        match layout {
            Layout::FlashMla => {
                let g = FlashMlaGeometry::new(page_size, fmt).unwrap();
                let row: Vec<bf16> = row.iter().map(|&x| bf16::from_f32(x)).collect();
                flashmla::store_token(&mut cache, &g, l, &row).unwrap();
            }
            Layout::Indexer => {
                let g = IndexerGeometry::new(page_size, fmt).unwrap();
                indexer::store_token(&mut cache, &g, l, row).unwrap();
            }
        }
    }
    cache
}

/// One random store: rows (bf16 or f32) with a padded row stride and spare
/// rows, locations (int32 or int64) with spare entries past `num_tokens` that
/// point outside the cache (they must be ignored), into a cache of
/// `num_pages` pages.
#[derive(Debug, Clone)]
pub struct Case {
    pub layout: Layout,
    pub page_size: u64,
    pub fmt: Fp8Format,
    pub cache_dtype: unikv_dtype,
    pub num_pages: usize,
    /// `num_tokens × dims` values (bf16-representable unless `f32_rows`).
    pub rows: Vec<f32>,
    pub locations: Vec<i64>,
    pub f32_rows: bool,
    pub loc_i64: bool,
}

/// Elements of row padding and spare rows / location entries in a `Case`.
const ROW_PAD: usize = 8;
const SPARE: usize = 3;

impl Case {
    /// Up to `max_tokens` tokens (at least one) into 2 to 5 pages.
    pub fn random(
        rng: &mut impl Rng,
        layout: Layout,
        page_size: u64,
        (fmt, cache_dtype): (Fp8Format, unikv_dtype),
        max_tokens: usize,
    ) -> Case {
        let num_pages = rng.random_range(2..=5usize);
        let slots = num_pages as u64 * page_size;
        let n = rng.random_range(1..=max_tokens);
        let f32_rows = layout == Layout::Indexer && rng.random_bool(0.5);
        Case {
            layout,
            page_size,
            fmt,
            cache_dtype,
            num_pages,
            rows: random_rows(rng, layout, n, !f32_rows),
            locations: random_locations(rng, slots, page_size, n),
            f32_rows,
            loc_i64: rng.random_bool(0.5),
        }
    }

    pub fn num_tokens(&self) -> usize {
        self.locations.len()
    }

    pub fn bytes_per_page(&self) -> usize {
        self.layout.bytes_per_page(self.page_size) as usize
    }

    pub fn cache_bytes(&self) -> usize {
        self.num_pages * self.bytes_per_page()
    }

    fn row_stride(&self) -> usize {
        self.layout.dims() + ROW_PAD
    }

    /// The row buffer: `num_tokens + SPARE` rows of `row_stride` elements.
    pub fn row_buffer(&self) -> HostBytes {
        let (dims, stride) = (self.layout.dims(), self.row_stride());
        let rows = self.num_tokens() + SPARE;
        let mut values = vec![0f32; rows * stride];
        for (t, row) in self.rows.chunks_exact(dims).enumerate() {
            values[t * stride..][..dims].copy_from_slice(row);
        }
        let bytes: Vec<u8> = if self.f32_rows {
            values.iter().flat_map(|x| x.to_le_bytes()).collect()
        } else {
            values
                .iter()
                .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
                .collect()
        };
        HostBytes::from_bytes(&bytes)
    }

    /// The location buffer: `num_tokens + SPARE` entries, the spare ones past
    /// the cache.
    pub fn loc_buffer(&self) -> HostBytes {
        let past = (self.num_pages as u64 * self.page_size) as i64;
        let all = self.locations.iter().copied().chain([past; SPARE]);
        let bytes: Vec<u8> = if self.loc_i64 {
            all.flat_map(i64::to_le_bytes).collect()
        } else {
            all.flat_map(|l| (l as i32).to_le_bytes()).collect()
        };
        HostBytes::from_bytes(&bytes)
    }

    /// The call over buffers at these addresses (host or device memory).
    pub fn call(&self, cache: *const c_void, rows: *const c_void, loc: *const c_void) -> StoreCall {
        let row_dtype = if self.f32_rows {
            unikv_dtype::UNIKV_DTYPE_F32
        } else {
            unikv_dtype::UNIKV_DTYPE_BF16
        };
        let loc_dtype = if self.loc_i64 {
            unikv_dtype::UNIKV_DTYPE_I64
        } else {
            unikv_dtype::UNIKV_DTYPE_I32
        };
        let n = self.num_tokens();
        let bpp = self.bytes_per_page();
        StoreCall {
            layout: self.layout,
            cache: strided(
                cache,
                unikv_dtype::UNIKV_DTYPE_U8,
                [self.num_pages, bpp],
                bpp,
            ),
            rows: strided(
                rows,
                row_dtype,
                [n + SPARE, self.layout.dims()],
                self.row_stride(),
            ),
            loc: vector(loc, loc_dtype, n + SPARE),
            page_size: self.page_size as u32,
            cache_dtype: self.cache_dtype as u32,
            num_tokens: n as u32,
            reserved: 0,
        }
    }

    /// The bytes `unikv::cache_layouts` writes into a poisoned cache.
    pub fn expected(&self) -> Vec<u8> {
        oracle(
            self.layout,
            self.page_size,
            self.fmt,
            self.cache_bytes(),
            &self.rows,
            &self.locations,
        )
    }
}

/// Six 64-value tiles through the FP8 codecs' edge cases: zeros, a NaN, ±Inf,
/// values near the bf16 maximum, bf16 subnormals, and values whose scaled
/// codes are ties between FP8 neighbours (17, 19, 21 at scale 1: round to the
/// even mantissa). Shared by the cache-store tests on both backends.
pub fn codec_edge_tiles() -> [Vec<f32>; 6] {
    [
        vec![0.0; 64],
        (0..64)
            .map(|i| if i == 5 { f32::NAN } else { i as f32 })
            .collect(),
        (0..64)
            .map(|i| match i {
                3 => f32::INFINITY,
                9 => f32::NEG_INFINITY,
                _ => -(i as f32),
            })
            .collect(),
        (0..64)
            .map(|i| if i % 2 == 0 { 3.0e38 } else { -1.5e38 })
            .collect(),
        (0..64).map(|i| (i as f32 - 30.0) * 1e-40).collect(),
        (0..64)
            .map(|i| [448.0, 17.0, 19.0, 21.0, -23.0, 0.0][i % 6])
            .collect(),
    ]
}
