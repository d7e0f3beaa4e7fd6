//! `unikv_prepare_qkv` on the CPU backend through the C ABI, against a float64
//! reference written here from docs/prepare.md §1, §3, §4, §5 with the bf16
//! rounding points `unikv_prepare_qkv_args` documents:
//!
//! * Q, per head: `n = x / sqrt(mean(x^2) + eps)`, `bf16(n)` on all dims, then
//!   the GPT-J rotation of the rounded rope dims by the table's (cos, sin),
//!   rounded again;
//! * KV: `k = x / sqrt(mean(x^2) + eps) * w`, rotation of the unrounded rope
//!   dims, `bf16` once; the pool row is that bf16 row (FP8 pools: its codes,
//!   checked bytewise against `cache_layouts::unified::quantize_row` of the
//!   `kv_out` row, and in value space against the reference, docs/testing.md §2's
//!   two-pool bound `|dequant - ref| <= 0.07 * tile amax`).
//!
//! Tolerance: a bf16 output must be within 1 bf16 ulp of the bf16 nearest to
//! the reference, or the bf16 nearest to some value within the implementation's
//! fp32 error bound E of it (RoPE can cancel, so E is taken relative to the
//! products' magnitudes). The Q rope dims rotate one of the bf16 values the first
//! rounding may give (either neighbour when the normalized value lies within
//! 2^-20 of a rounding midpoint).
//!
//! Outputs and pool rows are poisoned before each call, so an unwritten element
//! or a write outside the documented rows fails. Inputs are fresh random values
//! (seed printed; replay with UNIKV_TEST_SEED).

mod common;

use std::os::raw::c_void;
use std::ptr;

use common::*;
use half::bf16;
use rand::rngs::StdRng;
use rand::Rng;
use unikv::cache_layouts::unified;
use unikv::ffi::prepare::*;
use unikv::ffi::status::unikv_status;
use unikv::ffi::types::{unikv_dtype, unikv_tensor};
use unikv::fp8::Fp8Format;

/// Latent row width.
const D: usize = 512;
/// Rotated dims at the end of a row.
const R: usize = 64;
const NOPE: usize = D - R;
const EPS: f32 = 1e-6;
/// The fp32 unit roundoff, 2^-24.
const U: f64 = 1.0 / 16_777_216.0;
/// Rows of the RoPE table.
const MAX_POS: usize = 64;
const LAYER: u32 = 1;
/// Ring rows per request slot (window 8, no speculative rows).
const RING: i64 = 8;
/// Tokens of every case (three requests, see `Case::new`).
const T: usize = 9;
/// Row strides of the strided buffers, in elements: `kv_in` is a slice of a
/// fused projection's output, `kv_out` has padding after each row.
const KV_IN_STRIDE: usize = 640;
const KV_IN_OFFSET: usize = 128;
const KV_OUT_STRIDE: usize = 576;

fn spec() -> PoolSpec {
    PoolSpec {
        ratios: vec![0, 4],
        max_requests: 3,
        window: RING as u32,
        spec_extra: 0,
        c128_blocks: 1,
    }
}

fn fp8_of(dtype: unikv_dtype) -> Option<Fp8Format> {
    match dtype {
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN => Some(Fp8Format::E4m3Fn),
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ => Some(Fp8Format::E4m3Fnuz),
        _ => None,
    }
}

/// A descriptor with explicit strides (in elements).
fn strided<T: Dt>(data: *const T, shape: &[usize], strides: &[usize]) -> unikv_tensor {
    let mut t = absent();
    t.data = data as *mut c_void;
    t.dtype = T::DTYPE as u32;
    t.ndim = shape.len() as u32;
    for (axis, (&n, &s)) in shape.iter().zip(strides).enumerate() {
        t.shape[axis] = n as i64;
        t.strides[axis] = s as i64;
    }
    t
}

/// An integer argument in either accepted width.
enum Ints {
    I32(Vec<i32>),
    I64(Vec<i64>),
}

impl Ints {
    fn new(values: &[i64], wide: bool) -> Self {
        if wide {
            Ints::I64(values.to_vec())
        } else {
            Ints::I32(values.iter().map(|&v| v as i32).collect())
        }
    }

