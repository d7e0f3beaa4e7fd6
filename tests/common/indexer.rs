//! Indexer query and key preparation cases shared by tests/indexer.rs (CPU
//! backend against a float64 reference) and tests/gpu.rs (GPU against CPU):
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
