//! `unikv_prepare_qkv` on the GPU against the CPU backend: bf16 outputs within
//! 1 bf16 ulp per element, FP8 codes within 1 code, scale and pad bytes exact,
//! and differences rare (the kernel follows the host's operation order, so only
//! a norm factor rounded differently can move an element).

use super::*;
use unikv::ffi::prepare::*;
use unikv::ffi::status::unikv_status;
use unikv::ffi::types::unikv_dtype;

const D: usize = 512;
const MAX_POS: usize = 4096;
/// Strided inputs and outputs (elements): `kv_in` is a slice of a fused
/// projection's rows, `kv_out` rows are padded, `q_in` has a padding head
/// per token, and `q_out` is heads 1..=H of H + 2.
const KV_IN_STRIDE: usize = 640;
const KV_IN_OFFSET: usize = 128;
const KV_OUT_STRIDE: usize = 576;

fn spec() -> PoolSpec {
    PoolSpec {
        ratios: vec![0],
        max_requests: 4,
        window: 128,
        spec_extra: 0,
        c128_blocks: 0,
    }
}

/// A compressed layer's table: base 40000 with YaRN.
fn table() -> Vec<f32> {
    rope_table(40_000.0, 16.0, MAX_POS as u32)
}

/// Host inputs of one call; `wide` picks i64 (else i32) positions and rows.
#[derive(Clone)]
struct Inputs {
    t: usize,
    h: usize,
    q_in: Vec<bf16>,
    kv_in: Vec<bf16>,
    weight: Vec<bf16>,
    table: Vec<f32>,
    positions: Vec<i64>,
    rows: Vec<i64>,
    wide: (bool, bool),
}

/// Random rows per token (scaled per row so eps matters in some), random
/// positions, distinct pool rows with every fifth token storing nothing.
fn inputs(rng: &mut impl Rng, t: usize, h: usize, pool_rows: usize, wide: (bool, bool)) -> Inputs {
    let mut scaled = |n: usize| -> Vec<bf16> {
        let scale = 2f32.powi(rng.random_range(-10..=6));
        random_bf16(rng, n)
            .into_iter()
            .map(|v| bf16::from_f32(v.to_f32() * scale))
            .collect()
    };
    let q_in = (0..t * (h + 1)).flat_map(|_| scaled(D)).collect();
    let kv_in = (0..t).flat_map(|_| scaled(KV_IN_STRIDE)).collect();
    let weight = random_bf16(rng, D)
        .into_iter()
        .map(|w| bf16::from_f32(1.0 + 0.5 * w.to_f32()))
        .collect();
    let mut all: Vec<i64> = (0..pool_rows as i64).collect();
    all.shuffle(rng);
    let rows = (0..t)
        .map(|i| if i % 5 == 4 { -1 } else { all[i] })
        .collect();
    let positions = (0..t)
        .map(|_| rng.random_range(0..MAX_POS as i64))
        .collect();
    Inputs {
        t,
        h,
        q_in,
        kv_in,
        weight,
        table: table(),
        positions,
        rows,
        wide,
    }
}

/// Everything a call may write, read back after it.
struct Outputs {
    q_out: Vec<bf16>,
    kv_out: Vec<bf16>,
    /// The layer's bf16 rows or FP8 nope rows, then (FP8) its rope rows.
    pool: Vec<u8>,
    rope: Vec<u8>,
}

fn ints<'a>(ctx: &'a Ctx, values: &[i64], wide: bool) -> Dev<'a> {
    if wide {
        Dev::upload(ctx, values)
    } else {
        Dev::upload(ctx, &values.iter().map(|&v| v as i32).collect::<Vec<_>>())
    }
}

fn int_t(d: &Dev, n: usize, wide: bool) -> unikv_tensor {
    if wide {
        d.t::<i64>(&[n])
    } else {
        d.t::<i32>(&[n])
    }
}

/// A descriptor `offset` elements into `d` with explicit strides.
fn strided<T: Dt>(d: &Dev, offset: usize, shape: &[usize], strides: &[usize]) -> unikv_tensor {
    let mut t = d.t::<T>(&[0]);
    t.data = unsafe { (d.ptr as *mut T).add(offset) }.cast();
    t.ndim = shape.len() as u32;
    for (axis, (&n, &s)) in shape.iter().zip(strides).enumerate() {
        t.shape[axis] = n as i64;
        t.strides[axis] = s as i64;
    }
    t
}