    fn t(&self) -> unikv_tensor {
        match self {
            Ints::I32(v) => vec1(v),
            Ints::I64(v) => vec1(v),
        }
    }

    fn get(&self, i: usize) -> i64 {
        match self {
            Ints::I32(v) => i64::from(v[i]),
            Ints::I64(v) => v[i],
        }
    }

    fn set(&mut self, i: usize, value: i64) {
        match self {
            Ints::I32(v) => v[i] = value as i32,
            Ints::I64(v) => v[i] = value,
        }
    }
}

/// bf16 values of either sign around `2^scale` (within a factor 2^4), never 0.
fn random_row(rng: &mut StdRng, len: usize, scale: i32) -> Vec<bf16> {
    (0..len)
        .map(|_| {
            let sign = if rng.random_bool(0.5) { -1.0 } else { 1.0 };
            let exp = scale + rng.random_range(-3..=3);
            bf16::from_f32(sign * rng.random_range(1.0f32..2.0) * 2f32.powi(exp))
        })
        .collect()
}

/// Inputs, poisoned outputs and the pool of one call of T tokens and `h` heads.
struct Case {
    h: usize,
    /// `[T, H + 1, 512]`; the call reads heads 0..H (token stride (H + 1) * 512).
    q_in: Vec<bf16>,
    /// `[T, H + 2, 512]`; the call writes heads 1..=H (a head-padded slice).
    q_out: Vec<bf16>,
    kv_in: Vec<bf16>,
    kv_weight: Vec<bf16>,
    kv_out: Vec<bf16>,
    table: Vec<f32>,
    positions: Ints,
    rows: Ints,
    pool: Pool,
    fp8: Option<Fp8Format>,
}

impl Case {
    /// Three requests: slot 1 at five consecutive positions crossing a ring
    /// boundary, slot 2 at one position, slot 3 at three positions crossing a
    /// boundary; tokens 3 and 5 store nothing (row -1).
    fn new(ctx: &Ctx, rng: &mut StdRng, h: usize, dtype: unikv_dtype, wide: (bool, bool)) -> Self {
        let a = RING * rng.random_range(0..5) + 5;
        let b = rng.random_range(0..MAX_POS as i64);
        let c = RING * rng.random_range(0..6) + 6;
        let slot_pos = [
            (1, a),
            (1, a + 1),
            (1, a + 2),
            (1, a + 3),
            (1, a + 4),
            (2, b),
            (3, c),
            (3, c + 1),
            (3, c + 2),
        ];
        let positions: Vec<i64> = slot_pos.iter().map(|&(_, p)| p).collect();
        let rows: Vec<i64> = slot_pos
            .iter()
            .enumerate()
            .map(|(t, &(s, p))| {
                if t == 3 || t == 5 {
                    -1
                } else {
                    s * RING + p % RING
                }
            })
            .collect();
        // Per-token scales differ (the norm is per row); some rows are small
        // enough that eps matters.
        let q_in: Vec<bf16> = (0..T * (h + 1))
            .flat_map(|_| {
                let scale = rng.random_range(-12..=6);
                random_row(rng, D, scale)
            })
            .collect();
        let kv_in: Vec<bf16> = (0..T)
            .flat_map(|_| {
                let scale = rng.random_range(-12..=6);
                random_row(rng, KV_IN_STRIDE, scale)
            })
            .collect();
        let kv_weight = random_row(rng, D, 0);
        let case = Case {
            h,
            q_in,
            q_out: poisoned(T * (h + 2) * D),
            kv_in,
            kv_weight,
            kv_out: poisoned(T * KV_OUT_STRIDE),
            table: rope_table(10_000.0, 0.0, MAX_POS as u32),
            positions: Ints::new(&positions, wide.0),
            rows: Ints::new(&rows, wide.1),
            pool: Pool::of(ctx, &spec(), dtype),
            fp8: fp8_of(dtype),
        };
        case.poison_pool();
        case
    }

