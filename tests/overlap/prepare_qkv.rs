//! unikv_prepare_qkv: overlapping outputs refused, exact in-place use, and
//! disjoint column slices accepted.

use super::*;

/// Where a prepare case keeps its tensors. Q heads sit in a head-padded
/// `[T, H + 1, 512]` region, so a view one head further stays inside it.
struct PrepareAt {
    q: usize,
    kv: usize,
    weight: usize,
    table: usize,
    positions: usize,
    rows: usize,
    q_out: usize,
    kv_out: usize,
}

struct PrepareCase {
    arena: Arena,
    at: PrepareAt,
}

impl PrepareCase {
    fn new(rng: &mut StdRng) -> Self {
        let mut r = Regions::default();
        let at = PrepareAt {
            q: r.take(T * (H + 1) * D * 2),
            kv: r.take(T * D * 2),
            weight: r.take(D * 2),
            table: r.take(MAX_POS * 64 * 4),
            positions: r.take(T * 4),
            rows: r.take(T * 4),
            q_out: r.take(T * H * D * 2),
            kv_out: r.take(T * D * 2),
        };
        let mut arena = Arena::new(&r);
        arena.write_rows(at.q, (H + 1) * D, H * D, &random_bf16(rng, T * H * D));
        arena.write(at.kv, &random_bf16(rng, T * D));
        arena.write(at.weight, &random_bf16(rng, D));
        arena.write(at.table, &rope_table(10000.0, 0.0, MAX_POS as u32));
        arena.write(at.positions, &[3i32, 5]);
        arena.write(at.rows, &[0i32, 1]);
        PrepareCase { arena, at }
    }

    fn q_in(&self) -> unikv_tensor {
        self.arena
            .strided::<bf16>(self.at.q, &[T, H, D], &Q_STRIDES)
    }

    fn kv_in(&self) -> unikv_tensor {
        self.arena.t::<bf16>(self.at.kv, &[T, D])
    }

    /// Separate outputs; token t stores into pool row t of layer 0.
    fn args(&self) -> unikv_prepare_qkv_args {
        let a = &self.arena;
        unikv_prepare_qkv_args {
            struct_size: size_of::<unikv_prepare_qkv_args>(),
            q_in: self.q_in(),
            q_out: a.t::<bf16>(self.at.q_out, &[T, H, D]),
            kv_in: self.kv_in(),
            kv_weight: a.t::<bf16>(self.at.weight, &[D]),
            kv_out: a.t::<bf16>(self.at.kv_out, &[T, D]),
            rope_table: a.t::<f32>(self.at.table, &[MAX_POS, 64]),
            positions: a.t::<i32>(self.at.positions, &[T]),
            rows: a.t::<i32>(self.at.rows, &[T]),
            layer: 0,
            num_tokens: T as u32,
            num_heads: H as u32,
            q_eps: 1e-6,
            kv_eps: 1e-6,
            reserved: 0,
        }
    }
}

fn prepare(pool: &Pool, args: &unikv_prepare_qkv_args) -> unikv_status {
    unsafe { unikv_prepare_qkv(pool.0, args, ptr::null_mut()) }
}

/// The case: `q_out` one head after `q_in` used to return OK with a
/// wrong output (head h's result overwrote head h + 1's input before it was
/// read). Other partial overlaps, and tensors inside the pool rows the call
/// writes, are refused too.
#[test]
fn prepare_qkv_refuses_q_out_one_head_after_q_in() {
    let (mut rng, _) = seeded("prepare_qkv_refuses_q_out_one_head_after_q_in");
    let ctx = Ctx::cpu(2);
    let pool = dense_pool(&ctx, unikv_dtype::UNIKV_DTYPE_BF16);
    let c = PrepareCase::new(&mut rng);
    let run = |args: unikv_prepare_qkv_args| prepare(&pool, &args);
    let written = Some((&pool, 0));

    let mut args = c.args();
    args.q_out = c
        .arena
        .strided::<bf16>(c.at.q + D * 2, &[T, H, D], &Q_STRIDES);
    refused_unchanged(&c.arena, written, || run(args), "q_out", "q_in (partially");

    let mut args = c.args();
    args.kv_out = c.arena.t::<bf16>(c.at.kv + 16, &[T, D]);
    refused_unchanged(&c.arena, written, || run(args), "kv_out", "kv_in");

    // kv_in inside the pool rows the call writes; fine when `rows` is absent.
    let layer = pool.layer(0);
    let mut args = c.args();
    args.kv_in = desc::<bf16>(layer.data, &[T, D], &[D, 1]);
    refused_unchanged(
        &c.arena,
        written,
        || run(args),
        "kv_in",
        "the pool's rows of layer 0, which this operation writes",
    );
    // positions inside kv_out, and q_out inside the pool rows.
    let mut args = c.args();
    args.positions = c.arena.t::<i32>(c.at.kv_out + 64, &[T]);
    refused_unchanged(&c.arena, written, || run(args), "kv_out", "positions");
    let mut args = c.args();
    args.q_out = desc::<bf16>(layer.data, &[T, H, D], &[H * D, D, 1]);
    refused_unchanged(
        &c.arena,
        written,
        || run(args),
        "q_out",
        "the pool's rows of layer 0",
    );

    let mut args = c.args();
    args.kv_in = desc::<bf16>(layer.data, &[T, D], &[D, 1]);
    args.rows = absent();
    ok(prepare(&pool, &args));
}