fn read_bytes(ctx: &Ctx, p: *mut c_void, n: u64) -> Vec<u8> {
    let mut out = vec![0u8; n as usize];
    if n > 0 {
        ok(unsafe {
            unikv_memory_copy(
                ctx.0,
                out.as_mut_ptr().cast(),
                p,
                n as usize,
                1,
                ptr::null_mut(),
            )
        });
    }
    ok(unsafe { unikv_stream_synchronize(ctx.0, ptr::null_mut()) });
    out
}

/// One call on `ctx` with poisoned outputs and pool layer.
fn run(ctx: &Ctx, pool: &Pool, inp: &Inputs) -> (unikv_status, Outputs) {
    let (t, h) = (inp.t, inp.h);
    let q_in = Dev::upload(ctx, &inp.q_in);
    let kv_in = Dev::upload(ctx, &inp.kv_in);
    let weight = Dev::upload(ctx, &inp.weight);
    let table = Dev::upload(ctx, &inp.table);
    let positions = ints(ctx, &inp.positions, inp.wide.0);
    let rows = ints(ctx, &inp.rows, inp.wide.1);
    let q_out = Dev::zeroed(ctx, t * (h + 2) * D * 2);
    let kv_out = Dev::zeroed(ctx, t * KV_OUT_STRIDE * 2);
    q_out.poison();
    kv_out.poison();
    poison_layer(ctx, pool, 0, POISON_BYTE);
    let args = unikv_prepare_qkv_args {
        struct_size: std::mem::size_of::<unikv_prepare_qkv_args>(),
        q_in: strided::<bf16>(&q_in, 0, &[t, h, D], &[(h + 1) * D, D, 1]),
        q_out: strided::<bf16>(&q_out, D, &[t, h, D], &[(h + 2) * D, D, 1]),
        kv_in: strided::<bf16>(&kv_in, KV_IN_OFFSET, &[t, D], &[KV_IN_STRIDE, 1]),
        kv_weight: weight.t::<bf16>(&[D]),
        kv_out: strided::<bf16>(&kv_out, 0, &[t, D], &[KV_OUT_STRIDE, 1]),
        rope_table: table.t::<f32>(&[MAX_POS, 64]),
        positions: int_t(&positions, t, inp.wide.0),
        rows: int_t(&rows, t, inp.wide.1),
        layer: 0,
        num_tokens: t as u32,
        num_heads: h as u32,
        q_eps: 1e-6,
        kv_eps: 1e-6,
        reserved: 0,
    };
    let status = unsafe { unikv_prepare_qkv(pool.0, &args, ptr::null_mut()) };
    let info = pool.layer(0);
    let out = Outputs {
        q_out: q_out.read(),
        kv_out: kv_out.read(),
        pool: read_bytes(ctx, info.data, info.bytes),
        rope: read_bytes(ctx, info.rope_data, info.rope_bytes),
    };
    (status, out)
}