    fn args(&self) -> unikv_prepare_qkv_args {
        let h = self.h;
        unikv_prepare_qkv_args {
            struct_size: std::mem::size_of::<unikv_prepare_qkv_args>(),
            q_in: strided(self.q_in.as_ptr(), &[T, h, D], &[(h + 1) * D, D, 1]),
            q_out: strided(self.q_out[D..].as_ptr(), &[T, h, D], &[(h + 2) * D, D, 1]),
            kv_in: strided(
                self.kv_in[KV_IN_OFFSET..].as_ptr(),
                &[T, D],
                &[KV_IN_STRIDE, 1],
            ),
            kv_weight: vec1(&self.kv_weight),
            kv_out: strided(self.kv_out.as_ptr(), &[T, D], &[KV_OUT_STRIDE, 1]),
            rope_table: tensor(&self.table, &[MAX_POS, R]),
            positions: self.positions.t(),
            rows: self.rows.t(),
            layer: LAYER,
            num_tokens: T as u32,
            num_heads: h as u32,
            q_eps: EPS,
            kv_eps: EPS,
            reserved: 0,
        }
    }

    fn run(&self, args: &unikv_prepare_qkv_args) -> unikv_status {
        unsafe { unikv_prepare_qkv(self.pool.0, args, ptr::null_mut()) }
    }

    /// The layer's buffers: bf16 rows, or FP8 nope rows and rope rows. The
    /// memory belongs to the library, not to `self`.
    #[allow(clippy::mut_from_ref)]
    fn pool_buffers(&self) -> Vec<&mut [u8]> {
        let info = self.pool.layer(LAYER);
        let mut buffers = vec![(info.data, info.bytes)];
        if self.fp8.is_some() {
            buffers.push((info.rope_data, info.rope_bytes));
        }
        buffers
            .into_iter()
            .map(|(p, n)| unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n as usize) })
            .collect()
    }

    fn poison_pool(&self) {
        for b in self.pool_buffers() {
            b.fill(POISON_BYTE);
        }
    }

    fn pool_bytes(&self) -> Vec<u8> {
        self.pool_buffers().concat()
    }

    /// Every output byte: q_out, kv_out and the pool layer.
    fn outputs(&self) -> Vec<u8> {
        [
            bytes_of(&self.q_out),
            bytes_of(&self.kv_out),
            self.pool_bytes(),
        ]
        .concat()
    }

    fn q_in_row(&self, t: usize, h: usize) -> &[bf16] {
        &self.q_in[(t * (self.h + 1) + h) * D..][..D]
    }

    fn kv_in_row(&self, t: usize) -> &[bf16] {
        &self.kv_in[t * KV_IN_STRIDE + KV_IN_OFFSET..][..D]
    }

    fn kv_out_row(&self, t: usize) -> &[bf16] {
        &self.kv_out[t * KV_OUT_STRIDE..][..D]
    }

    fn cos_sin(&self, t: usize, i: usize) -> (f64, f64) {
        let p = self.positions.get(t) as usize;
        (
            f64::from(self.table[p * R + 2 * i]),
            f64::from(self.table[p * R + 2 * i + 1]),
        )
    }
}

// ---------------------------------------------------------------------------
// The float64 reference and the acceptance rule

fn widen(row: &[bf16]) -> Vec<f64> {
    row.iter().map(|v| f64::from(v.to_f32())).collect()
}

/// `1 / sqrt(mean(x^2) + eps)`.
fn ref_factor(x: &[f64], eps: f32) -> f64 {
    let mean = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    1.0 / (mean + f64::from(eps)).sqrt()
}

/// `(re + j im)(c + j s)` and, per component, the magnitude of its two products.
fn rotate(re: f64, im: f64, c: f64, s: f64) -> ([f64; 2], [f64; 2]) {
    (
        [re * c - im * s, re * s + im * c],
        [
            (re * c).abs() + (im * s).abs(),
            (re * s).abs() + (im * c).abs(),
        ],
    )
}

/// The bf16 nearest to `x` (ties to even), rounded from f64 directly.
fn nearest(x: f64) -> f32 {
    if x == 0.0 {
        return 0.0;
    }
    let exp = ((x.to_bits() >> 52) & 0x7FF) as i32 - 1023;
    assert!(
        (-126..=127).contains(&exp),
        "{x} is outside bf16's normal range"
    );
    let step = 2f64.powi(exp - 7);
    ((x / step).round_ties_even() * step) as f32
}

