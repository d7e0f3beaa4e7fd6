//! `unikv_inverse_rope` on the CPU backend, through the C ABI, against a float64
//! reference written here from docs/attention.md §4 / docs/prepare.md §3: dims
//! 448..511 of every head of token t, as pairs `(re, im)`, times the conjugate
//! `c - j s` of the table's (cos, sin) at `positions[t]`:
//! `re' = re c + im s`, `im' = im c - re s`; dims 0..447 untouched.
//!
//! Tolerance. The op computes in fp32 (two products and a sum, error at most
//! E = 3u (|re c| + |im s|) with u = 2^-24) and rounds once to bf16. A result is
//! accepted when it is the bf16 nearest to some value within E of the exact one:
//! the exact rounding, or its neighbour (1 bf16 ulp) within E of a midpoint.
//!
//! The op works in place, so the tests compare the whole buffer: everything but
//! the rotated dims must stay bit for bit as it was (padding, heads past
//! `num_heads`, tokens past `num_tokens`, the nope dims). Inputs are fresh and
//! random each run (never zeros); the seed is printed, rerun a failure with
//! `UNIKV_TEST_SEED=<seed>`.

mod common;

use std::os::raw::c_void;
use std::ptr;

use common::*;
use half::bf16;
use rand::rngs::StdRng;
use rand::Rng;
use unikv::ffi::context::{unikv_memory_alloc, unikv_memory_free};
use unikv::ffi::rope::{unikv_inverse_rope, unikv_inverse_rope_args};
use unikv::ffi::types::unikv_dtype::*;
use unikv::ffi::types::unikv_tensor;
use unikv::rope::rope_row;

/// Latent row width.
const D: usize = 512;
/// Rotated dims at the end of a row.
const R: usize = 64;
/// Dims before them.
const NOPE: usize = D - R;
/// The fp32 unit roundoff, 2^-24.
const U: f64 = 1.0 / 16_777_216.0;

// ---------------------------------------------------------------------------
// Buffers and descriptors

/// Host memory from the context's allocator (256-byte aligned, as device
/// memory is), viewed as `[T]`.
struct Buf<'a, T> {
    ctx: &'a Ctx,
    ptr: *mut T,
    len: usize,
}

impl<'a, T: Copy> Buf<'a, T> {
    fn new(ctx: &'a Ctx, data: &[T]) -> Self {
        let mut raw: *mut c_void = ptr::null_mut();
        ok(unsafe { unikv_memory_alloc(ctx.0, std::mem::size_of_val(data), &mut raw) });
        let buf = Buf {
            ctx,
            ptr: raw.cast(),
            len: data.len(),
        };
        buf.slice_mut().copy_from_slice(data);
        buf
    }

