//! Pools with compressor state, a layer's compressor parameters, requests'
//! raw rows, and calls of `unikv_compress_decode` / `_prefill` through the C
//! ABI on the CPU backend (host memory), with readers for the outputs and the
//! state.

use std::ptr;

use half::bf16;
use rand::Rng;
use unikv::cache_layouts::flashmla::FlashMlaGeometry;
use unikv::cache_layouts::indexer::IndexerGeometry;
use unikv::cache_layouts::{flashmla, indexer, unified};
use unikv::ffi::compressor::*;
use unikv::ffi::pool::*;
use unikv::ffi::status::unikv_status;
use unikv::ffi::types::unikv_dtype;
use unikv::fp8::Fp8Format;

use crate::common::cache_store::{strided, vector, HostBytes};
use crate::common::*;

pub const RATIOS: [u32; 3] = [0, 4, 128];
pub const CSA: u32 = 1;
pub const HCA: u32 = 2;
pub const EPS: f32 = 1e-6;
/// Rows of the RoPE tables.
pub const MAX_POS: u32 = 1024;
/// Pages of the FlashMLA and indexer caches (64 tokens each).
pub const CACHE_PAGES: usize = 6;
pub const CACHE_PAGE: u32 = 64;

pub fn spec() -> PoolSpec {
    PoolSpec {
        ratios: RATIOS.to_vec(),
        max_requests: 3,
        window: 8,
        spec_extra: 0,
        c128_blocks: 8,
    }
}

/// Pool parameters with compressor state of the given rings.
pub fn state_params(s: &PoolSpec, dtype: unikv_dtype, rings: (u32, u32)) -> unikv_pool_params {
    unikv_pool_params {
        compressor_state: 1,
        c4_state_ring: rings.0,
        c128_state_ring: rings.1,
        ..s.params_of(dtype)
    }
}

/// A compressor of the test pool: layer and `unikv_compressor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    pub layer: u32,
    pub compressor: u32,
}

pub const CSA_KV: Kind = Kind {
    layer: CSA,
    compressor: 0,
};
pub const CSA_INDEXER: Kind = Kind {
    layer: CSA,
    compressor: 1,
};
pub const HCA_KV: Kind = Kind {
    layer: HCA,
    compressor: 0,
};
pub const KINDS: [Kind; 3] = [CSA_KV, CSA_INDEXER, HCA_KV];

impl Kind {
    pub fn ratio(self) -> usize {
        RATIOS[self.layer as usize] as usize
    }
    pub fn dim(self) -> usize {
        if self.compressor == 1 {
            128
        } else {
            512
        }
    }
    /// Value floats of a raw row (the scores follow).
    pub fn values(self) -> usize {
        if self.ratio() == 4 {
            2 * self.dim()
        } else {
            self.dim()
        }
    }
    pub fn row(self) -> usize {
        2 * self.values()
    }
    pub fn indexer(self) -> bool {
        self.compressor == 1
    }
    /// Where group n of request b goes (distinct for b < 3 and n < 64 (ratio
    /// 4) or n < 3 (ratio 128), inside the pool's compressed rows and the
    /// caches).
    pub fn loc(self, b: usize, n: usize) -> i64 {
        if self.ratio() == 4 {
            (b * 64 + n) as i64
        } else {
            (b * 3 + n) as i64
        }
    }
}

/// A layer compressor's parameters: `ape` `[ratio, values]`, the norm weight
/// (bf16 values) and the layer's RoPE table.
pub struct Model {
    pub kind: Kind,
    pub ape: Vec<f32>,
    pub norm: Vec<f32>,
    pub table: Vec<f32>,
}

impl Model {
    pub fn random(rng: &mut impl Rng, kind: Kind) -> Self {
        Model {
            kind,
            ape: (0..kind.ratio() * kind.values())
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect(),
            norm: (0..kind.dim())
                .map(|_| bf16::from_f32(rng.random_range(0.5f32..1.5)).to_f32())
                .collect(),
            table: rope_table(40000.0, 4.0, MAX_POS),
        }
    }