/// Position of a bf16 value on the ordered line of bf16 values.
fn rank(v: f32) -> i64 {
    let bits = v.to_bits();
    assert_eq!(bits & 0xFFFF, 0, "{v} is not a bf16 value");
    let magnitude = i64::from((bits >> 16) & 0x7FFF);
    if bits >> 31 == 1 {
        -magnitude
    } else {
        magnitude
    }
}

/// `got` is within 1 bf16 ulp of `exact`'s nearest bf16, or the nearest bf16 of
/// a value within `err` of `exact`.
fn accepts(got: bf16, exact: f64, err: f64) -> bool {
    let r = rank(got.to_f32());
    let mid = rank(nearest(exact));
    let lo = rank(nearest(exact - err)).min(mid - 1);
    let hi = rank(nearest(exact + err)).max(mid + 1);
    (lo..=hi).contains(&r)
}

/// The bf16 values an fp32 computation of `n` (relative error far below
/// 2^-20) may round to: one, or both neighbours near a midpoint.
fn first_roundings(n: f64) -> Vec<f64> {
    let mut v = vec![
        f64::from(nearest(n * (1.0 - 1.0 / 1048576.0))),
        f64::from(nearest(n * (1.0 + 1.0 / 1048576.0))),
    ];
    v.dedup();
    v
}

/// Checks q_out of every (token, head) and returns the elements checked.
fn check_q(c: &Case, q_out: &[bf16]) -> usize {
    let mut checked = 0;
    for t in 0..T {
        for h in 0..c.h {
            let x = widen(c.q_in_row(t, h));
            let f = ref_factor(&x, EPS);
            let got = &q_out[(t * (c.h + 2) + h + 1) * D..][..D];
            for d in 0..NOPE {
                assert!(
                    accepts(got[d], x[d] * f, 0.0),
                    "q token {t} head {h} dim {d}: {} vs {}",
                    got[d],
                    x[d] * f
                );
                checked += 1;
            }
            for i in 0..R / 2 {
                let d = NOPE + 2 * i;
                let (cos, sin) = c.cos_sin(t, i);
                for k in 0..2 {
                    let ok = first_roundings(x[d] * f).iter().any(|&n0| {
                        first_roundings(x[d + 1] * f).iter().any(|&n1| {
                            let (exact, magnitude) = rotate(n0, n1, cos, sin);
                            accepts(got[d + k], exact[k], 2.01 * U * magnitude[k])
                        })
                    });
                    assert!(ok, "q token {t} head {h} dim {}: {}", d + k, got[d + k]);
                    checked += 1;
                }
            }
        }
    }
    checked
}

/// The reference KV row of token t, unrounded.
fn ref_kv(c: &Case, t: usize) -> (Vec<f64>, Vec<f64>) {
    let x = widen(c.kv_in_row(t));
    let w = widen(&c.kv_weight);
    let f = ref_factor(&x, EPS);
    let mut k: Vec<f64> = x.iter().zip(&w).map(|(x, w)| x * f * w).collect();
    // Per dim, the implementation's fp32 error bound: 3u of the norm products,
    // and for rope dims propagated through the rotation plus its own 2u.
    let mut err: Vec<f64> = k.iter().map(|v| 3.01 * U * v.abs()).collect();
    for i in 0..R / 2 {
        let d = NOPE + 2 * i;
        let (cos, sin) = c.cos_sin(t, i);
        let (exact, magnitude) = rotate(k[d], k[d + 1], cos, sin);
        k[d..d + 2].copy_from_slice(&exact);
        err[d] = 5.02 * U * magnitude[0];
        err[d + 1] = 5.02 * U * magnitude[1];
    }
    (k, err)
}

/// Checks one bf16 KV row (kv_out or a bf16 pool row) of token t.
fn check_kv_row(c: &Case, t: usize, got: &[bf16], what: &str) -> usize {
    let (k, err) = ref_kv(c, t);
    for d in 0..D {
        assert!(
            accepts(got[d], k[d], err[d]),
            "{what} token {t} dim {d}: {} vs {}",
            got[d],
            k[d]
        );
    }
    D
}

