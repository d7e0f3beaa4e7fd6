//! FP8 unified pools (docs/fp8.md §4) on the CPU backend, through the
//! C ABI: geometry and adoption, stores that quantize (bytes checked against a
//! quantizer written here, independent of src/fp8.rs), and decode over the FP8
//! rows against a float64 reference over the dequantized keys and against the
//! same batch on a bf16 pool, within a bound computed from the actual scales.

mod common;

use std::ptr;

use common::*;
use half::bf16;
use rand::rngs::StdRng;
use rand::Rng;
use unikv::ffi::attention::*;
use unikv::ffi::pool::*;
use unikv::ffi::store::*;
use unikv::ffi::types::unikv_dtype;

const D: usize = 512;
const NOPE: usize = 448;
const FORMATS: [unikv_dtype; 2] = [
    unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
    unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ,
];

fn spec() -> PoolSpec {
    PoolSpec {
        ratios: vec![0, 4],
        max_requests: 3,
        window: 128,
        spec_extra: 0,
        c128_blocks: 8,
    }
}

// ---------------------------------------------------------------------------
// The format, written out independently: value of every code, nearest-code
// encoding by search, UE8M0 from the exponent of an fp32 quotient.

struct Format {
    max: f64,
    bias: i32,
    fnuz: bool,
}

fn format(dtype: unikv_dtype) -> Format {
    match dtype {
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN => Format {
            max: 448.0,
            bias: 7,
            fnuz: false,
        },
        _ => Format {
            max: 240.0,
            bias: 8,
            fnuz: true,
        },
    }
}

impl Format {
    /// The value of a code, None for NaN codes.
    fn value(&self, code: u8) -> Option<f64> {
        let nan = if self.fnuz {
            code == 0x80
        } else {
            code & 0x7F == 0x7F
        };
        if nan {
            return None;
        }
        let (e, m) = (((code >> 3) & 0xF) as i32, (code & 7) as f64);
        let mag = if e == 0 {
            m / 8.0 * 2f64.powi(1 - self.bias)
        } else {
            (1.0 + m / 8.0) * 2f64.powi(e - self.bias)
        };
        Some(if code & 0x80 != 0 { -mag } else { mag })
    }

    /// Nearest code (ties to the even code), saturating at max; a zero result
    /// is 0x80 for negative inputs under fn, 0x00 under fnuz.
    fn encode(&self, x: f64) -> u8 {
        let x = x.clamp(-self.max, self.max);
        let mut best = (f64::INFINITY, 0u8);
        for code in 0..=255u8 {
            let Some(v) = self.value(code) else { continue };
            if v == 0.0 && code == 0x80 {
                continue; // fn's -0: zero encodes as 0x00 unless x is -0
            }
            let d = (v - x).abs();
            if d < best.0 || (d == best.0 && code & 1 == 0 && best.1 & 1 == 1) {
                best = (d, code);
            }
        }
        // fn keeps the sign of a zero result (-0 and negative underflow).
        if best.1 == 0 && x.is_sign_negative() && !self.fnuz {
            return 0x80;
        }
        best.1
    }

    /// The UE8M0 byte of a tile: fp32 quotient max(amax, 1e-4) / max (an f64
    /// division of two f32 values rounded to f32 is the correctly rounded f32
    /// quotient), rounded up to a power of two.
    fn scale_byte(&self, amax: f32) -> u8 {
        let q = (amax.max(1e-4) as f64 / self.max) as f32;
        let bits = q.to_bits();
        ((bits >> 23) + u32::from(bits & 0x7F_FFFF != 0)).min(254) as u8
    }

    /// Half the code spacing around |x| / scale, times the scale: the most a
    /// round-to-nearest code can be off for an input of that magnitude.
    fn half_step(&self, x: f64, scale: f64) -> f64 {
        let min_normal = 2f64.powi(1 - self.bias);
        let y = (x / scale).abs();
        let spacing = if y < min_normal {
            min_normal / 8.0
        } else {
            2f64.powi(y.log2().floor() as i32 - 3)
        };
        spacing / 2.0 * scale
    }
}

