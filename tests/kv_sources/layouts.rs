//! The test's own view of the two layouts: f64 decoders written from
//! docs/fp8.md (§1 codes, §5 FlashMLA pages, §8 scaled rows), and the caches
//! the tests attend over (FlashMLA pages written by `unikv_store_flashmla`,
//! scaled rows with random codes and arbitrary fp32 scales).
// Shared with tests/gpu (kv_sources.rs), which uses a different subset.
#![allow(dead_code)]

use std::ptr;

use half::bf16;
use rand::rngs::StdRng;
use rand::Rng;
use unikv::ffi::attention::{unikv_kv_cache, unikv_kv_layout};
use unikv::ffi::cache_store::{unikv_store_flashmla, unikv_store_flashmla_args};
use unikv::ffi::types::unikv_dtype;

use crate::common::*;
use crate::D;

/// An FP8 flavour as the C API names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fmt {
    Fn,
    Fnuz,
}

impl Fmt {
    pub(crate) const ALL: [Fmt; 2] = [Fmt::Fn, Fmt::Fnuz];

    pub(crate) fn dtype(self) -> u32 {
        match self {
            Fmt::Fn => unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN as u32,
            Fmt::Fnuz => unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ as u32,
        }
    }

    /// docs/fp8.md §1: fn has bias 7 and NaN at 0x7F / 0xFF; fnuz bias 8,
    /// NaN 0x80 only.
    pub(crate) fn is_nan(self, code: u8) -> bool {
        match self {
            Fmt::Fn => code & 0x7F == 0x7F,
            Fmt::Fnuz => code == 0x80,
        }
    }

    /// The value of an E4M3 code, in f64 (exact).
    pub(crate) fn decode(self, code: u8) -> f64 {
        if self.is_nan(code) {
            return f64::NAN;
        }
        let bias = match self {
            Fmt::Fn => 7,
            Fmt::Fnuz => 8,
        };
        let e = i32::from((code >> 3) & 0xF);
        let m = f64::from(code & 7);
        let magnitude = if e == 0 {
            m / 8.0 * 2f64.powi(1 - bias)
        } else {
            (1.0 + m / 8.0) * 2f64.powi(e - bias)
        };
        if code & 0x80 != 0 {
            -magnitude
        } else {
            magnitude
        }
    }

    /// A random code that is not NaN.
    pub(crate) fn random_code(self, rng: &mut StdRng) -> u8 {
        loop {
            let c: u8 = rng.random();
            if !self.is_nan(c) {
                return c;
            }
        }
    }
}

/// docs/fp8.md §5: `ceil(584 · P / 576) · 576`.
pub(crate) fn bytes_per_page(page_size: usize) -> usize {
    (584 * page_size).div_ceil(576) * 576
}

/// A key source the tests attend over, in the context's memory, and the
/// values its keys hold as the library's reader must see them.
pub(crate) struct Cache<'a> {
    pub(crate) layout: unikv_kv_layout,
    pub(crate) fmt: Fmt,
    pub(crate) page_size: usize,
    pub(crate) rows: usize,
    pub(crate) data: Dev<'a>,
    pub(crate) scales: Option<Dev<'a>>,
    /// `[rows, 512]`: what a reader computes with (bf16-representable).
    pub(crate) values: Vec<f64>,
}

impl Cache<'_> {
    /// The descriptor of this cache as a key source.
    pub(crate) fn desc(&self) -> unikv_kv_cache {
        let mut c = unikv_kv_cache {
            layout: self.layout as u32,
            fp8_dtype: self.fmt.dtype(),
            ..Default::default()
        };
        match self.layout {
            unikv_kv_layout::UNIKV_KV_LAYOUT_FLASHMLA => {
                let bpp = bytes_per_page(self.page_size);
                c.page_size = self.page_size as u32;
                c.data = self.data.t::<u8>(&[self.rows / self.page_size, bpp]);
            }
            _ => {
                c.data = self.data.t::<u8>(&[self.rows, D]);
                c.scales = self.scales.as_ref().unwrap().t::<f32>(&[self.rows, 8]);
            }
        }
        c
    }

    /// The same bytes in another context's memory (the GPU tests' copy of a
    /// cache built on the CPU backend).
    pub(crate) fn copy_to<'b>(&self, ctx: &'b Ctx) -> Cache<'b> {
        Cache {
            layout: self.layout,
            fmt: self.fmt,
            page_size: self.page_size,
            rows: self.rows,
            data: Dev::upload(ctx, &self.data.read::<u8>()),
            scales: self
                .scales
                .as_ref()
                .map(|s| Dev::upload(ctx, &s.read::<u8>())),
            values: self.values.clone(),
        }
    }

    /// Row `r`'s reader values as bf16 (exact: the test asserts they are
    /// bf16 values).
    pub(crate) fn bf16_row(&self, r: usize) -> Vec<bf16> {
        self.values[r * D..(r + 1) * D]
            .iter()
            .map(|&v| {
                let b = bf16::from_f64(v);
                assert_eq!(b.to_f64(), v, "a reader value that is not a bf16");
                b
            })
            .collect()
    }
}