/// Checks every pool row: targeted rows hold token t's row (FP8: the codes of
/// its kv_out row and values within docs/testing.md §2's bound), every other row is still
/// poison. Returns the rows written.
fn check_pool(c: &Case) -> usize {
    let info = c.pool.layer(LAYER);
    let rows = info.rows as usize;
    let mut owner = vec![None; rows];
    for t in 0..T {
        let r = c.rows.get(t);
        if r >= 0 {
            owner[r as usize] = Some(t);
        }
    }
    let buffers = c.pool_buffers();
    for (r, who) in owner.iter().enumerate() {
        let Some(fmt) = c.fp8 else {
            let row = &buffers[0][r * 2 * D..][..2 * D];
            match who {
                None => assert!(row.iter().all(|&b| b == POISON_BYTE), "row {r} written"),
                Some(t) => {
                    assert_eq!(
                        row,
                        bytes_of(c.kv_out_row(*t)),
                        "row {r} is not kv_out[{t}]"
                    );
                    let values: Vec<bf16> = row
                        .chunks_exact(2)
                        .map(|b| bf16::from_le_bytes([b[0], b[1]]))
                        .collect();
                    check_kv_row(c, *t, &values, "bf16 pool");
                }
            }
            continue;
        };
        let nope = &buffers[0][r * unified::NOPE_ROW_BYTES..][..unified::NOPE_ROW_BYTES];
        let rope = &buffers[1][r * 2 * R..][..2 * R];
        let Some(t) = *who else {
            assert!(
                nope.iter().chain(rope).all(|&b| b == POISON_BYTE),
                "row {r} written"
            );
            continue;
        };
        let mut want_nope = [0u8; unified::NOPE_ROW_BYTES];
        let mut want_rope = [bf16::ZERO; unified::ROPE_DIMS];
        unified::quantize_row(c.kv_out_row(t), fmt, &mut want_nope, &mut want_rope);
        assert_eq!(nope, want_nope, "{fmt:?} nope row {r} (token {t})");
        assert_eq!(
            rope,
            bytes_of(&want_rope),
            "{fmt:?} rope row {r} (token {t})"
        );
        let rope_values: Vec<bf16> = rope
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]))
            .collect();
        let mut deq = vec![0f32; D];
        unified::dequantize_row(nope, &rope_values, fmt, &mut deq);
        let (k, _) = ref_kv(c, t);
        for tile in 0..NOPE / 64 {
            let dims = tile * 64..(tile + 1) * 64;
            let amax = k[dims.clone()].iter().fold(0f64, |m, v| m.max(v.abs()));
            for d in dims {
                assert!(
                    (f64::from(deq[d]) - k[d]).abs() <= 0.07 * amax,
                    "{fmt:?} row {r} dim {d}: {} vs {} (tile amax {amax})",
                    deq[d],
                    k[d]
                );
            }
        }
    }
    owner.iter().flatten().count()
}

/// Runs a case and checks every output against the reference.
fn check_case(c: &Case) {
    ok(c.run(&c.args()));
    let checked = check_q(c, &c.q_out);
    assert_eq!(checked, T * c.h * D);
    // The padding heads of q_out and columns of kv_out are untouched.
    for t in 0..T {
        for h in [0, c.h + 1] {
            let pad = &c.q_out[(t * (c.h + 2) + h) * D..][..D];
            assert!(bytes_of(pad).iter().all(|&b| b == POISON_BYTE));
        }
        let pad = &c.kv_out[t * KV_OUT_STRIDE + D..][..KV_OUT_STRIDE - D];
        assert!(bytes_of(pad).iter().all(|&b| b == POISON_BYTE));
        assert_eq!(check_kv_row(c, t, c.kv_out_row(t), "kv_out"), D);
    }
    assert_eq!(check_pool(c), T - 2, "two tokens store nothing");
}

#[test]
fn matches_reference_for_every_pool_kind_and_index_width() {
    let (mut rng, _) = seeded("matches_reference_for_every_pool_kind_and_index_width");
    let ctx = Ctx::cpu(2);
    let kinds = [
        (unikv_dtype::UNIKV_DTYPE_BF16, (false, false)),
        (unikv_dtype::UNIKV_DTYPE_BF16, (true, true)),
        (unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN, (false, true)),
        (unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ, (true, false)),
    ];
    for (dtype, wide) in kinds {
        for h in [1, 3, 16] {
            check_case(&Case::new(&ctx, &mut rng, h, dtype, wide));
        }
    }
}