    fn slice(&self) -> &[T] {
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    #[allow(clippy::mut_from_ref)]
    fn slice_mut(&self) -> &mut [T] {
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl<T> Drop for Buf<'_, T> {
    fn drop(&mut self) {
        ok(unsafe { unikv_memory_free(self.ctx.0, self.ptr.cast()) });
    }
}

/// How `x` sits in its buffer: `[tokens_cap, heads_cap, head_stride]` elements,
/// of which the op sees `[num_tokens.., num_heads, 512]`.
#[derive(Debug, Clone, Copy)]
struct Layout {
    tokens_cap: usize,
    heads_cap: usize,
    head_stride: usize,
}

impl Layout {
    fn contiguous(tokens: usize, heads: usize) -> Self {
        Layout {
            tokens_cap: tokens,
            heads_cap: heads,
            head_stride: D,
        }
    }

    fn elems(&self) -> usize {
        self.tokens_cap * self.heads_cap * self.head_stride
    }

    fn offset(&self, t: usize, h: usize) -> usize {
        (t * self.heads_cap + h) * self.head_stride
    }

    /// The descriptor of the first `heads` heads of every token.
    fn x(&self, data: *mut bf16, heads: usize) -> unikv_tensor {
        let mut d = absent();
        d.data = data.cast();
        d.dtype = UNIKV_DTYPE_BF16 as u32;
        d.ndim = 3;
        d.shape[..3].copy_from_slice(&[self.tokens_cap as i64, heads as i64, D as i64]);
        d.strides[..3].copy_from_slice(&[
            (self.heads_cap * self.head_stride) as i64,
            self.head_stride as i64,
            1,
        ]);
        d
    }
}

fn args(
    x: unikv_tensor,
    positions: unikv_tensor,
    table: unikv_tensor,
    num_tokens: usize,
    num_heads: usize,
) -> unikv_inverse_rope_args {
    unikv_inverse_rope_args {
        struct_size: std::mem::size_of::<unikv_inverse_rope_args>(),
        x,
        positions,
        rope_table: table,
        num_tokens: num_tokens as u32,
        num_heads: num_heads as u32,
    }
}

fn run(ctx: &Ctx, a: &unikv_inverse_rope_args) -> unikv::ffi::status::unikv_status {
    unsafe { unikv_inverse_rope(ctx.0, a, ptr::null_mut()) }
}

// ---------------------------------------------------------------------------
// Inputs

/// A table of `max_pos` rows through the C ABI: a dense layer (base 10000) or a
/// compressed one (base 40000 with DeepSeek-V3's YaRN values).
fn random_table(rng: &mut StdRng, max_pos: u32) -> Vec<f32> {
    let (base, factor) = if rng.random_bool(0.5) {
        (10_000.0, 0.0)
    } else {
        (40_000.0, 40.0)
    };
    rope_table(base, factor, max_pos)
}

/// Nonzero bf16 values of either sign with magnitudes spread over 2^-9 .. 2^5.
fn random_values(rng: &mut StdRng, n: usize) -> Vec<bf16> {
    (0..n)
        .map(|_| {
            let magnitude = rng.random_range(1.0f32..2.0) * 2f32.powi(rng.random_range(-9..=4));
            let sign = if rng.random_bool(0.5) { -1.0 } else { 1.0 };
            bf16::from_f32(sign * magnitude)
        })
        .collect()
}

/// Positions in `0..max_pos`, with both ends of the table among them.
fn random_positions(rng: &mut StdRng, n: usize, max_pos: u32) -> Vec<i64> {
    (0..n)
        .map(|t| match t % 5 {
            0 => 0,
            1 => i64::from(max_pos) - 1,
            _ => rng.random_range(0..i64::from(max_pos)),
        })
        .collect()
}

// ---------------------------------------------------------------------------
// The float64 reference and acceptance

/// The bf16 nearest to `x` (ties to even), rounded from f64 directly.
fn bf16_nearest(x: f64) -> f64 {
    if x == 0.0 {
        return x;
    }
    let exp = ((x.to_bits() >> 52) & 0x7FF) as i32 - 1023;
    assert!((-126..=127).contains(&exp), "{x} is outside bf16's range");
    let step = 2f64.powi(exp - 7);
    (x / step).round_ties_even() * step
}

/// The spacing of bf16 values in the binade of `x` (> 0).
fn bf16_ulp(x: f64) -> f64 {
    let exp = ((x.abs().to_bits() >> 52) & 0x7FF) as i32 - 1023;
    2f64.powi(exp - 7)
}

/// Whether `got` is the bf16 nearest to some value within `err` of `exact`.
fn accepted(got: bf16, exact: f64, err: f64) -> bool {
    let g = got.to_f64();
    bf16_nearest(exact - err) <= g && g <= bf16_nearest(exact + err)
}

/// Checks the rotated pairs of head (t, h) against the reference, given its
/// values before the call, and returns how many elements it checked.
fn check_head(before: &[bf16], after: &[bf16], cs: &[f32], what: &str) -> usize {
    for i in 0..R / 2 {
        let (re, im) = (before[2 * i].to_f64(), before[2 * i + 1].to_f64());
        let (c, s) = (f64::from(cs[2 * i]), f64::from(cs[2 * i + 1]));
        let want = [re * c + im * s, im * c - re * s];
        let err = [
            3.0 * U * ((re * c).abs() + (im * s).abs()),
            3.0 * U * ((im * c).abs() + (re * s).abs()),
        ];
        for k in 0..2 {
            let got = after[2 * i + k];
            assert!(
                accepted(got, want[k], err[k]),
                "{what} dim {}: got {got}, want {:e} (from ({re:e}, {im:e}), c {c:e}, s {s:e})",
                NOPE + 2 * i + k,
                want[k]
            );
        }
    }
    R
}

/// Runs one call on a random case and checks the whole buffer; returns the
/// number of rope elements checked.
fn check_case(ctx: &Ctx, rng: &mut StdRng, layout: Layout, heads: usize, wide: bool) -> usize {
    let tokens = rng.random_range(1..=layout.tokens_cap);
    let max_pos = rng.random_range(1..5000u32);
    let table = random_table(rng, max_pos);
    let table_buf = Buf::new(ctx, &table);
    let x = Buf::new(ctx, &random_values(rng, layout.elems()));
    let before = x.slice().to_vec();
    // Entries past num_tokens are invalid: they must not be read.
    let mut positions = random_positions(rng, tokens, max_pos);
    positions.extend([-1, i64::from(max_pos)]);
    let pos64 = Buf::new(ctx, &positions);
    let pos32 = Buf::new(
        ctx,
        &positions.iter().map(|&p| p as i32).collect::<Vec<_>>(),
    );
    let a = args(
        layout.x(x.ptr, heads),
        if wide {
            vec1(pos64.slice())
        } else {
            vec1(pos32.slice())
        },
        tensor(table_buf.slice(), &[max_pos as usize, R]),
        tokens,
        heads,
    );
    ok(run(ctx, &a));

    let after = x.slice();
    let mut want_unchanged = vec![true; after.len()];
    let mut checked = 0;
    for (t, &p) in positions[..tokens].iter().enumerate() {
        let cs = &table[p as usize * R..][..R];
        for h in 0..heads {
            let rope = layout.offset(t, h) + NOPE;
            let what = format!("{layout:?} token {t} (position {p}) head {h}");
            checked += check_head(&before[rope..][..R], &after[rope..][..R], cs, &what);
            want_unchanged[rope..rope + R].fill(false);
        }
    }
    for (i, keep) in want_unchanged.iter().enumerate() {
        if *keep {
            assert_eq!(
                after[i].to_bits(),
                before[i].to_bits(),
                "{layout:?} element {i} (token {}, head {}, dim {}) changed",
                i / (layout.heads_cap * layout.head_stride),
                i / layout.head_stride % layout.heads_cap,
                i % layout.head_stride
            );
        }
    }
    checked
}

// ---------------------------------------------------------------------------
// Tests

/// Contiguous `[T, H, 512]` outputs with int32 and int64 positions, head counts
/// of the served models (TP-split and full).
#[test]
fn matches_float64_reference() {
    let (mut rng, _) = seeded("matches_float64_reference");
    let ctx = Ctx::cpu(2);
    let mut checked = 0;
    for heads in [1, 3, 16, 64, 128] {
        for wide in [false, true] {
            let tokens = rng.random_range(1..24);
            checked += check_case(
                &ctx,
                &mut rng,
                Layout::contiguous(tokens, heads),
                heads,
                wide,
            );
        }
    }
    assert!(checked >= 10 * R);
}

/// Strided `x`: each head padded past 512 dims, a buffer with more heads than the
/// op rotates, and more tokens than `num_tokens`; the padding, the extra heads
/// and the extra tokens stay bit for bit.
#[test]
fn strided_x_leaves_everything_else_alone() {
    let (mut rng, _) = seeded("strided_x_leaves_everything_else_alone");
    let ctx = Ctx::cpu(2);
    let mut checked = 0;
    for wide in [false, true] {
        let heads = rng.random_range(1..20);
        let layout = Layout {
            tokens_cap: rng.random_range(2..16),
            heads_cap: heads + rng.random_range(0..3),
            head_stride: D + 4 * rng.random_range(1..40),
        };
        checked += check_case(&ctx, &mut rng, layout, heads, wide);
    }
    assert!(checked >= 2 * R);
}

/// RoPE (`rope::rope_row`, rounded to bf16 as the KV path stores it) followed by
/// the op gives back the original values up to the two bf16 roundings: each
/// moves a component by at most half an ulp of its binade, which is at most
/// twice the pair norm's, and the rotation between them keeps the error's
/// length, so 2.5 bf16 ulps of the pair norm bound the difference.
#[test]
fn undoes_rope() {
    let (mut rng, _) = seeded("undoes_rope");
    let ctx = Ctx::cpu(2);
    let (tokens, heads, max_pos) = (37, 8, 70_000u32);
    let table = random_table(&mut rng, max_pos);
    let table_buf = Buf::new(&ctx, &table);
    let original = random_values(&mut rng, tokens * heads * D);
    let positions = random_positions(&mut rng, tokens, max_pos);
    let mut rotated = original.clone();
    for (t, &p) in positions.iter().enumerate() {
        let cs = &table[p as usize * R..][..R];
        for row in rotated[t * heads * D..][..heads * D].chunks_exact_mut(D) {
            let mut v: Vec<f32> = row[NOPE..].iter().map(|x| x.to_f32()).collect();
            rope_row(&mut v, cs);
            for (x, y) in row[NOPE..].iter_mut().zip(v) {
                *x = bf16::from_f32(y);
            }
        }
    }
    let x = Buf::new(&ctx, &rotated);
    let pos = Buf::new(&ctx, &positions);
    let a = args(
        Layout::contiguous(tokens, heads).x(x.ptr, heads),
        vec1(pos.slice()),
        tensor(table_buf.slice(), &[max_pos as usize, R]),
        tokens,
        heads,
    );
    ok(run(&ctx, &a));
    let mut checked = 0;
    for (i, (got, want)) in x
        .slice()
        .chunks_exact(2)
        .zip(original.chunks_exact(2))
        .enumerate()
    {
        let dim = (2 * i) % D;
        if dim < NOPE {
            assert_eq!(bytes_of(got), bytes_of(want), "nope pair {i} changed");
            continue;
        }
        let norm = want[0].to_f64().hypot(want[1].to_f64());
        for k in 0..2 {
            let diff = (got[k].to_f64() - want[k].to_f64()).abs();
            assert!(
                diff <= 2.5 * bf16_ulp(norm),
                "pair {i}: got {} want {} (norm {norm:e})",
                got[k],
                want[k]
            );
            checked += 1;
        }
    }
    assert_eq!(checked, tokens * heads * R);
}

/// num_tokens = 0 is a no-op that reads no position.
#[test]
fn no_tokens_is_a_no_op() {
    let (mut rng, _) = seeded("no_tokens_is_a_no_op");
    let ctx = Ctx::cpu(1);
    let table = Buf::new(&ctx, &random_table(&mut rng, 4));
    let x = Buf::new(&ctx, &random_values(&mut rng, 2 * D));
    let before = x.slice().to_vec();
    let pos = Buf::new(&ctx, &[-5i32]);
    let a = args(
        Layout::contiguous(1, 2).x(x.ptr, 2),
        vec1(pos.slice()),
        tensor(table.slice(), &[4, R]),
        0,
        2,
    );
    ok(run(&ctx, &a));
    assert_eq!(bytes_of(x.slice()), bytes_of(&before));
}

/// Every bad argument gets its own status and a message naming it, and `x` is
/// left exactly as it was (positions are all checked before any head turns:
/// the bad one is the last token's).
#[test]
fn bad_input_leaves_x_unchanged() {
    let (mut rng, _) = seeded("bad_input_leaves_x_unchanged");
    let ctx = Ctx::cpu(2);
    let (tokens, heads, max_pos) = (4usize, 3usize, 16usize);
    let table = Buf::new(&ctx, &random_table(&mut rng, max_pos as u32));
    let x = Buf::new(&ctx, &random_values(&mut rng, tokens * heads * D + 8));
    let before = x.slice().to_vec();
    let pos32 = Buf::new(&ctx, &[3i32, 0, 15, 7]);
    let pos64 = Buf::new(&ctx, &[3i64, 0, 15, 7]);
    let layout = Layout::contiguous(tokens, heads);
    let good = args(
        layout.x(x.ptr, heads),
        vec1(pos32.slice()),
        tensor(table.slice(), &[max_pos, R]),
        tokens,
        heads,
    );
    let expect = |a: &unikv_inverse_rope_args, status, arg: &str| {
        fails(run(&ctx, a), status, arg);
        assert_eq!(
            bytes_of(x.slice()),
            bytes_of(&before),
            "x written by a failing call naming {arg}"
        );
    };
    let with = |f: &dyn Fn(&mut unikv_inverse_rope_args)| {
        let mut a = good;
        f(&mut a);
        a
    };

    // Dtypes.
    expect(
        &with(&|a| a.x.dtype = UNIKV_DTYPE_F16 as u32),
        UNIKV_BAD_DTYPE,
        "x",
    );
    expect(&with(&|a| a.x.dtype = 99), UNIKV_BAD_ENUM, "x.dtype");
    for dtype in [UNIKV_DTYPE_F32, UNIKV_DTYPE_U8, UNIKV_DTYPE_BF16] {
        expect(
            &with(&|a| a.positions.dtype = dtype as u32),
            UNIKV_BAD_DTYPE,
            "positions",
        );
    }
    expect(
        &with(&|a| a.rope_table.dtype = UNIKV_DTYPE_BF16 as u32),
        UNIKV_BAD_DTYPE,
        "rope_table",
    );
    // Shapes.
    expect(&with(&|a| a.x.ndim = 2), UNIKV_BAD_SHAPE, "x");
    expect(&with(&|a| a.x.shape[2] = NOPE as i64), UNIKV_BAD_SHAPE, "x");
    expect(&with(&|a| a.num_heads = 2), UNIKV_BAD_SHAPE, "x");
    expect(&with(&|a| a.num_tokens = 5), UNIKV_BAD_SHAPE, "x");
    expect(
        &with(&|a| a.num_heads = 0),
        UNIKV_INVALID_ARGUMENT,
        "num_heads",
    );
    expect(
        &with(&|a| a.positions.shape[0] = 3),
        UNIKV_BAD_SHAPE,
        "positions",
    );
    expect(
        &with(&|a| a.rope_table = tensor(table.slice(), &[2 * max_pos, R / 2])),
        UNIKV_BAD_SHAPE,
        "rope_table",
    );
    expect(
        &with(&|a| a.rope_table = tensor(table.slice(), &[max_pos * R])),
        UNIKV_BAD_SHAPE,
        "rope_table",
    );
    // Strides and alignment.
    expect(&with(&|a| a.x.strides[2] = 2), UNIKV_BAD_STRIDE, "x");
    expect(&with(&|a| a.x.strides[1] = 256), UNIKV_BAD_STRIDE, "x");
    expect(
        &with(&|a| a.x.data = unsafe { x.ptr.add(1) }.cast()),
        UNIKV_BAD_ALIGNMENT,
        "x",
    );
    expect(
        &with(&|a| {
            a.x.strides[1] = D as i64 + 2;
            a.x.strides[0] = heads as i64 * a.x.strides[1];
        }),
        UNIKV_BAD_ALIGNMENT,
        "x",
    );
    expect(
        &with(&|a| a.rope_table.data = unsafe { table.ptr.add(1) }.cast()),
        UNIKV_BAD_ALIGNMENT,
        "rope_table",
    );
    // Positions past the table or negative, as int32 and int64; an int64 past
    // 2^32 must not wrap onto a valid row.
    for (i, p) in [(3, 16i64), (3, -1), (1, (1 << 32) + 2)] {
        let mut bad = [3i64, 0, 15, 7];
        bad[i] = p;
        let bad64 = Buf::new(&ctx, &bad);
        expect(
            &with(&|a| a.positions = vec1(bad64.slice())),
            UNIKV_OUT_OF_RANGE,
            &format!("positions[{i}]"),
        );
        if let Ok(p32) = i32::try_from(p) {
            pos32.slice_mut()[i] = p32;
            expect(&good, UNIKV_OUT_OF_RANGE, &format!("positions[{i}]"));
            pos32.slice_mut().copy_from_slice(&[3, 0, 15, 7]);
        }
    }
    // NULL pointers and the struct size.
    expect(
        &with(&|a| a.x.data = ptr::null_mut()),
        UNIKV_NULL_ARGUMENT,
        "x",
    );
    expect(
        &with(&|a| a.positions.data = ptr::null_mut()),
        UNIKV_NULL_ARGUMENT,
        "positions",
    );
    expect(
        &with(&|a| a.rope_table.data = ptr::null_mut()),
        UNIKV_NULL_ARGUMENT,
        "rope_table",
    );
    expect(
        &with(&|a| a.struct_size = 8),
        UNIKV_BAD_STRUCT_SIZE,
        "args.struct_size",
    );
    fails(
        unsafe { unikv_inverse_rope(ctx.0, ptr::null(), ptr::null_mut()) },
        UNIKV_NULL_ARGUMENT,
        "args",
    );
    fails(
        unsafe { unikv_inverse_rope(ptr::null(), &good, ptr::null_mut()) },
        UNIKV_NULL_ARGUMENT,
        "ctx",
    );
    assert_eq!(bytes_of(x.slice()), bytes_of(&before));

    // The good arguments work, with either position width.
    ok(run(&ctx, &good));
    ok(run(&ctx, &with(&|a| a.positions = vec1(pos64.slice()))));
}