/// The expected nope row (512 bytes) and the dequantized values of one row.
fn quantize(f: &Format, row: &[bf16]) -> ([u8; 512], Vec<f64>) {
    let mut nope = [0u8; 512];
    let mut deq: Vec<f64> = row.iter().map(|x| x.to_f64()).collect();
    for k in 0..7 {
        let tile = &row[64 * k..64 * (k + 1)];
        let amax = tile.iter().fold(0f32, |m, x| m.max(x.to_f32().abs()));
        let byte = f.scale_byte(amax);
        let scale = 2f64.powi(byte as i32 - 127);
        for (i, x) in tile.iter().enumerate() {
            let code = f.encode(x.to_f64() / scale);
            nope[64 * k + i] = code;
            deq[64 * k + i] = f.value(code).unwrap() * scale;
        }
        nope[NOPE + 2 * k] = byte;
        nope[NOPE + 2 * k + 1] = byte;
    }
    (nope, deq)
}

/// Rows whose 64-dim tiles span magnitudes 2^-12..2^12 (many scale bytes),
/// one all-zero tile per row (the amax floor).
fn random_rows(rng: &mut StdRng, n: usize) -> Vec<bf16> {
    let mut rows = random_bf16(rng, n * D);
    for (i, tile) in rows.chunks_mut(64).enumerate() {
        let f = if i % 8 == 3 {
            0.0
        } else {
            2f32.powi(rng.random_range(-12..12))
        };
        for x in tile {
            *x = bf16::from_f32(x.to_f32() * f);
        }
    }
    rows
}

/// The layer's nope and rope buffers (CPU backend: host memory).
#[allow(clippy::mut_from_ref)]
fn buffers(pool: &Pool, layer: u32) -> (&mut [u8], &mut [bf16]) {
    let info = pool.layer(layer);
    let n = info.rows as usize;
    unsafe {
        (
            std::slice::from_raw_parts_mut(info.data as *mut u8, n * 512),
            std::slice::from_raw_parts_mut(info.rope_data as *mut bf16, n * 64),
        )
    }
}

// ---------------------------------------------------------------------------

#[test]
fn fp8_pool_reports_two_buffers_per_layer() {
    let ctx = Ctx::cpu(1);
    for dtype in FORMATS {
        let pool = Pool::of(&ctx, &spec(), dtype);
        let info = pool.info();
        assert_eq!(info.kv_dtype, dtype as u32);
        assert_eq!(info.row_bytes, 640);
        for layer in 0..2 {
            let l = pool.layer(layer);
            assert_eq!(l.bytes, l.rows * 512);
            assert_eq!(l.rope_bytes, l.rows * 128);
            assert!(!l.rope_data.is_null() && l.rope_data as usize % 16 == 0);
            let (nope, rope) = buffers(&pool, layer);
            assert!(nope.iter().all(|b| *b == 0) && rope.iter().all(|x| x.to_bits() == 0));
        }
    }
    let bf = Pool::new(&ctx, &spec());
    let l = bf.layer(0);
    assert_eq!((bf.info().row_bytes, l.rope_bytes), (1024, 0));
    assert!(l.rope_data.is_null());
}