/// Without `rows` the pool is untouched; without `kv_out` the pool rows and
/// q_out are those of the call with it.
#[test]
fn kv_out_and_rows_are_optional() {
    let (mut rng, _) = seeded("kv_out_and_rows_are_optional");
    let ctx = Ctx::cpu(2);
    for dtype in [
        unikv_dtype::UNIKV_DTYPE_BF16,
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
    ] {
        let c = Case::new(&ctx, &mut rng, 4, dtype, (false, false));
        let mut args = c.args();
        args.rows = absent();
        ok(c.run(&args));
        let poison = vec![POISON_BYTE; c.pool_bytes().len()];
        assert!(
            c.pool_bytes() == poison,
            "rows absent: the pool was written"
        );
        let q_without_rows = c.q_out.clone();

        ok(c.run(&c.args()));
        let (q_full, pool_full) = (c.q_out.clone(), c.pool_bytes());
        assert_eq!(bytes_of(&q_full), bytes_of(&q_without_rows));

        c.poison_pool();
        let mut args = c.args();
        args.kv_out = absent();
        ok(c.run(&args));
        assert_eq!(c.pool_bytes(), pool_full, "kv_out absent: other pool rows");
        assert_eq!(bytes_of(&c.q_out), bytes_of(&q_full));
    }
}

/// `q_out` may be `q_in` and `kv_out` may be `kv_in` (in place): same results
/// as separate buffers.
#[test]
fn runs_in_place() {
    let (mut rng, _) = seeded("runs_in_place");
    let ctx = Ctx::cpu(2);
    let c = Case::new(
        &ctx,
        &mut rng,
        5,
        unikv_dtype::UNIKV_DTYPE_BF16,
        (false, true),
    );
    ok(c.run(&c.args()));
    let pool = c.pool_bytes();
    let mut args = c.args();
    args.q_out = args.q_in;
    args.kv_out = args.kv_in;
    c.poison_pool();
    ok(c.run(&args));
    assert_eq!(c.pool_bytes(), pool);
    for t in 0..T {
        for h in 0..c.h {
            assert_eq!(
                bytes_of(c.q_in_row(t, h)),
                bytes_of(&c.q_out[(t * (c.h + 2) + h + 1) * D..][..D]),
                "q token {t} head {h}"
            );
        }
        assert_eq!(bytes_of(c.kv_in_row(t)), bytes_of(c.kv_out_row(t)));
    }
}

