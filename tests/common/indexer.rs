//! Indexer query and key preparation cases shared by tests/indexer.rs (CPU
//! backend against a float64 reference) and tests/gpu/indexer.rs (GPU against CPU):
//! random inputs, argument structs over buffers in any context's memory, and
//! the reference checks of spec store_fused §4.1, §4.2 (the Hadamard
//! transform as the explicit ±1 matrix).

use std::os::raw::c_void;

use half::bf16;
use rand::rngs::StdRng;
use rand::Rng;
use unikv::ffi::indexer::{unikv_indexer_prepare_k_args, unikv_indexer_prepare_q_args};
use unikv::ffi::types::{unikv_dtype, unikv_tensor};
use unikv::fp8::{decode, Fp8Format};

use super::cache_store::random_locations;
use super::*;

pub const DIM: usize = 128;
/// Keys per indexer cache page, and its page stride in bytes.
pub const PAGE: usize = 64;
pub const PAGE_BYTES: usize = 132 * PAGE;
/// Spare elements past each output head / row, which must stay poisoned.
const OUT_PAD: usize = 16;

/// Error bound of an indexer dot product on Hopper's FP8 tensor cores,
/// relative to the sum of its terms' magnitudes. The instruction keeps about
/// 13 mantissa bits: within a k-step each of the 32 products, aligned to the
/// largest, may lose up to 2^-13 of it, and each of the 4 chained k-steps
/// truncates the running sum once, so the error stays under
/// (32 + 4) 2^-13 < 2^-7 of the terms. Largest seen on the H200: 4.7e-4 (a
/// one-head case). A wrong key or head misses by about a tenth of the terms
/// on these random inputs (a dot product's sum against its terms' sum).
pub const FP8_TENSOR_CORE_EPS: f64 = 1.0 / 128.0;

/// Error bound of a dot product of 128 exact products summed in f32, in any
/// order, relative to its terms: 128 roundings of at most 2^-24 of a partial
/// sum, at most 2^-17 (largest seen on the H200: 2.5e-7 of the terms, about
/// 2^-22).
pub const F32_DOT_EPS: f64 = 1.0 / 131_072.0;

/// How closely a score must match the float64 reference: `rel` of the sum of
/// the weighted dot products' magnitudes (f32 sums), plus `dot_eps` of each
/// dot product's terms (a tensor core's own narrower sums).
#[derive(Clone, Copy, Debug)]
pub struct ScoreTol {
    pub rel: f64,
    pub dot_eps: f64,
}

impl ScoreTol {
    /// The CPU backend: f64 sums, one f32 rounding.
    pub const EXACT: ScoreTol = ScoreTol {
        rel: 1e-6,
        dot_eps: 0.0,
    };
    /// f32 sums of exact products (CUDA cores, f16 mma.sync): a dot product
    /// with cancelling terms keeps the sums' absolute error, not a relative
    /// one.
    pub const F32: ScoreTol = ScoreTol {
        rel: 1e-5,
        dot_eps: F32_DOT_EPS,
    };
    /// FP8 wgmma.
    pub const FP8_TENSOR_CORE: ScoreTol = ScoreTol {
        rel: 1e-5,
        dot_eps: FP8_TENSOR_CORE_EPS,
    };
}

/// A score's float64 value and the two magnitudes its tolerance scales with.
#[derive(Clone, Copy, Debug)]
pub struct RefScore {
    pub value: f64,
    /// `k_scale * sum_h |w_h * (q_h . k)|`.
    pub weighted: f64,
    /// `k_scale * sum_h |w_h| * sum_d |q_hd k_d|`.
    pub terms: f64,
}

impl RefScore {
    pub fn tolerance(&self, tol: ScoreTol) -> f64 {
        tol.rel * self.weighted + tol.dot_eps * self.terms + 1e-30
    }
}

/// `k_scale * sum_h w_h * relu(q_h . k)` in float64 over `heads` query rows
/// of 128 codes (spec §4.3).
pub fn score_of(q: &[u8], weights: &[f32], key: &[u8], k_scale: f64, fmt: Fp8Format) -> RefScore {
    let (mut value, mut weighted, mut terms) = (0f64, 0f64, 0f64);
    for (qh, &w) in q.chunks_exact(DIM).zip(weights) {
        let (mut dot, mut abs) = (0f64, 0f64);
        for (&a, &b) in qh.iter().zip(key) {
            let t = f64::from(decode(a, fmt)) * f64::from(decode(b, fmt));
            dot += t;
            abs += t.abs();
        }
        let w = f64::from(w);
        value += w * dot.max(0.0);
        weighted += (w * dot).abs();
        terms += w.abs() * abs;
    }
    RefScore {
        value: k_scale * value,
        weighted: k_scale * weighted,
        terms: k_scale * terms,
    }
}