/// Position of a bf16 value on the ordered line of bf16 values.
fn bf16_rank(bits: u16) -> i64 {
    let magnitude = i64::from(bits & 0x7FFF);
    if bits & 0x8000 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

fn fp8_rank(code: u8) -> i64 {
    let magnitude = i64::from(code & 0x7F);
    if code & 0x80 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

/// Compared elements, how many differ, and the largest difference in
/// ulps (bf16) or codes (FP8).
#[derive(Default)]
struct Diff {
    compared: usize,
    differ: usize,
    worst: i64,
}

impl Diff {
    fn add(&mut self, got: i64, want: i64) {
        self.compared += 1;
        let d = (got - want).abs();
        self.differ += usize::from(d != 0);
        self.worst = self.worst.max(d);
    }

    fn bf16s(&mut self, got: &[bf16], want: &[bf16]) {
        for (g, w) in got.iter().zip(want) {
            self.add(bf16_rank(g.to_bits()), bf16_rank(w.to_bits()));
        }
    }

    fn bf16_bytes(&mut self, got: &[u8], want: &[u8]) {
        for (g, w) in got.chunks_exact(2).zip(want.chunks_exact(2)) {
            let (g, w) = (
                u16::from_le_bytes([g[0], g[1]]),
                u16::from_le_bytes([w[0], w[1]]),
            );
            self.add(bf16_rank(g), bf16_rank(w));
        }
    }

    #[track_caller]
    fn check(&self, what: &str) {
        assert!(self.compared > 0, "{what}: nothing compared");
        assert!(self.worst <= 1, "{what}: a difference of {}", self.worst);
        assert!(
            self.differ * 1000 <= self.compared,
            "{what}: {} of {} elements differ",
            self.differ,
            self.compared
        );
    }
}

/// Compares the outputs of the tokens in `tokens` and the whole pool layer.
fn compare(inp: &Inputs, got: &Outputs, want: &Outputs, fp8: bool, tokens: &[usize], what: &str) {
    let (h, mut q, mut kv) = (inp.h, Diff::default(), Diff::default());
    for &t in tokens {
        // The padding heads too: they must stay poisoned on both.
        let span = t * (h + 2) * D..(t + 1) * (h + 2) * D;
        q.bf16s(&got.q_out[span.clone()], &want.q_out[span]);
        let span = t * KV_OUT_STRIDE..(t + 1) * KV_OUT_STRIDE;
        kv.bf16s(&got.kv_out[span.clone()], &want.kv_out[span]);
    }
    q.check(&format!("{what}: q_out"));
    kv.check(&format!("{what}: kv_out"));
    let mut pool = Diff::default();
    if !fp8 {
        pool.bf16_bytes(&got.pool, &want.pool);
        pool.check(&format!("{what}: bf16 pool"));
        return;
    }
    for (r, (g, w)) in got
        .pool
        .chunks_exact(512)
        .zip(want.pool.chunks_exact(512))
        .enumerate()
    {
        for (c, (&gc, &wc)) in g[..448].iter().zip(&w[..448]).enumerate() {
            assert!(
                (fp8_rank(gc) - fp8_rank(wc)).abs() <= 1,
                "{what}: row {r} code {c}: {gc:#04x} vs {wc:#04x}"
            );
            pool.add(fp8_rank(gc), fp8_rank(wc));
        }
        assert_eq!(g[448..], w[448..], "{what}: row {r} scale and pad bytes");
    }
    pool.check(&format!("{what}: FP8 codes"));
    let mut rope = Diff::default();
    rope.bf16_bytes(&got.rope, &want.rope);
    rope.check(&format!("{what}: FP8 pool rope rows"));
}

#[test]
fn matches_cpu() {
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    let (tokens, heads): (&[usize], &[usize]) = if small() {
        (&[1, 7, 33], &[1, 16])
    } else {
        (&[1, 7, 300], &[1, 16, 128])
    };
    let dtypes = [
        unikv_dtype::UNIKV_DTYPE_BF16,
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ,
    ];
    let mut case = 0;
    for dtype in dtypes {
        let (pc, pg) = (
            Pool::of(&s.cpu, &spec(), dtype),
            Pool::of(&s.gpu, &spec(), dtype),
        );
        let pool_rows = pc.layer(0).rows as usize;
        for &t in tokens {
            for &h in heads {
                // Every index width on every pool kind across the cases.
                let wide = (case % 2 == 0, case % 3 == 0);
                case += 1;
                let inp = inputs(&mut rng, t, h, pool_rows, wide);
                let (sc, want) = run(&s.cpu, &pc, &inp);
                let (sg, got) = run(&s.gpu, &pg, &inp);
                ok(sc);
                ok(sg);
                let what = format!("{dtype:?} T={t} H={h} wide={wide:?}");
                let all: Vec<usize> = (0..t).collect();
                compare(
                    &inp,
                    &got,
                    &want,
                    dtype != unikv_dtype::UNIKV_DTYPE_BF16,
                    &all,
                    &what,
                );
            }
        }
    }
}

/// Without `validate` the GPU writes nothing for a token whose position is
/// outside the table and skips a store to a row past the layer; with it,
/// the call fails as on the CPU with nothing written.
#[test]
fn skips_invalid_device_values() {
    let Some(s) = setup() else { return };
    let strict = validating_gpu();
    let mut rng = rand::rng();
    for dtype in [
        unikv_dtype::UNIKV_DTYPE_BF16,
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
    ] {
        let (pc, pg, ps) = (
            Pool::of(&s.cpu, &spec(), dtype),
            Pool::of(&s.gpu, &spec(), dtype),
            Pool::of(&strict, &spec(), dtype),
        );
        let pool_rows = pc.layer(0).rows as usize;
        let mut bad = inputs(&mut rng, 6, 16, pool_rows, (true, false));
        bad.positions[1] = MAX_POS as i64;
        bad.positions[3] = -1;
        bad.rows[4] = pool_rows as i64;
        let (status, got) = run(&s.gpu, &pg, &bad);
        ok(status);
        // The CPU oracle: valid positions for tokens 1 and 3 (compared
        // nowhere), and no stores for tokens 1, 3 and 4.
        let mut fixed = bad.clone();
        for t in [1, 3] {
            fixed.positions[t] = 0;
        }
        for t in [1, 3, 4] {
            fixed.rows[t] = -1;
        }
        let (status, want) = run(&s.cpu, &pc, &fixed);
        ok(status);
        let fp8 = dtype != unikv_dtype::UNIKV_DTYPE_BF16;
        compare(
            &fixed,
            &got,
            &want,
            fp8,
            &[0, 2, 4, 5],
            &format!("{dtype:?}"),
        );
        for t in [1, 3] {
            let q = &got.q_out[t * (bad.h + 2) * D..(t + 1) * (bad.h + 2) * D];
            let kv = &got.kv_out[t * KV_OUT_STRIDE..(t + 1) * KV_OUT_STRIDE];
            assert!(
                bytes_of(q)
                    .iter()
                    .chain(&bytes_of(kv))
                    .all(|&b| b == POISON_BYTE),
                "{dtype:?}: token {t} with an invalid position was written"
            );
        }
        let (status, strict_out) = run(&strict, &ps, &bad);
        fails(status, UNIKV_OUT_OF_RANGE, "positions[1]");
        for bytes in [
            bytes_of(&strict_out.q_out),
            bytes_of(&strict_out.kv_out),
            strict_out.pool,
            strict_out.rope,
        ] {
            assert!(
                bytes.iter().all(|&b| b == POISON_BYTE),
                "{dtype:?}: validate mode wrote"
            );
        }
    }
}

/// `unikv_prepare_qkv_indexer_q` on the GPU (one launch) writes what
/// `unikv_prepare_qkv` then `unikv_indexer_prepare_q` write there, byte for
/// byte, on bf16 and FP8 pools, and its query codes and weights are the CPU
/// backend's (the query kernel is bit-exact). Under `validate` a query
/// position past its table is OUT_OF_RANGE with nothing written.
#[test]
fn fused_with_the_indexer_query_matches_the_two_calls() {
    use common::indexer::{untouched, FusedPrepare};
    let Some(s) = setup() else { return };
    let (mut rng, _) = seeded("fused_with_the_indexer_query_matches_the_two_calls");
    let strict = validating_gpu();
    for dtype in [
        unikv_dtype::UNIKV_DTYPE_BF16,
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
    ] {
        let (gpu_pool, cpu_pool) = (
            Pool::of(&s.gpu, &spec(), dtype),
            Pool::of(&s.cpu, &spec(), dtype),
        );
        let rows = gpu_pool.layer(0).rows as usize;
        for &(t, h, ih) in &[(1, 64, 64), (4, 128, 64), (33, 16, 8)] {
            let what = format!("{dtype:?} T={t} H={h} indexer heads {ih}");
            let case = FusedPrepare::random(&mut rng, t, h, ih, rows);
            let (status, fused) = case.run(&s.gpu, &gpu_pool, true, |_, _| {});
            ok(status);
            let (status, apart) = case.run(&s.gpu, &gpu_pool, false, |_, _| {});
            ok(status);
            assert!(fused == apart, "{what}: fused and apart differ");
            let (status, cpu) = case.run(&s.cpu, &cpu_pool, true, |_, _| {});
            ok(status);
            assert!(
                fused[3..] == cpu[3..],
                "{what}: query outputs differ from the CPU's"
            );
        }
        let strict_pool = Pool::of(&strict, &spec(), dtype);
        let mut bad = FusedPrepare::random(&mut rng, 3, 8, 8, rows);
        bad.query.positions[2] = bad.query.max_pos as i64;
        let (status, out) = bad.run(&strict, &strict_pool, true, |_, _| {});
        fails(status, UNIKV_OUT_OF_RANGE, "positions[2]");
        assert!(untouched(&out), "{dtype:?}: validate wrote");
    }
}