/// Each case breaks one thing of a valid call: exact status, a message naming
/// the argument, and every output byte (q_out, kv_out, the pool) unchanged.
#[test]
fn rejects_bad_input_writing_nothing() {
    let (mut rng, _) = seeded("rejects_bad_input_writing_nothing");
    let ctx = Ctx::cpu(2);
    for dtype in [
        unikv_dtype::UNIKV_DTYPE_BF16,
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
    ] {
        let mut c = Case::new(&ctx, &mut rng, 3, dtype, (true, false));
        let before = c.outputs();
        let expect = |c: &Case, args: &unikv_prepare_qkv_args, want, arg: &str| {
            fails(c.run(args), want, arg);
            assert!(c.outputs() == before, "{arg}: a failing call wrote output");
        };
        type Break = fn(&mut unikv_prepare_qkv_args);
        let cases: Vec<(&str, unikv_status, Break)> = vec![
            ("q_in", UNIKV_BAD_DTYPE, |a| a.q_in.dtype = 3),
            ("q_in", UNIKV_BAD_SHAPE, |a| a.q_in.shape[1] = 2),
            ("q_in", UNIKV_BAD_SHAPE, |a| a.q_in.shape[0] = T as i64 - 1),
            ("q_in", UNIKV_BAD_ALIGNMENT, |a| a.q_in.strides[0] -= 4),
            ("q_in.data", UNIKV_NULL_ARGUMENT, |a| {
                a.q_in.data = ptr::null_mut()
            }),
            ("q_out", UNIKV_BAD_SHAPE, |a| a.q_out.shape[2] = 256),
            ("q_out", UNIKV_BAD_STRIDE, |a| a.q_out.strides[2] = 2),
            ("q_out.data", UNIKV_NULL_ARGUMENT, |a| {
                a.q_out.data = ptr::null_mut()
            }),
            ("kv_in", UNIKV_BAD_SHAPE, |a| a.kv_in.shape[1] = 448),
            ("kv_in", UNIKV_BAD_DTYPE, |a| a.kv_in.dtype = 6),
            ("kv_in.data", UNIKV_NULL_ARGUMENT, |a| {
                a.kv_in.data = ptr::null_mut()
            }),
            ("kv_weight", UNIKV_BAD_DTYPE, |a| a.kv_weight.dtype = 3),
            ("kv_weight", UNIKV_BAD_SHAPE, |a| a.kv_weight.shape[0] = 256),
            ("kv_weight.data", UNIKV_NULL_ARGUMENT, |a| {
                a.kv_weight.data = ptr::null_mut()
            }),
            ("kv_out", UNIKV_BAD_SHAPE, |a| a.kv_out.shape[0] = 2),
            ("rope_table", UNIKV_BAD_SHAPE, |a| {
                a.rope_table.shape[1] = 32
            }),
            ("rope_table", UNIKV_BAD_DTYPE, |a| a.rope_table.dtype = 1),
            ("rope_table.data", UNIKV_NULL_ARGUMENT, |a| {
                a.rope_table.data = ptr::null_mut()
            }),
            ("positions", UNIKV_BAD_DTYPE, |a| a.positions.dtype = 3),
            ("positions", UNIKV_BAD_SHAPE, |a| a.positions.shape[0] = 3),
            ("positions.data", UNIKV_NULL_ARGUMENT, |a| {
                a.positions.data = ptr::null_mut()
            }),
            ("rows", UNIKV_BAD_DTYPE, |a| a.rows.dtype = 1),
            ("layer", UNIKV_OUT_OF_RANGE, |a| a.layer = 2),
            ("num_heads", UNIKV_INVALID_ARGUMENT, |a| a.num_heads = 0),
            ("q_eps", UNIKV_INVALID_ARGUMENT, |a| a.q_eps = f32::NAN),
            ("kv_eps", UNIKV_INVALID_ARGUMENT, |a| a.kv_eps = 0.0),
            ("reserved", UNIKV_INVALID_ARGUMENT, |a| a.reserved = 1),
            ("args.struct_size", UNIKV_BAD_STRUCT_SIZE, |a| {
                a.struct_size = 8
            }),
        ];
        for (arg, want, break_it) in cases {
            let mut args = c.args();
            break_it(&mut args);
            expect(&c, &args, want, arg);
        }
        fails(
            unsafe { unikv_prepare_qkv(c.pool.0, ptr::null(), ptr::null_mut()) },
            UNIKV_NULL_ARGUMENT,
            "args",
        );
        fails(
            unsafe { unikv_prepare_qkv(ptr::null(), &c.args(), ptr::null_mut()) },
            UNIKV_NULL_ARGUMENT,
            "pool",
        );
        assert!(c.outputs() == before);

        // Device values, checked on the CPU before anything is written: the
        // last token's position past the table, negative, or past 2^32 (an
        // i64 that must not wrap); a row past the layer; two tokens on one row.
        let rows = c.pool.layer(LAYER).rows as i64;
        let last = T - 1;
        for (pos, row) in [
            (MAX_POS as i64, None),
            (-1, None),
            ((1 << 32) + 1, None),
            (0, Some(rows)),
            (0, Some(c.rows.get(0))),
        ] {
            let (old_pos, old_row) = (c.positions.get(last), c.rows.get(last));
            c.positions.set(last, pos);
            if let Some(r) = row {
                c.rows.set(last, r);
            }
            let (want, arg) = match row {
                None => (UNIKV_OUT_OF_RANGE, format!("positions[{last}]")),
                Some(r) if r == rows => (UNIKV_OUT_OF_RANGE, format!("rows[{last}]")),
                Some(_) => (UNIKV_INVALID_ARGUMENT, format!("rows[{last}]")),
            };
            expect(&c, &c.args(), want, &arg);
            c.positions.set(last, old_pos);
            c.rows.set(last, old_row);
        }
        // Zero tokens: nothing to do, nothing written.
        let mut args = c.args();
        args.num_tokens = 0;
        ok(c.run(&args));
        assert!(c.outputs() == before);
    }
}