pub fn fp8_max(fmt: Fp8Format) -> f64 {
    match fmt {
        Fp8Format::E4m3Fn => 448.0,
        Fp8Format::E4m3Fnuz => 240.0,
    }
}

pub fn dtype_of(fmt: Fp8Format) -> unikv_dtype {
    match fmt {
        Fp8Format::E4m3Fn => unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
        Fp8Format::E4m3Fnuz => unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ,
    }
}

/// `y = H x`, H the 128 x 128 Sylvester matrix `(-1)^popcount(i & j) / sqrt(128)`.
pub fn hadamard_ref(x: &[f64]) -> Vec<f64> {
    (0..DIM)
        .map(|i| {
            let s: f64 = (0..DIM)
                .map(|j| {
                    if (i & j).count_ones() % 2 == 0 {
                        x[j]
                    } else {
                        -x[j]
                    }
                })
                .sum();
            s / (DIM as f64).sqrt()
        })
        .collect()
}

/// GPT-J rotation of dims 64..127 by a table row of (cos, sin) pairs.
pub fn rope_ref(x: &mut [f64], row: &[f32]) {
    for i in 0..32 {
        let (c, s) = (f64::from(row[2 * i]), f64::from(row[2 * i + 1]));
        let (re, im) = (x[64 + 2 * i], x[65 + 2 * i]);
        x[64 + 2 * i] = re * c - im * s;
        x[65 + 2 * i] = re * s + im * c;
    }
}

/// The scale the spec prescribes for exact transformed values `y`:
/// `max(amax, 1e-4) / fp8_max`.
pub fn ref_scale(y: &[f64], fmt: Fp8Format) -> f64 {
    y.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-4) / fp8_max(fmt)
}

/// Each code within half an FP8 step of `y / scale`, plus a slack of 1e-5 of
/// the format's max for the op's fp32 transform (a few ulps of the vector's
/// norm).
pub fn check_codes(codes: &[u8], scale: f64, y: &[f64], fmt: Fp8Format, what: &str) {
    let bias = match fmt {
        Fp8Format::E4m3Fn => 7,
        Fp8Format::E4m3Fnuz => 8,
    };
    for (i, (&c, &v)) in codes.iter().zip(y).enumerate() {
        let v = v / scale;
        let half_step = (v.abs() / 16.0).max(2f64.powi(-bias - 3));
        let got = f64::from(decode(c, fmt));
        assert!(
            (got - v).abs() <= half_step + 1e-5 * fp8_max(fmt),
            "{what} dim {i}: code {c:#04x} = {got}, want {v}"
        );
    }
}

/// `got` within 1e-5 relative of `want` (or both below 1e-30).
pub fn close(got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() <= 1e-5 * want.abs() + 1e-30,
        "{what}: {got}, want {want}"
    );
}

/// A 16-byte aligned host copy of `data` (the ops need aligned rows).
pub fn aligned<T>(data: &[T]) -> cache_store::HostBytes {
    cache_store::HostBytes::from_bytes(&bytes_of(data))
}

fn desc(data: *mut c_void, dtype: unikv_dtype, shape: &[usize], strides: &[usize]) -> unikv_tensor {
    let mut t = absent();
    t.data = data;
    t.dtype = dtype as u32;
    t.ndim = shape.len() as u32;
    for axis in 0..shape.len() {
        t.shape[axis] = shape[axis] as i64;
        t.strides[axis] = strides[axis] as i64;
    }
    t
}

fn index_bytes(values: &[i64], wide: bool) -> Vec<u8> {
    if wide {
        bytes_of(values)
    } else {
        bytes_of(&values.iter().map(|&v| v as i32).collect::<Vec<_>>())
    }
}

fn index_dtype(wide: bool) -> unikv_dtype {
    if wide {
        unikv_dtype::UNIKV_DTYPE_I64
    } else {
        unikv_dtype::UNIKV_DTYPE_I32
    }
}

/// A RoPE table of `max_pos` rows with angles of every size.
pub fn random_table(rng: &mut StdRng, max_pos: usize) -> Vec<f32> {
    (0..max_pos * 32)
        .flat_map(|_| {
            let a: f64 = rng.random_range(-10.0..10.0);
            [a.cos() as f32, a.sin() as f32]
        })
        .collect()
}