/// Random latent rows whose 64-dim tiles span several binades (so the
/// tiles' scale bytes differ), as a FlashMLA writer would see them.
pub(crate) fn random_latents(rng: &mut StdRng, n: usize) -> Vec<bf16> {
    let mut rows = Vec::with_capacity(n * D);
    for _ in 0..n * D / 64 {
        let magnitude = 2f32.powi(rng.random_range(-12..6));
        for _ in 0..64 {
            rows.push(bf16::from_f32(rng.random_range(-1.0f32..1.0) * magnitude));
        }
    }
    rows
}

/// A FlashMLA cache of `pages` pages of `page_size` tokens, every token slot
/// written by `unikv_store_flashmla` from random latents; the padding stays as
/// allocated (zero).
pub(crate) fn flashmla_cache<'a>(
    ctx: &'a Ctx,
    rng: &mut StdRng,
    fmt: Fmt,
    page_size: usize,
    pages: usize,
) -> Cache<'a> {
    let rows = pages * page_size;
    let bpp = bytes_per_page(page_size);
    let data = Dev::zeroed(ctx, pages * bpp);
    let latents = Dev::upload(ctx, &random_latents(rng, rows));
    let loc: Vec<i64> = (0..rows as i64).collect();
    let loc = Dev::upload(ctx, &loc);
    let args = unikv_store_flashmla_args {
        struct_size: std::mem::size_of::<unikv_store_flashmla_args>(),
        cache: data.t::<u8>(&[pages, bpp]),
        kv: latents.t::<bf16>(&[rows, D]),
        loc: loc.t::<i64>(&[rows]),
        page_size: page_size as u32,
        cache_dtype: fmt.dtype(),
        num_tokens: rows as u32,
        reserved: 0,
    };
    ok(unsafe { unikv_store_flashmla(ctx.0, &args, ptr::null_mut()) });
    let bytes: Vec<u8> = data.read();
    let values: Vec<f64> = (0..rows)
        .flat_map(|r| flashmla_token(&bytes, fmt, page_size, r))
        .collect();
    Cache {
        layout: unikv_kv_layout::UNIKV_KV_LAYOUT_FLASHMLA,
        fmt,
        page_size,
        rows,
        data,
        scales: None,
        values,
    }
}

/// docs/fp8.md §5: token `loc`'s 512 values, `decode(code) · 2^(s - 127)` for
/// the 448 nope dims of tile `s`, the little-endian bf16 rope dims.
pub(crate) fn flashmla_token(bytes: &[u8], fmt: Fmt, page_size: usize, loc: usize) -> Vec<f64> {
    let bpp = bytes_per_page(page_size);
    let (page, slot) = (loc / page_size, loc % page_size);
    let value = page * bpp + slot * 576;
    let scale = page * bpp + 576 * page_size + slot * 8;
    let mut out = Vec::with_capacity(D);
    for d in 0..448 {
        let s = i32::from(bytes[scale + d / 64]);
        out.push(fmt.decode(bytes[value + d]) * 2f64.powi(s - 127));
    }
    for d in 0..64 {
        let at = value + 448 + 2 * d;
        out.push(bf16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f64());
    }
    out
}

/// docs/fp8.md §8, the reader's value: the f64 product is exact (4 by 24
/// significant bits), `as f32` rounds it to nearest even as an f32 product
/// would, then to the nearest bf16.
pub(crate) fn scaled_value(fmt: Fmt, code: u8, scale: f32) -> f64 {
    let exact = fmt.decode(code) * f64::from(scale);
    bf16::from_f32(exact as f32).to_f64()
}

/// Scaled FP8 rows with random (non-NaN) codes and random fp32 scales of
/// either sign over several binades, not powers of two (values up to about
/// 448 · 2^-6, the range of normed latents).
pub(crate) fn scaled_rows<'a>(ctx: &'a Ctx, rng: &mut StdRng, fmt: Fmt, rows: usize) -> Cache<'a> {
    let codes: Vec<u8> = (0..rows * D).map(|_| fmt.random_code(rng)).collect();
    let scales: Vec<f32> = (0..rows * 8)
        .map(|_| {
            let s = rng.random_range(0.5f32..1.0) * 2f32.powi(rng.random_range(-14..-5));
            if rng.random_bool(0.1) {
                -s
            } else {
                s
            }
        })
        .collect();
    let mut values = Vec::with_capacity(rows * D);
    for r in 0..rows {
        for d in 0..D {
            let (c, s) = (codes[r * D + d], scales[r * 8 + d / 64]);
            values.push(scaled_value(fmt, c, s));
        }
    }
    Cache {
        layout: unikv_kv_layout::UNIKV_KV_LAYOUT_SCALED_FP8,
        fmt,
        page_size: 0,
        rows,
        data: Dev::upload(ctx, &codes),
        scales: Some(Dev::upload(ctx, &scales)),
        values,
    }
}