#[test]
fn fp8_pool_adopts_caller_buffers() {
    let ctx = Ctx::cpu(1);
    let s = spec();
    let probe = Pool::of(&ctx, &s, FORMATS[0]);
    let rows: Vec<usize> = (0..2).map(|l| probe.layer(l).rows as usize).collect();
    // u128 storage: 16-byte aligned.
    let mut nope: Vec<Vec<u128>> = rows.iter().map(|r| vec![0u128; r * 512 / 16]).collect();
    let mut rope: Vec<Vec<u128>> = rows.iter().map(|r| vec![0u128; r * 128 / 16]).collect();
    let np: Vec<*mut std::ffi::c_void> = nope.iter_mut().map(|v| v.as_mut_ptr().cast()).collect();
    let rp: Vec<*mut std::ffi::c_void> = rope.iter_mut().map(|v| v.as_mut_ptr().cast()).collect();
    let params = unikv_pool_params {
        layer_buffers: np.as_ptr(),
        rope_buffers: rp.as_ptr(),
        ..s.params_of(FORMATS[0])
    };
    let mut pool = ptr::null_mut();
    ok(unsafe { unikv_pool_create(ctx.0, &params, &mut pool) });
    let pool = Pool(pool);
    assert_eq!(pool.info().owns_memory, 0);
    for l in 0..2 {
        let info = pool.layer(l as u32);
        assert_eq!((info.data, info.rope_data), (np[l], rp[l]));
    }
}

#[test]
fn fp8_pool_bad_input() {
    let ctx = Ctx::cpu(1);
    let s = spec();
    let probe = Pool::of(&ctx, &s, FORMATS[0]);
    let rows = probe.layer(1).rows as usize;
    let mut store = vec![0u128; rows * 512 / 16 + 1];
    let aligned: *mut std::ffi::c_void = store.as_mut_ptr().cast();
    let misaligned = unsafe { (aligned as *mut u8).add(8) }.cast();
    let layers = [aligned, aligned];
    let bad_rope = [misaligned, aligned];
    let cases = [
        (
            unikv_pool_params {
                layer_buffers: layers.as_ptr(),
                ..s.params_of(FORMATS[0])
            },
            UNIKV_NULL_ARGUMENT,
            "params.rope_buffers",
        ),
        (
            unikv_pool_params {
                layer_buffers: layers.as_ptr(),
                rope_buffers: bad_rope.as_ptr(),
                ..s.params_of(FORMATS[1])
            },
            UNIKV_BAD_ALIGNMENT,
            "params.rope_buffers[0]",
        ),
        (
            unikv_pool_params {
                rope_buffers: layers.as_ptr(),
                ..s.params_of(FORMATS[0])
            },
            UNIKV_INVALID_ARGUMENT,
            "params.rope_buffers",
        ),
        (
            unikv_pool_params {
                layer_buffers: layers.as_ptr(),
                rope_buffers: layers.as_ptr(),
                ..s.params()
            },
            UNIKV_INVALID_ARGUMENT,
            "params.rope_buffers",
        ),
        (
            unikv_pool_params {
                kv_dtype: unikv_dtype::UNIKV_DTYPE_U8 as u32,
                ..s.params()
            },
            UNIKV_BAD_DTYPE,
            "params.kv_dtype",
        ),
    ];
    for (params, status, arg) in cases {
        let mut out = ptr::null_mut();
        fails(
            unsafe { unikv_pool_create(ctx.0, &params, &mut out) },
            status,
            arg,
        );
        assert!(out.is_null());
    }
}