#[derive(Debug, Clone)]
pub struct QueryCase {
    pub tokens: usize,
    pub heads: usize,
    pub fmt: Fp8Format,
    /// `[tokens, heads, q_head_stride]` bf16, the first 128 of each head used.
    pub q: Vec<bf16>,
    pub q_head_stride: usize,
    /// `[tokens, weights_stride]` bf16, the first `heads` used.
    pub weights: Vec<bf16>,
    pub weights_stride: usize,
    pub table: Vec<f32>,
    pub max_pos: usize,
    pub positions: Vec<i64>,
    pub positions_i64: bool,
    pub weight_scale: f32,
}

/// Where a query call's buffers live.
pub struct QueryPointers {
    pub q: *mut c_void,
    pub weights: *mut c_void,
    pub table: *mut c_void,
    pub positions: *mut c_void,
    pub q_fp8: *mut c_void,
    pub weights_out: *mut c_void,
}

impl QueryCase {
    pub fn random(rng: &mut StdRng, tokens: usize, heads: usize, fmt: Fp8Format) -> Self {
        let q_head_stride = [DIM, DIM + 8, DIM + 64][rng.random_range(0..3)];
        let weights_stride = heads + rng.random_range(0..5);
        let max_pos = rng.random_range(1..300);
        // Heads at magnitudes from below the 1e-4 amax floor to thousands.
        let magnitudes = [1e-7f32, 1e-2, 1.0, 30.0, 3000.0];
        let q = (0..tokens * heads)
            .flat_map(|_| {
                let m = magnitudes[rng.random_range(0..magnitudes.len())];
                (0..q_head_stride)
                    .map(|_| bf16::from_f32(rng.random_range(-m..m)))
                    .collect::<Vec<_>>()
            })
            .collect();
        QueryCase {
            tokens,
            heads,
            fmt,
            q,
            q_head_stride,
            weights: (0..tokens * weights_stride)
                .map(|_| bf16::from_f32(rng.random_range(-2.0f32..2.0)))
                .collect(),
            weights_stride,
            table: random_table(rng, max_pos),
            max_pos,
            positions: (0..tokens)
                .map(|_| rng.random_range(0..max_pos as i64))
                .collect(),
            positions_i64: rng.random(),
            weight_scale: 1.0 / (128.0f32 * heads as f32).sqrt(),
        }
    }

    pub fn out_head_stride(&self) -> usize {
        DIM + OUT_PAD
    }
    pub fn q_fp8_len(&self) -> usize {
        self.tokens * self.heads * self.out_head_stride()
    }
    pub fn weights_out_len(&self) -> usize {
        self.tokens * (self.heads + OUT_PAD)
    }
    pub fn positions_bytes(&self) -> Vec<u8> {
        index_bytes(&self.positions, self.positions_i64)
    }

    pub fn args(&self, p: &QueryPointers) -> unikv_indexer_prepare_q_args {
        let (t, h) = (self.tokens, self.heads);
        let bf = unikv_dtype::UNIKV_DTYPE_BF16;
        unikv_indexer_prepare_q_args {
            struct_size: std::mem::size_of::<unikv_indexer_prepare_q_args>(),
            q: desc(
                p.q,
                bf,
                &[t, h, DIM],
                &[h * self.q_head_stride, self.q_head_stride, 1],
            ),
            weights: desc(p.weights, bf, &[t, h], &[self.weights_stride, 1]),
            rope_table: desc(
                p.table,
                unikv_dtype::UNIKV_DTYPE_F32,
                &[self.max_pos, 64],
                &[64, 1],
            ),
            positions: desc(p.positions, index_dtype(self.positions_i64), &[t], &[1]),
            q_fp8: desc(
                p.q_fp8,
                unikv_dtype::UNIKV_DTYPE_U8,
                &[t, h, DIM],
                &[h * self.out_head_stride(), self.out_head_stride(), 1],
            ),
            weights_out: desc(
                p.weights_out,
                unikv_dtype::UNIKV_DTYPE_F32,
                &[t, h],
                &[h + OUT_PAD, 1],
            ),
            q_dtype: dtype_of(self.fmt) as u32,
            num_tokens: t as u32,
            num_heads: h as u32,
            weight_scale: self.weight_scale,
        }
    }