    /// The f64 reference of group n of a request whose raw rows are `rows`.
    pub fn reference(&self, rows: &[Vec<f32>], n: usize) -> Vec<f64> {
        let k = self.kind;
        let first = k.ratio() * n;
        crate::reference::group(
            k.ratio(),
            k.dim(),
            n,
            rows,
            &self.ape,
            &self.norm,
            EPS,
            &self.table[first * 64..first * 64 + 64],
            k.indexer(),
        )
    }
}

/// Random raw rows of one request: values in [-2, 2), scores in [-4, 4)
/// (softmax weights of real spread); rounded to bf16 values when `bf16`.
pub fn random_rows(rng: &mut impl Rng, kind: Kind, len: usize, bf16_values: bool) -> Vec<Vec<f32>> {
    (0..len)
        .map(|_| {
            (0..kind.row())
                .map(|i| {
                    let x = if i < kind.values() {
                        rng.random_range(-2.0f32..2.0)
                    } else {
                        rng.random_range(-4.0f32..4.0)
                    };
                    if bf16_values {
                        bf16::from_f32(x).to_f32()
                    } else {
                        x
                    }
                })
                .collect()
        })
        .collect()
}

/// One token of a call.
#[derive(Debug, Clone)]
pub struct Tok {
    pub b: i32,
    pub pos: i64,
    pub row: Vec<f32>,
    pub loc: i64,
}

/// Token `pos` of request `b` (its row from `rows`), with the location of
/// the group it closes, if any.
pub fn tok(kind: Kind, b: usize, pos: usize, rows: &[Vec<f32>]) -> Tok {
    let r = kind.ratio();
    let loc = if (pos + 1) % r == 0 {
        kind.loc(b, (pos + 1) / r - 1)
    } else {
        -1
    };
    Tok {
        b: b as i32,
        pos: pos as i64,
        row: rows[pos].clone(),
        loc,
    }
}

/// A padding token with a garbage row.
pub fn padding(kind: Kind) -> Tok {
    Tok {
        b: -1,
        pos: 1 << 40,
        row: vec![f32::NAN; kind.row()],
        loc: 0,
    }
}

/// Where a call stores its groups.
pub enum Target {
    Pool,
    FlashMla(Fp8Format, HostBytes),
    Indexer(Fp8Format, HostBytes),
}

impl Target {
    pub fn flashmla(fmt: Fp8Format) -> Self {
        let g = FlashMlaGeometry::new(CACHE_PAGE.into(), fmt).unwrap();
        Target::FlashMla(
            fmt,
            HostBytes::poisoned(CACHE_PAGES * g.bytes_per_page() as usize),
        )
    }
    pub fn indexer(fmt: Fp8Format) -> Self {
        let g = IndexerGeometry::new(CACHE_PAGE.into(), fmt).unwrap();
        Target::Indexer(
            fmt,
            HostBytes::poisoned(CACHE_PAGES * g.bytes_per_page() as usize),
        )
    }
    /// The default target of a kind: the pool for the attention compressor,
    /// an e4m3fn indexer cache for the indexer's.
    pub fn of(kind: Kind) -> Self {
        if kind.indexer() {
            Target::indexer(Fp8Format::E4m3Fn)
        } else {
            Target::Pool
        }
    }
}

pub fn fp8_dtype(fmt: Fp8Format) -> u32 {
    match fmt {
        Fp8Format::E4m3Fn => unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN as u32,
        Fp8Format::E4m3Fnuz => unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ as u32,
    }
}

/// A CPU context and a pool with compressor state.
pub struct Setup {
    pub pool: Pool,
    pub ctx: Ctx,
    pub dtype: unikv_dtype,
}

impl Setup {
    pub fn new(dtype: unikv_dtype, rings: (u32, u32)) -> Self {
        let ctx = Ctx::cpu(2);
        let mut pool = ptr::null_mut();
        ok(unsafe { unikv_pool_create(ctx.0, &state_params(&spec(), dtype, rings), &mut pool) });
        Setup {
            pool: Pool(pool),
            ctx,
            dtype,
        }
    }

    pub fn bf16() -> Self {
        Self::new(unikv_dtype::UNIKV_DTYPE_BF16, (8, 128))
    }