/// store_swa and store_compressed quantize each written row; every byte of a
/// written row is as the quantizer above says, no other row changes, and the
/// dequantized values are within half a code step of the input.
#[test]
fn stores_quantize_into_fp8_rows() {
    let (mut rng, seed) = seeded("stores_quantize_into_fp8_rows");
    let ctx = Ctx::cpu(2);
    for dtype in FORMATS {
        let f = format(dtype);
        let pool = Pool::of(&ctx, &spec(), dtype);
        let (nope, rope) = buffers(&pool, 1);
        nope.fill(POISON_BYTE);
        rope.fill(bf16::from_bits(0xA5A5));
        let before_rope = rope.to_vec();
        let info = pool.info();
        let t = 40;
        let kv = random_rows(&mut rng, t);
        // Tokens 0..19 of request 0 (slot 2) at positions 300..319; 20..39
        // compressed at locations 3k, with -1 for every fifth.
        let batch: Vec<i32> = (0..20).map(|_| 0).collect();
        let slots = [2i32];
        let pos: Vec<i32> = (300..320).collect();
        let swa = unikv_store_swa_args {
            struct_size: std::mem::size_of::<unikv_store_swa_args>(),
            kv: tensor(&kv, &[20, D]),
            batch_id: vec1(&batch),
            req_slots: vec1(&slots),
            positions: vec1(&pos),
            final_pos: absent(),
            layer: 1,
            num_tokens: 20,
        };
        ok(unsafe { unikv_store_swa(pool.0, &swa, ptr::null_mut()) });
        let loc: Vec<i32> = (0..20)
            .map(|i| if i % 5 == 4 { -1 } else { 3 * i })
            .collect();
        let comp = unikv_store_compressed_args {
            struct_size: std::mem::size_of::<unikv_store_compressed_args>(),
            kv: tensor(&kv[20 * D..], &[20, D]),
            loc: vec1(&loc),
            layer: 1,
            num_rows: 20,
        };
        ok(unsafe { unikv_store_compressed(pool.0, &comp, ptr::null_mut()) });

        let mut written = std::collections::HashMap::new();
        for (i, &l) in loc.iter().enumerate() {
            written.insert(2 * info.ring as usize + (300 + i) % info.ring as usize, i);
            if l >= 0 {
                written.insert(info.swa_rows as usize + l as usize, 20 + i);
            }
        }
        for r in 0..pool.layer(1).rows as usize {
            let (n, q) = (&nope[r * 512..(r + 1) * 512], &rope[r * 64..(r + 1) * 64]);
            let Some(&src) = written.get(&r) else {
                assert!(
                    n.iter().all(|b| *b == POISON_BYTE),
                    "seed {seed}: row {r} changed"
                );
                assert!(
                    q == &before_rope[r * 64..(r + 1) * 64],
                    "seed {seed}: rope {r} changed"
                );
                continue;
            };
            let row = &kv[src * D..(src + 1) * D];
            let (want, deq) = quantize(&f, row);
            assert!(
                n == want,
                "seed {seed} {dtype:?}: row {r} (source {src}) bytes differ"
            );
            assert!(
                bytes_of(q) == bytes_of(&row[NOPE..]),
                "seed {seed}: rope row {r}"
            );
            for k in 0..7 {
                let scale = 2f64.powi(n[NOPE + 2 * k] as i32 - 127);
                for d in 64 * k..64 * (k + 1) {
                    let x = row[d].to_f64();
                    assert!(
                        (deq[d] - x).abs() <= f.half_step(x, scale),
                        "seed {seed}: row {r} dim {d}: {x} stored as {}",
                        deq[d]
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Decode over an FP8 pool.

struct Decode {
    out: Vec<bf16>,
}

fn plan(ctx: &Ctx, tokens: usize, heads: usize, kv: unikv_dtype) -> *mut unikv_decode_plan {
    let params = unikv_attention_plan_params {
        struct_size: std::mem::size_of::<unikv_attention_plan_params>(),
        max_tokens: tokens as u32,
        num_heads: heads as u32,
        head_dim: D as u32,
        q_dtype: unikv_dtype::UNIKV_DTYPE_BF16 as u32,
        kv_dtype: kv as u32,
        out_dtype: unikv_dtype::UNIKV_DTYPE_BF16 as u32,
        kv_layout: 0,
        reserved: 0,
    };
    let mut p = ptr::null_mut();
    ok(unsafe { unikv_decode_plan_create(ctx.0, &params, &mut p) });
    p
}

#[allow(clippy::too_many_arguments)]
fn decode(
    plan: *mut unikv_decode_plan,
    pool: &Pool,
    q: &[bf16],
    heads: usize,
    lists: &[Vec<i32>],
    sink: &[f32],
    scale: f32,
) -> Result<Decode, unikv::ffi::status::unikv_status> {
    let t = lists.len();
    let mut indptr = vec![0i32];
    let indices: Vec<i32> = lists.iter().flatten().copied().collect();
    for l in lists {
        indptr.push(indptr.last().unwrap() + l.len() as i32);
    }
    let out: Vec<bf16> = poisoned(t * heads * D);
    let args = unikv_decode_args {
        struct_size: std::mem::size_of::<unikv_decode_args>(),
        q: tensor(q, &[t, heads, D]),
        indices: vec1(&indices),
        indptr: vec1(&indptr),
        sink: vec1(sink),
        out: tensor(&out, &[t, heads, D]),
        lse: absent(),
        layer: 1,
        num_tokens: t as u32,
        softmax_scale: scale,
        reserved: 0,
        rope_table: absent(),
        positions: absent(),
        kv: Default::default(),
        extra_kv: Default::default(),
        extra_indices: Default::default(),
        extra_indptr: Default::default(),
    };
    let status =
        unsafe { unikv_sparse_decode(plan, pool.0, &args, ptr::null_mut(), 0, ptr::null_mut()) };
    if status != UNIKV_OK {
        return Err(status);
    }
    Ok(Decode { out })
}

/// One head of one token in float64: softmax with the sink over `keys`.
fn reference(q: &[f64], keys: &[&[f64]], sink: f64, scale: f64) -> Vec<f64> {
    let s: Vec<f64> = keys
        .iter()
        .map(|k| scale * q.iter().zip(*k).map(|(a, b)| a * b).sum::<f64>())
        .collect();
    let m = s.iter().fold(sink, |a, &b| a.max(b));
    let mut den = (sink - m).exp();
    let mut acc = vec![0f64; D];
    for (sj, k) in s.iter().zip(keys) {
        let w = (sj - m).exp();
        den += w;
        for (a, x) in acc.iter_mut().zip(*k) {
            *a += w * x;
        }
    }
    acc.iter().map(|a| a / den).collect()
}

/// Decode over FP8 pools (both flavours): (1) within 1e-2 relative L2 of a
/// float64 reference over the dequantized keys; (2) against the same batch on
/// a bf16 pool holding the unquantized rows, each output element differs by
/// less than a bound from the actual scales: with key errors |δ_jd| ≤ h_jd
/// (half a code step at the row's scale), score errors are at most
/// E = scale·Σ_d |q_d| h_jd, softmax weights move by a factor within e^{±2E},
/// so |Δout_d| ≤ (e^{2E} − 1)·max_j |k_jd| + max_j h_jd, plus bf16 rounding
/// of both outputs and f32 accumulation.
#[test]
fn decode_over_fp8_pool_matches_reference_and_bf16_within_scale_bound() {
    let (mut rng, seed) = seeded("decode_over_fp8_pool");
    let ctx = Ctx::cpu(0);
    let scale = 0.044_194_173f32;
    let bf_pool = Pool::new(&ctx, &spec());
    let rows = bf_pool.layer(1).rows as usize;
    let data = random_rows(&mut rng, rows);
    // Realistic latent magnitudes for the attention part: tiles within 2^±3.
    let data: Vec<bf16> = data
        .chunks(64)
        .map(|t| {
            let a = t.iter().fold(0f32, |m, x| m.max(x.to_f32().abs()));
            let f = if a > 0.0 {
                2f32.powi(rng.random_range(-3..3)) / a
            } else {
                1.0
            };
            t.iter()
                .map(|x| bf16::from_f32(x.to_f32() * f))
                .collect::<Vec<_>>()
        })
        .collect::<Vec<_>>()
        .concat();
    bf_pool.rows_mut(1).copy_from_slice(&data);
    for dtype in FORMATS {
        let f = format(dtype);
        let pool = Pool::of(&ctx, &spec(), dtype);
        let (nope, rope) = buffers(&pool, 1);
        let mut deq = Vec::with_capacity(rows * D);
        let mut half = Vec::with_capacity(rows * D);
        for r in 0..rows {
            let row = &data[r * D..(r + 1) * D];
            let (n, d) = quantize(&f, row);
            nope[r * 512..(r + 1) * 512].copy_from_slice(&n);
            rope[r * 64..(r + 1) * 64].copy_from_slice(&row[NOPE..]);
            for (i, x) in row.iter().enumerate() {
                let s = if i < NOPE {
                    2f64.powi(n[NOPE + 2 * (i / 64)] as i32 - 127)
                } else {
                    0.0
                };
                half.push(if i < NOPE {
                    f.half_step(x.to_f64(), s)
                } else {
                    0.0
                });
            }
            deq.extend(d);
        }
        for heads in [1usize, 16, 64] {
            let lens = [0usize, 1, 5, 128, 700];
            let lists: Vec<Vec<i32>> = lens
                .iter()
                .map(|&n| (0..n).map(|_| rng.random_range(0..rows as i32)).collect())
                .collect();
            let t = lists.len();
            let q = random_bf16(&mut rng, t * heads * D);
            let sink: Vec<f32> = (0..heads).map(|_| rng.random_range(-2.0..2.0)).collect();
            let p8 = plan(&ctx, t, heads, dtype);
            let pb = plan(&ctx, t, heads, unikv_dtype::UNIKV_DTYPE_BF16);
            let got = decode(p8, &pool, &q, heads, &lists, &sink, scale).unwrap();
            let base = decode(pb, &bf_pool, &q, heads, &lists, &sink, scale).unwrap();
            // A plan for another KV dtype is refused, nothing written.
            assert_eq!(
                decode(pb, &pool, &q, heads, &lists, &sink, scale).err(),
                Some(UNIKV_BAD_DTYPE)
            );
            unsafe {
                unikv_decode_plan_destroy(p8);
                unikv_decode_plan_destroy(pb);
            }
            for (ti, list) in lists.iter().enumerate() {
                let keys: Vec<&[f64]> = list.iter().map(|&r| &deq[r as usize * D..][..D]).collect();
                for (h, &z) in sink.iter().enumerate() {
                    let at = (ti * heads + h) * D;
                    let qh: Vec<f64> = q[at..at + D].iter().map(|x| x.to_f64()).collect();
                    let want = reference(&qh, &keys, z as f64, scale as f64);
                    let o8: Vec<f64> = got.out[at..at + D].iter().map(|x| x.to_f64()).collect();
                    let ob: Vec<f64> = base.out[at..at + D].iter().map(|x| x.to_f64()).collect();
                    let tag = format!("seed {seed} {dtype:?} H={heads} token {ti} head {h}");
                    let norm = want.iter().map(|x| x * x).sum::<f64>().sqrt();
                    let err = o8
                        .iter()
                        .zip(&want)
                        .map(|(a, b)| (a - b).powi(2))
                        .sum::<f64>()
                        .sqrt();
                    assert!(
                        err <= 1e-2 * norm || (norm == 0.0 && err == 0.0),
                        "{tag}: relative L2 error {} against the float64 reference",
                        err / norm
                    );
                    let e = list
                        .iter()
                        .map(|&r| {
                            let hr = &half[r as usize * D..][..D];
                            scale as f64 * qh.iter().zip(hr).map(|(a, b)| a.abs() * b).sum::<f64>()
                        })
                        .fold(0f64, f64::max);
                    for d in 0..D {
                        let kmax = list
                            .iter()
                            .map(|&r| data[r as usize * D + d].to_f64().abs())
                            .fold(0f64, f64::max);
                        let hmax = list
                            .iter()
                            .map(|&r| half[r as usize * D + d])
                            .fold(0f64, f64::max);
                        let bound = (2.0 * e).exp_m1() * (kmax + hmax)
                            + hmax
                            + (o8[d].abs() + ob[d].abs()) * 2f64.powi(-8)
                            + 1e-5 * kmax;
                        assert!(
                            (o8[d] - ob[d]).abs() <= bound,
                            "{tag} dim {d}: fp8 {} vs bf16 {} exceeds the bound {bound}",
                            o8[d],
                            ob[d]
                        );
                    }
                }
            }
        }
    }
}