    /// Runs on host buffers (CPU backend) after `edit`; returns the status and
    /// the poisoned-then-written outputs.
    pub fn run_host(
        &self,
        ctx: &Ctx,
        edit: impl FnOnce(&mut unikv_indexer_prepare_q_args),
    ) -> (unikv::ffi::status::unikv_status, Vec<u8>, Vec<f32>) {
        let (q, w, table, pos) = (
            aligned(&self.q),
            aligned(&self.weights),
            aligned(&self.table),
            aligned(&self.positions_bytes()),
        );
        let q_fp8 = cache_store::HostBytes::poisoned(self.q_fp8_len());
        let weights_out = cache_store::HostBytes::poisoned(self.weights_out_len() * 4);
        let mut args = self.args(&QueryPointers {
            q: q.ptr() as *mut c_void,
            weights: w.ptr() as *mut c_void,
            table: table.ptr() as *mut c_void,
            positions: pos.ptr() as *mut c_void,
            q_fp8: q_fp8.ptr() as *mut c_void,
            weights_out: weights_out.ptr() as *mut c_void,
        });
        edit(&mut args);
        let status = unsafe {
            unikv::ffi::indexer::unikv_indexer_prepare_q(ctx.0, &args, std::ptr::null_mut())
        };
        let out: Vec<f32> = weights_out
            .bytes()
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        (status, q_fp8.bytes().to_vec(), out)
    }