    pub fn compressor(&self, kind: Kind) -> unikv_compressor_info {
        let mut info: unikv_compressor_info = unsafe { std::mem::zeroed() };
        info.struct_size = std::mem::size_of_val(&info);
        ok(unsafe {
            unikv_pool_get_compressor(self.pool.0, kind.layer, kind.compressor, &mut info)
        });
        info
    }

    /// The compressor's state as host floats (the CPU backend's memory).
    #[allow(clippy::mut_from_ref)]
    pub fn state(&self, kind: Kind) -> &mut [f32] {
        let info = self.compressor(kind);
        unsafe { std::slice::from_raw_parts_mut(info.state as *mut f32, info.bytes as usize / 4) }
    }

    /// The raw row of `slot` at `pos` in the state.
    pub fn state_row(&self, kind: Kind, slot: usize, pos: usize) -> Vec<f32> {
        let info = self.compressor(kind);
        let ring = info.ring as usize;
        let r = slot * ring + pos % ring;
        self.state(kind)[r * kind.row()..(r + 1) * kind.row()].to_vec()
    }

    /// Every byte a call may write: the state, and the pool layer's rows or
    /// the cache.
    pub fn snapshot(&self, kind: Kind, target: &Target) -> Vec<u8> {
        let mut out = bytes_of(self.state(kind));
        match target {
            Target::Pool => {
                let info = self.pool.layer(kind.layer);
                out.extend(unsafe {
                    std::slice::from_raw_parts(info.data as *const u8, info.bytes as usize)
                });
                if !info.rope_data.is_null() {
                    out.extend(unsafe {
                        std::slice::from_raw_parts(
                            info.rope_data as *const u8,
                            info.rope_bytes as usize,
                        )
                    });
                }
            }
            Target::FlashMla(_, c) | Target::Indexer(_, c) => out.extend_from_slice(c.bytes()),
        }
        out
    }

    /// Poisons the layer's pool rows (the state keeps its contents).
    pub fn poison_rows(&self, layer: u32) {
        let info = self.pool.layer(layer);
        unsafe {
            std::ptr::write_bytes(info.data as *mut u8, POISON_BYTE, info.bytes as usize);
            if !info.rope_data.is_null() {
                std::ptr::write_bytes(
                    info.rope_data as *mut u8,
                    POISON_BYTE,
                    info.rope_bytes as usize,
                );
            }
        }
    }

    /// The stored values of the group at `loc` (FP8 dequantized).
    pub fn stored(&self, kind: Kind, target: &Target, loc: i64) -> Vec<f32> {
        match target {
            Target::Pool => {
                let info = self.pool.layer(kind.layer);
                let row = info.swa_rows as usize + loc as usize;
                if info.rope_data.is_null() {
                    let rows = info.data as *const bf16;
                    (0..512)
                        .map(|d| unsafe { *rows.add(row * 512 + d) }.to_f32())
                        .collect()
                } else {
                    let fmt = match self.dtype {
                        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ => Fp8Format::E4m3Fnuz,
                        _ => Fp8Format::E4m3Fn,
                    };
                    let nope = unsafe {
                        std::slice::from_raw_parts((info.data as *const u8).add(row * 512), 512)
                    };
                    let rope = unsafe {
                        std::slice::from_raw_parts(
                            (info.rope_data as *const bf16).add(row * 64),
                            64,
                        )
                    };
                    let mut out = vec![0f32; 512];
                    unified::dequantize_row(nope, rope, fmt, &mut out);
                    out
                }
            }
            Target::FlashMla(fmt, c) => {
                let g = FlashMlaGeometry::new(CACHE_PAGE.into(), *fmt).unwrap();
                flashmla::dequantize_token(c.bytes(), &g, loc).unwrap()
            }
            Target::Indexer(fmt, c) => {
                let g = IndexerGeometry::new(CACHE_PAGE.into(), *fmt).unwrap();
                indexer::dequantize_token(c.bytes(), &g, loc).unwrap()
            }
        }
    }