/// `q_out` may be `q_in` and `kv_out` may be `kv_in` exactly: the same bytes
/// as separate outputs. The same data with other strides is refused.
#[test]
fn prepare_qkv_in_place_is_exact_only() {
    let (mut rng, seed) = seeded("prepare_qkv_in_place_is_exact_only");
    let ctx = Ctx::cpu(2);
    let pool = dense_pool(&ctx, unikv_dtype::UNIKV_DTYPE_BF16);
    let apart = PrepareCase::new(&mut rng);
    ok(prepare(&pool, &apart.args()));
    let pool_apart = bytes_of(pool.rows_mut(0));

    let mut again = rand::SeedableRng::seed_from_u64(seed);
    let c = PrepareCase::new(&mut again);
    let mut args = c.args();
    args.q_out = args.q_in;
    args.kv_out = args.kv_in;
    pool.rows_mut(0).fill(bf16::ZERO);
    ok(prepare(&pool, &args));
    assert_eq!(bytes_of(pool.rows_mut(0)), pool_apart);
    for t in 0..T {
        assert_eq!(
            c.arena.region(c.at.q + t * (H + 1) * D * 2, H * D * 2),
            apart
                .arena
                .region(apart.at.q_out + t * H * D * 2, H * D * 2),
            "q token {t}"
        );
    }
    assert_eq!(
        c.arena.region(c.at.kv, T * D * 2),
        apart.arena.region(apart.at.kv_out, T * D * 2)
    );

    // The same data pointer with another token stride is a partial overlap.
    let mut args = c.args();
    args.q_out = c.arena.strided::<bf16>(c.at.q, &[T, H, D], &[H * D, D, 1]);
    refused_unchanged(
        &c.arena,
        Some((&pool, 0)),
        || prepare(&pool, &args),
        "q_out",
        "q_in (partially; in-place use must be exact",
    );
}

/// Q and KV as interleaved column slices of one fused `[T, 3 * 512]` buffer,
/// inputs and outputs alike, share no byte: accepted, with the results of
/// separate buffers. Moving `kv_out` 8 columns into `q_out` is refused.
#[test]
fn column_slices_of_one_buffer_are_accepted() {
    let (mut rng, _) = seeded("column_slices_of_one_buffer_are_accepted");
    let ctx = Ctx::cpu(2);
    let pool = dense_pool(&ctx, unikv_dtype::UNIKV_DTYPE_BF16);
    let apart = PrepareCase::new(&mut rng);
    let mut args = apart.args();
    args.rows = absent();
    ok(prepare(&pool, &args));

    let width = (H + 1) * D;
    let mut r = Regions::default();
    let (fused_in, fused_out) = (r.take(T * width * 2), r.take(T * width * 2));
    let mut f = Arena::new(&r);
    // The same inputs: apart's q heads and kv rows, token by token.
    for t in 0..T {
        let q = apart.arena.region(apart.at.q + t * width * 2, H * D * 2);
        f.write(fused_in + t * width * 2, &q);
        let kv = apart.arena.region(apart.at.kv + t * D * 2, D * 2);
        f.write(fused_in + (t * width + H * D) * 2, &kv);
    }
    let q_slice = |at| f.strided::<bf16>(at, &[T, H, D], &[width, D, 1]);
    let kv_slice = |at| f.strided::<bf16>(at + H * D * 2, &[T, D], &[width, 1]);
    let fused = unikv_prepare_qkv_args {
        q_in: q_slice(fused_in),
        kv_in: kv_slice(fused_in),
        q_out: q_slice(fused_out),
        kv_out: kv_slice(fused_out),
        ..args
    };
    ok(prepare(&pool, &fused));
    for t in 0..T {
        let row = f.region(fused_out + t * width * 2, width * 2);
        let q = apart
            .arena
            .region(apart.at.q_out + t * H * D * 2, H * D * 2);
        let kv = apart.arena.region(apart.at.kv_out + t * D * 2, D * 2);
        assert_eq!(row, [q, kv].concat(), "token {t}");
    }

    let shifted = unikv_prepare_qkv_args {
        kv_out: f.strided::<bf16>(fused_out + (H * D - 8) * 2, &[T, D], &[width, 1]),
        ..fused
    };
    refused_unchanged(&f, None, || prepare(&pool, &shifted), "q_out", "kv_out");
}