    /// Every head against the float64 reference; the padding stays poisoned.
    pub fn check(&self, q_fp8: &[u8], weights_out: &[f32]) {
        let poison = f32::from_ne_bytes([POISON_BYTE; 4]);
        for t in 0..self.tokens {
            let row = &self.table[self.positions[t] as usize * 64..][..64];
            for h in 0..self.heads {
                let what = format!("token {t} head {h} ({:?})", self.fmt);
                let base = (t * self.heads + h) * self.q_head_stride;
                let mut x: Vec<f64> = self.q[base..base + DIM]
                    .iter()
                    .map(|v| f64::from(v.to_f32()))
                    .collect();
                rope_ref(&mut x, row);
                let y = hadamard_ref(&x);
                let out = (t * self.heads + h) * self.out_head_stride();
                let scale = ref_scale(&y, self.fmt);
                check_codes(&q_fp8[out..out + DIM], scale, &y, self.fmt, &what);
                let w = f64::from(self.weights[t * self.weights_stride + h].to_f32());
                close(
                    f64::from(weights_out[t * (self.heads + OUT_PAD) + h]),
                    w * f64::from(self.weight_scale) * scale,
                    &format!("{what}: weights_out"),
                );
                assert!(
                    q_fp8[out + DIM..out + self.out_head_stride()]
                        .iter()
                        .all(|&b| b == POISON_BYTE),
                    "{what}: padding written"
                );
            }
            for j in self.heads..self.heads + OUT_PAD {
                assert_eq!(
                    weights_out[t * (self.heads + OUT_PAD) + j].to_bits(),
                    poison.to_bits(),
                    "token {t}: weights_out padding {j} written"
                );
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct KeyCase {
    pub fmt: Fp8Format,
    pub pages: usize,
    /// `[tokens, 128]` values (bf16-representable when `key_f32` is false).
    pub keys: Vec<f32>,
    pub key_f32: bool,
    pub norm_weight: Vec<bf16>,
    pub table: Vec<f32>,
    pub max_pos: usize,
    pub positions: Vec<i64>,
    pub locations: Vec<i64>,
    pub index_i64: bool,
    pub eps: f32,
}

/// Where a key call's buffers live.
pub struct KeyPointers {
    pub cache: *mut c_void,
    pub key: *mut c_void,
    pub norm_weight: *mut c_void,
    pub table: *mut c_void,
    pub positions: *mut c_void,
    pub loc: *mut c_void,
}

impl KeyCase {
    pub fn random(rng: &mut StdRng, tokens: usize, fmt: Fp8Format) -> Self {
        let pages = rng.random_range(1..4);
        let key_f32: bool = rng.random();
        let magnitudes = [1e-3f32, 1.0, 50.0];
        let keys = (0..tokens)
            .flat_map(|_| {
                let m = magnitudes[rng.random_range(0..magnitudes.len())];
                (0..DIM)
                    .map(|_| {
                        let v = rng.random_range(-m..m);
                        if key_f32 {
                            v
                        } else {
                            bf16::from_f32(v).to_f32()
                        }
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        let max_pos = rng.random_range(1..300);
        KeyCase {
            fmt,
            pages,
            keys,
            key_f32,
            norm_weight: (0..DIM)
                .map(|_| bf16::from_f32(rng.random_range(0.2f32..2.0)))
                .collect(),
            table: random_table(rng, max_pos),
            max_pos,
            positions: (0..tokens)
                .map(|_| rng.random_range(0..max_pos as i64))
                .collect(),
            locations: random_locations(rng, (pages * PAGE) as u64, PAGE as u64, tokens),
            index_i64: rng.random(),
            eps: 1e-6,
        }
    }

    pub fn tokens(&self) -> usize {
        self.locations.len()
    }
    pub fn cache_bytes(&self) -> usize {
        self.pages * PAGE_BYTES
    }
    pub fn key_bytes(&self) -> Vec<u8> {
        if self.key_f32 {
            bytes_of(&self.keys)
        } else {
            bytes_of(
                &self
                    .keys
                    .iter()
                    .map(|&v| bf16::from_f32(v))
                    .collect::<Vec<_>>(),
            )
        }
    }
    pub fn positions_bytes(&self) -> Vec<u8> {
        index_bytes(&self.positions, self.index_i64)
    }
    pub fn loc_bytes(&self) -> Vec<u8> {
        index_bytes(&self.locations, self.index_i64)
    }

    pub fn args(&self, p: &KeyPointers) -> unikv_indexer_prepare_k_args {
        let n = self.tokens();
        let key_dtype = if self.key_f32 {
            unikv_dtype::UNIKV_DTYPE_F32
        } else {
            unikv_dtype::UNIKV_DTYPE_BF16
        };
        unikv_indexer_prepare_k_args {
            struct_size: std::mem::size_of::<unikv_indexer_prepare_k_args>(),
            cache: desc(
                p.cache,
                unikv_dtype::UNIKV_DTYPE_U8,
                &[self.pages, PAGE_BYTES],
                &[PAGE_BYTES, 1],
            ),
            key: desc(p.key, key_dtype, &[n, DIM], &[DIM, 1]),
            norm_weight: desc(p.norm_weight, unikv_dtype::UNIKV_DTYPE_BF16, &[DIM], &[1]),
            rope_table: desc(
                p.table,
                unikv_dtype::UNIKV_DTYPE_F32,
                &[self.max_pos, 64],
                &[64, 1],
            ),
            positions: desc(p.positions, index_dtype(self.index_i64), &[n], &[1]),
            loc: desc(p.loc, index_dtype(self.index_i64), &[n], &[1]),
            page_size: PAGE as u32,
            cache_dtype: dtype_of(self.fmt) as u32,
            num_tokens: n as u32,
            eps: self.eps,
            reserved: 0,
        }
    }

    /// Runs on host buffers (CPU backend) after `edit`; returns the status and
    /// the poisoned-then-written cache.
    pub fn run_host(
        &self,
        ctx: &Ctx,
        edit: impl FnOnce(&mut unikv_indexer_prepare_k_args),
    ) -> (unikv::ffi::status::unikv_status, Vec<u8>) {
        let cache = cache_store::HostBytes::poisoned(self.cache_bytes());
        let (key, weight, table, pos, loc) = (
            aligned(&self.key_bytes()),
            aligned(&self.norm_weight),
            aligned(&self.table),
            aligned(&self.positions_bytes()),
            aligned(&self.loc_bytes()),
        );
        let mut args = self.args(&KeyPointers {
            cache: cache.ptr() as *mut c_void,
            key: key.ptr() as *mut c_void,
            norm_weight: weight.ptr() as *mut c_void,
            table: table.ptr() as *mut c_void,
            positions: pos.ptr() as *mut c_void,
            loc: loc.ptr() as *mut c_void,
        });
        edit(&mut args);
        let status = unsafe {
            unikv::ffi::indexer::unikv_indexer_prepare_k(ctx.0, &args, std::ptr::null_mut())
        };
        (status, cache.bytes().to_vec())
    }

    /// Every stored key against the float64 reference (RMSNorm, RoPE,
    /// explicit Hadamard, quantization); every other byte still poisoned.
    pub fn check(&self, cache: &[u8]) {
        let mut touched = vec![false; cache.len()];
        for (t, &l) in self.locations.iter().enumerate() {
            let Ok(l) = usize::try_from(l) else { continue };
            let (page, slot) = (l / PAGE, l % PAGE);
            let value = page * PAGE_BYTES + slot * DIM;
            let scale_at = page * PAGE_BYTES + DIM * PAGE + slot * 4;
            touched[value..value + DIM].fill(true);
            touched[scale_at..scale_at + 4].fill(true);
            let x = &self.keys[t * DIM..][..DIM];
            let mean = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / DIM as f64;
            let f = 1.0 / (mean + f64::from(self.eps)).sqrt();
            let mut y: Vec<f64> = x
                .iter()
                .zip(&self.norm_weight)
                .map(|(&v, w)| f64::from(v) * f * f64::from(w.to_f32()))
                .collect();
            rope_ref(&mut y, &self.table[self.positions[t] as usize * 64..][..64]);
            let y = hadamard_ref(&y);
            let what = format!("key {t} at {l} ({:?})", self.fmt);
            let scale = f32::from_le_bytes(cache[scale_at..scale_at + 4].try_into().unwrap());
            close(
                f64::from(scale),
                ref_scale(&y, self.fmt),
                &format!("{what}: scale"),
            );
            check_codes(
                &cache[value..value + DIM],
                f64::from(scale),
                &y,
                self.fmt,
                &what,
            );
        }
        for (i, (&b, &t)) in cache.iter().zip(&touched).enumerate() {
            assert!(
                t || b == POISON_BYTE,
                "cache byte {i} written but no key stored there"
            );
        }
    }
}

/// Rows of the logits the selection ranks: random scores from a small set
/// (ties everywhere, ±0, NaN and -inf among them), or scores computed by the
/// op itself.
#[derive(Debug, Clone)]
pub struct TopkCase {
    pub tokens: usize,
    pub heads: usize,
    pub fmt: Fp8Format,
    pub topk: usize,
    /// Columns of `topk_indices` (>= topk).
    pub width: usize,
    /// `[requests, max_pages]` page ids, all distinct, below `cache_pages`.
    pub page_table: Vec<i32>,
    pub max_pages: usize,
    pub cache_pages: usize,
    pub batch_id: Vec<i32>,
    pub positions: Vec<i64>,
    pub positions_i64: bool,
    /// `[tokens, logits_width]`.
    pub logits: Vec<f32>,
    pub logits_width: usize,
    /// `[tokens, heads, 128]` codes and `[tokens, heads]` weights.
    pub q: Vec<u8>,
    pub weights: Vec<f32>,
    /// `[cache_pages, 8448]`.
    pub cache: Vec<u8>,
}

/// Where a top-k call's buffers live.
pub struct TopkPointers {
    pub q: *mut c_void,
    pub weights: *mut c_void,
    pub cache: *mut c_void,
    pub page_table: *mut c_void,
    pub batch_id: *mut c_void,
    pub positions: *mut c_void,
    pub logits: *mut c_void,
    pub topk_indices: *mut c_void,
}

/// A random code that is not NaN in `fmt`.
fn finite_code(rng: &mut StdRng, fmt: Fp8Format) -> u8 {
    loop {
        let c: u8 = rng.random();
        let nan = match fmt {
            Fp8Format::E4m3Fn => c & 0x7F == 0x7F,
            Fp8Format::E4m3Fnuz => c == 0x80,
        };
        if !nan {
            return c;
        }
    }
}

impl TopkCase {
    /// `tokens` tokens over `requests` requests; contexts up to `max_keys`
    /// compressed keys, some shorter than `topk`, one token padding.
    pub fn random(
        rng: &mut StdRng,
        tokens: usize,
        requests: usize,
        max_keys: usize,
        topk: usize,
        heads: usize,
        fmt: Fp8Format,
    ) -> Self {
        let max_pages = max_keys.div_ceil(PAGE);
        let cache_pages = requests * max_pages + 3;
        let mut ids: Vec<i32> = (0..cache_pages as i32).collect();
        use rand::seq::SliceRandom;
        ids.shuffle(rng);
        let page_table = ids[..requests * max_pages].to_vec();
        let batch_id: Vec<i32> = (0..tokens)
            .map(|t| {
                if t == tokens / 2 && tokens > 1 {
                    -1
                } else {
                    rng.random_range(0..requests as i32)
                }
            })
            .collect();
        let positions = (0..tokens)
            .map(|_| match rng.random_range(0..4) {
                0 => rng.random_range(0..(4 * topk.min(max_keys)) as i64),
                _ => rng.random_range(0..(4 * max_keys) as i64),
            })
            .collect();
        let logits_width = max_keys + rng.random_range(0..9);
        let palette = [
            -1.0f32,
            0.0,
            -0.0,
            0.5,
            2.0,
            f32::NAN,
            f32::NEG_INFINITY,
            7.25,
            -3.0,
            1e-30,
        ];
        let logits = (0..tokens * logits_width)
            .map(|_| {
                if rng.random_bool(0.5) {
                    palette[rng.random_range(0..palette.len())]
                } else {
                    rng.random_range(-4.0f32..4.0)
                }
            })
            .collect();
        let mut cache = vec![0u8; cache_pages * PAGE_BYTES];
        for page in 0..cache_pages {
            for slot in 0..PAGE {
                for d in 0..DIM {
                    cache[page * PAGE_BYTES + slot * DIM + d] = finite_code(rng, fmt);
                }
                let scale: f32 = rng.random_range(1e-3f32..2.0);
                let at = page * PAGE_BYTES + PAGE * DIM + slot * 4;
                cache[at..at + 4].copy_from_slice(&scale.to_le_bytes());
            }
        }
        TopkCase {
            tokens,
            heads,
            fmt,
            topk,
            width: topk + rng.random_range(0..5),
            page_table,
            max_pages,
            cache_pages,
            batch_id,
            positions,
            positions_i64: rng.random(),
            logits,
            logits_width,
            q: (0..tokens * heads * DIM)
                .map(|_| finite_code(rng, fmt))
                .collect(),
            weights: (0..tokens * heads)
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect(),
            cache,
        }
    }

    pub fn requests(&self) -> usize {
        self.page_table.len() / self.max_pages
    }
    pub fn positions_bytes(&self) -> Vec<u8> {
        index_bytes(&self.positions, self.positions_i64)
    }
    /// Keys token t sees (None: padding).
    pub fn keys(&self, t: usize) -> Option<usize> {
        (self.batch_id[t] >= 0).then(|| (self.positions[t] as usize + 1) / 4)
    }
    fn page_index(&self, t: usize, i: usize) -> i32 {
        let b = self.batch_id[t] as usize;
        self.page_table[b * self.max_pages + i / PAGE] * PAGE as i32 + (i % PAGE) as i32
    }

    pub fn args(&self, p: &TopkPointers) -> unikv::ffi::indexer::unikv_indexer_topk_args {
        use unikv::ffi::indexer::unikv_indexer_topk_args;
        let (t, h) = (self.tokens, self.heads);
        unikv_indexer_topk_args {
            struct_size: std::mem::size_of::<unikv_indexer_topk_args>(),
            q_fp8: desc(
                p.q,
                unikv_dtype::UNIKV_DTYPE_U8,
                &[t, h, DIM],
                &[h * DIM, DIM, 1],
            ),
            weights: desc(p.weights, unikv_dtype::UNIKV_DTYPE_F32, &[t, h], &[h, 1]),
            cache: desc(
                p.cache,
                unikv_dtype::UNIKV_DTYPE_U8,
                &[self.cache_pages, PAGE_BYTES],
                &[PAGE_BYTES, 1],
            ),
            page_table: desc(
                p.page_table,
                unikv_dtype::UNIKV_DTYPE_I32,
                &[self.requests(), self.max_pages],
                &[self.max_pages, 1],
            ),
            batch_id: desc(p.batch_id, unikv_dtype::UNIKV_DTYPE_I32, &[t], &[1]),
            positions: desc(p.positions, index_dtype(self.positions_i64), &[t], &[1]),
            logits: desc(
                p.logits,
                unikv_dtype::UNIKV_DTYPE_F32,
                &[t, self.logits_width],
                &[self.logits_width, 1],
            ),
            topk_indices: desc(
                p.topk_indices,
                unikv_dtype::UNIKV_DTYPE_I32,
                &[t, self.width],
                &[self.width, 1],
            ),
            cache_dtype: dtype_of(self.fmt) as u32,
            num_tokens: t as u32,
            num_heads: h as u32,
            topk: self.topk as u32,
        }
    }

    /// Runs the fused op (`score`) or the selection from `self.logits` on
    /// host buffers; returns the status, the logits and the index table.
    pub fn run_host(
        &self,
        ctx: &Ctx,
        score: bool,
        edit: impl FnOnce(&mut unikv::ffi::indexer::unikv_indexer_topk_args),
    ) -> (unikv::ffi::status::unikv_status, Vec<f32>, Vec<i32>) {
        let (q, w, cache, pt, b, pos) = (
            aligned(&self.q),
            aligned(&self.weights),
            aligned(&self.cache),
            aligned(&self.page_table),
            aligned(&self.batch_id),
            aligned(&self.positions_bytes()),
        );
        let logits = if score {
            cache_store::HostBytes::poisoned(self.logits.len() * 4)
        } else {
            aligned(&self.logits)
        };
        let out = cache_store::HostBytes::poisoned(self.tokens * self.width * 4);
        let mut args = self.args(&TopkPointers {
            q: q.ptr() as *mut c_void,
            weights: w.ptr() as *mut c_void,
            cache: cache.ptr() as *mut c_void,
            page_table: pt.ptr() as *mut c_void,
            batch_id: b.ptr() as *mut c_void,
            positions: pos.ptr() as *mut c_void,
            logits: logits.ptr() as *mut c_void,
            topk_indices: out.ptr() as *mut c_void,
        });
        edit(&mut args);
        let status = unsafe {
            if score {
                unikv::ffi::indexer::unikv_indexer_topk(ctx.0, &args, std::ptr::null_mut())
            } else {
                unikv::ffi::indexer::unikv_indexer_topk_from_logits(
                    ctx.0,
                    &args,
                    std::ptr::null_mut(),
                )
            }
        };
        let floats = |b: &cache_store::HostBytes| -> Vec<f32> {
            b.bytes()
                .chunks_exact(4)
                .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
                .collect()
        };
        let ints: Vec<i32> = out
            .bytes()
            .chunks_exact(4)
            .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        (status, floats(&logits), ints)
    }

    /// Key i's score for token t in float64 from the codes (spec §4.3).
    pub fn score_ref(&self, t: usize, i: usize) -> RefScore {
        let loc = self.page_index(t, i) as usize;
        let (page, slot) = (loc / PAGE, loc % PAGE);
        let key = &self.cache[page * PAGE_BYTES + slot * DIM..][..DIM];
        let at = page * PAGE_BYTES + PAGE * DIM + slot * 4;
        let scale = f64::from(f32::from_le_bytes(
            self.cache[at..at + 4].try_into().unwrap(),
        ));
        let q = &self.q[t * self.heads * DIM..][..self.heads * DIM];
        let w = &self.weights[t * self.heads..][..self.heads];
        score_of(q, w, key, scale, self.fmt)
    }

    /// The fused op's logits against `score_ref` within `tol`; returns the
    /// largest error seen, relative to the scores' terms (the quantity
    /// FP8_TENSOR_CORE_EPS bounds).
    pub fn check_logits(&self, logits: &[f32], tol: ScoreTol) -> f64 {
        let mut worst = 0f64;
        for t in 0..self.tokens {
            let row = &logits[t * self.logits_width..][..self.logits_width];
            let keys = self.keys(t).unwrap_or(0);
            for (i, &g) in row.iter().enumerate() {
                if i < keys {
                    let want = self.score_ref(t, i);
                    let err = (f64::from(g) - want.value).abs();
                    if want.terms > 0.0 {
                        worst = worst.max(err / want.terms);
                    }
                    assert!(
                        err <= want.tolerance(tol),
                        "token {t} key {i}: score {g}, want {want:?} ({tol:?})"
                    );
                } else {
                    assert_eq!(
                        g.to_bits(),
                        u32::from_ne_bytes([POISON_BYTE; 4]),
                        "token {t}: column {i} written"
                    );
                }
            }
        }
        worst
    }

    /// The index table is a top-k of `logits` by (score, lower index first):
    /// as many entries as min(keys, topk), ascending keys, page indices
    /// through the page table, -1 after; every kept key ranks above every
    /// dropped one.
    pub fn check_selection(&self, logits: &[f32], table: &[i32]) {
        for t in 0..self.tokens {
            let out = &table[t * self.width..][..self.width];
            let Some(keys) = self.keys(t) else {
                assert!(out.iter().all(|&v| v == -1), "padding token {t}: {out:?}");
                continue;
            };
            let count = keys.min(self.topk);
            assert!(
                out[count..].iter().all(|&v| v == -1),
                "token {t}: tail not -1"
            );
            // Invert the page-index translation.
            let pages =
                &self.page_table[self.batch_id[t] as usize * self.max_pages..][..self.max_pages];
            let kept: Vec<usize> = out[..count]
                .iter()
                .map(|&v| {
                    let (page, slot) = (
                        v.div_euclid(PAGE as i32),
                        v.rem_euclid(PAGE as i32) as usize,
                    );
                    let j = pages.iter().position(|&id| id == page);
                    j.map(|j| j * PAGE + slot)
                        .filter(|&i| i < keys)
                        .unwrap_or_else(|| panic!("token {t}: {v} is no visible key's page index"))
                })
                .collect();
            assert!(
                kept.windows(2).all(|w| w[0] < w[1]),
                "token {t}: not ascending distinct keys"
            );
            let row = &logits[t * self.logits_width..][..keys];
            // (score rank, index) with -0 = +0 and NaN lowest.
            let rank = |i: usize| {
                let x = row[i];
                let v = if x.is_nan() {
                    f64::NEG_INFINITY
                } else {
                    f64::from(x)
                };
                (v, x.is_nan(), i)
            };
            let better = |a: usize, b: usize| {
                let (va, na, ia) = rank(a);
                let (vb, nb, ib) = rank(b);
                match (na, nb) {
                    (false, true) => true,
                    (true, false) => false,
                    _ if va != vb => va > vb,
                    _ => ia < ib,
                }
            };
            let mut is_kept = vec![false; keys];
            kept.iter().for_each(|&i| is_kept[i] = true);
            let worst_kept = kept
                .iter()
                .copied()
                .reduce(|a, b| if better(a, b) { b } else { a });
            if let Some(w) = worst_kept {
                for i in (0..keys).filter(|&i| !is_kept[i]) {
                    assert!(
                        better(w, i),
                        "token {t}: dropped key {i} ranks above kept key {w}"
                    );
                }
            }
        }
    }
}