    /// Runs one call; `req_slots[b]` is request b's slot; the raw rows are
    /// passed as bf16 when `bf16_rows` (their values must be bf16 values).
    pub fn call(
        &self,
        model: &Model,
        decode: bool,
        toks: &[Tok],
        req_slots: &[i32],
        target: &Target,
        bf16_rows: bool,
    ) -> unikv_status {
        let mut call = Call::new(self, model, toks, req_slots, target, bf16_rows);
        call.run(decode)
    }
}

/// The buffers and arguments of one call, for tests that edit the args.
pub struct Call<'a> {
    pub setup: &'a Setup,
    pub args: unikv_compress_args,
    pub rows: HostBytes,
    pub batch: Vec<i32>,
    pub positions: Vec<i64>,
    pub loc: Vec<i64>,
    pub req_slots: Vec<i32>,
    pub ape: Vec<f32>,
    pub norm: Vec<f32>,
    pub table: Vec<f32>,
}

impl<'a> Call<'a> {
    pub fn new(
        setup: &'a Setup,
        model: &Model,
        toks: &[Tok],
        req_slots: &[i32],
        target: &Target,
        bf16_rows: bool,
    ) -> Box<Self> {
        let kind = model.kind;
        let w = kind.row();
        let elem = if bf16_rows { 2 } else { 4 };
        let mut rows = HostBytes::poisoned(toks.len().max(1) * w * elem);
        for (t, tk) in toks.iter().enumerate() {
            let bytes = rows.bytes_mut();
            for (i, &x) in tk.row.iter().enumerate() {
                let at = (t * w + i) * elem;
                if bf16_rows {
                    bytes[at..at + 2].copy_from_slice(&bf16::from_f32(x).to_le_bytes());
                } else {
                    bytes[at..at + 4].copy_from_slice(&x.to_le_bytes());
                }
            }
        }
        let mut c = Box::new(Call {
            setup,
            args: unsafe { std::mem::zeroed() },
            rows,
            batch: toks.iter().map(|t| t.b).collect(),
            positions: toks.iter().map(|t| t.pos).collect(),
            loc: toks.iter().map(|t| t.loc).collect(),
            req_slots: req_slots.to_vec(),
            ape: model.ape.clone(),
            norm: model.norm.clone(),
            table: model.table.clone(),
        });
        let n = toks.len();
        let row_dtype = if bf16_rows {
            unikv_dtype::UNIKV_DTYPE_BF16
        } else {
            unikv_dtype::UNIKV_DTYPE_F32
        };
        let (cache, cache_dtype, page_size) = match target {
            Target::Pool => (absent(), 0, 0),
            Target::FlashMla(fmt, b) | Target::Indexer(fmt, b) => {
                let bpp = b.bytes().len() / CACHE_PAGES;
                (
                    strided(
                        b.ptr(),
                        unikv_dtype::UNIKV_DTYPE_U8,
                        [CACHE_PAGES, bpp],
                        bpp,
                    ),
                    fp8_dtype(*fmt),
                    CACHE_PAGE,
                )
            }
        };
        c.args = unikv_compress_args {
            struct_size: std::mem::size_of::<unikv_compress_args>(),
            kv_score: strided(c.rows.ptr(), row_dtype, [n, w], w),
            ape: tensor(&c.ape, &[kind.ratio(), kind.values()]),
            norm_weight: vec1(&c.norm),
            rope_table: tensor(&c.table, &[MAX_POS as usize, 64]),
            batch_id: vec1(&c.batch),
            req_slots: vec1(&c.req_slots),
            positions: vector(c.positions.as_ptr().cast(), unikv_dtype::UNIKV_DTYPE_I64, n),
            loc: vector(c.loc.as_ptr().cast(), unikv_dtype::UNIKV_DTYPE_I64, n),
            cache,
            layer: kind.layer,
            compressor: kind.compressor,
            num_tokens: n as u32,
            cache_dtype,
            page_size,
            eps: EPS,
        };
        c
    }

    pub fn run(&mut self, decode: bool) -> unikv_status {
        let f = if decode {
            unikv_compress_decode
        } else {
            unikv_compress_prefill
        };
        unsafe { f(self.setup.pool.0, &self.args, ptr::null_mut()) }
    }
}