/// `unikv_prepare_qkv_indexer_q` writes what `unikv_prepare_qkv` then
/// `unikv_indexer_prepare_q` write, byte for byte (Q, KV rows, the pool layer,
/// query codes and folded weights), on bf16 and FP8 pools.
#[test]
fn fused_with_the_indexer_query_equals_the_two_calls() {
    use common::indexer::FusedPrepare;
    let (mut rng, _) = seeded("fused_with_the_indexer_query_equals_the_two_calls");
    let ctx = Ctx::cpu(2);
    for dtype in [
        unikv_dtype::UNIKV_DTYPE_BF16,
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
    ] {
        let pool = Pool::of(&ctx, &spec(), dtype);
        let rows = pool.layer(0).rows as usize;
        for &(t, h, ih) in &[(1, 16, 64), (3, 64, 8), (5, 2, 1)] {
            let case = FusedPrepare::random(&mut rng, t, h, ih, rows);
            let (status, fused) = case.run(&ctx, &pool, true, |_, _| {});
            ok(status);
            let (status, apart) = case.run(&ctx, &pool, false, |_, _| {});
            ok(status);
            assert_eq!(fused, apart, "{dtype:?} T={t} H={h} indexer heads {ih}");
            case.query.check(&fused[3], &bytes_f32(&fused[4]));
        }
    }
}

/// Either struct's bad argument or device value fails the fused call with
/// nothing written, whichever part it belongs to.
#[test]
fn fused_with_the_indexer_query_rejects_bad_input_writing_nothing() {
    use common::indexer::{untouched, FusedPrepare};
    let (mut rng, _) = seeded("fused_with_the_indexer_query_rejects_bad_input_writing_nothing");
    let ctx = Ctx::cpu(1);
    let pool = Pool::new(&ctx, &spec());
    let rows = pool.layer(0).rows as usize;
    let case = FusedPrepare::random(&mut rng, 3, 4, 4, rows);
    let fails_clean = |c: &FusedPrepare, edit: &dyn Fn(&mut _, &mut _), want, arg: &str| {
        let (status, out) = c.run(&ctx, &pool, true, |a, q| edit(a, q));
        fails(status, want, arg);
        assert!(untouched(&out), "{arg}: the refused call wrote");
    };
    fails_clean(
        &case,
        &|a, _| a.reserved = 1,
        UNIKV_INVALID_ARGUMENT,
        "reserved",
    );
    fails_clean(&case, &|_, q| q.q_dtype = 99, UNIKV_BAD_ENUM, "q_dtype");
    fails_clean(
        &case,
        &|_, q| q.struct_size = 3,
        UNIKV_BAD_STRUCT_SIZE,
        "args.struct_size",
    );
    fails_clean(
        &case,
        &|a, q| q.q_fp8.data = a.q_in.data,
        UNIKV_OVERLAPPING_BUFFERS,
        "q_fp8",
    );
    // Device values: the query's position past its table (the Q/KV part
    // valid), then a pool row past the layer (the query part valid).
    let mut bad = case.clone();
    bad.query.positions[1] = bad.query.max_pos as i64;
    fails_clean(&bad, &|_, _| {}, UNIKV_OUT_OF_RANGE, "positions[1]");
    let mut bad = case.clone();
    bad.rows[2] = rows as i32;
    fails_clean(&bad, &|_, _| {}, UNIKV_OUT_OF_RANGE, "rows[2]");
    let status =
        unsafe { unikv_prepare_qkv_indexer_q(pool.0, ptr::null(), ptr::null(), ptr::null_mut()) };
    fails(status, UNIKV_NULL_ARGUMENT, "args");
}

fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|w| f32::from_ne_bytes(w.try_into().unwrap()))
        .collect()
}
