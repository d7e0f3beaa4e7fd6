//! Sparse attention (decode and prefill) on the GPU against the CPU backend:
//! random cases, run on both backends, and the checks the submodules share.

mod decode;
mod fp8;
mod portable;
mod prefill;

use super::*;

/// Host inputs of one attention call.
#[derive(Clone)]
struct AttnCase {
    t: usize,
    h: usize,
    q: Vec<bf16>,
    indices: Vec<i32>,
    indptr: Vec<i32>,
    sink: Option<Vec<f32>>,
    scale: f32,
    extend_kv: Vec<bf16>,
    extend_indices: Vec<i32>,
    extend_indptr: Vec<i32>,
    /// Decode's inverse-RoPE epilogue: `[max_pos, 64]` table and int64 positions.
    rope: Option<(Vec<f32>, Vec<i64>)>,
    /// Write the output over `q` (exact in-place use).
    in_place: bool,
}

fn random_lengths(rng: &mut impl Rng, t: usize, max: usize) -> Vec<usize> {
    let menu = [0usize, 1, 2, 17, 64, 65, 128, 640, 1152, 2300];
    let mut lens: Vec<usize> = (0..t)
        .map(|_| *menu.choose(rng).unwrap())
        .map(|l| l.min(max))
        .collect();
    // Every batch of more than a few tokens holds 0, 1 and the longest.
    if t >= 3 {
        lens[0] = 0;
        lens[1] = 1;
        lens[2] = max.min(2300);
    }
    lens
}

fn random_case(rng: &mut impl Rng, t: usize, h: usize, rows: usize, prefill: bool) -> AttnCase {
    let max = if small() { 300 } else { 2300 };
    let lens = random_lengths(rng, t, max.min(rows));
    let mut indices = vec![];
    let mut indptr = vec![0i32];
    let mut all: Vec<i32> = (0..rows as i32).collect();
    for &l in &lens {
        all.shuffle(rng);
        indices.extend(all[..l].iter().map(|&r| {
            if prefill && rng.random_bool(0.05) {
                -1
            } else {
                r
            }
        }));
        indptr.push(indices.len() as i32);
    }
    let ext_rows = if prefill { 300 } else { 0 };
    let mut extend_indices = vec![];
    let mut extend_indptr = vec![0i32];
    if prefill {
        for _ in 0..t {
            let l = rng.random_range(0..=128usize);
            for _ in 0..l {
                extend_indices.push(if rng.random_bool(0.05) {
                    -1
                } else {
                    rng.random_range(0..ext_rows as i32)
                });
            }
            extend_indptr.push(extend_indices.len() as i32);
        }
    }
    AttnCase {
        t,
        h,
        q: random_bf16(rng, t * h * 512),
        indices,
        indptr,
        sink: rng
            .random_bool(0.7)
            .then(|| (0..h).map(|_| rng.random_range(-2.0f32..4.0)).collect()),
        scale: 1.0 / (512f32).sqrt() * rng.random_range(0.5f32..2.0),
        extend_kv: random_bf16(rng, ext_rows * 512),
        extend_indices,
        extend_indptr,
        rope: None,
        in_place: false,
    }
}

/// Runs one attention call on `ctx` and returns (out, lse).
fn run_attention(
    ctx: &Ctx,
    pool: &Pool,
    layer: u32,
    c: &AttnCase,
    plan: &Plan,
) -> (Vec<bf16>, Vec<f32>) {
    let prefill = !plan.decode;
    let q = Dev::upload(ctx, &c.q);
    let idx = Dev::upload(
        ctx,
        &c.indices.iter().copied().chain([0]).collect::<Vec<_>>(),
    );
    let ptr_ = Dev::upload(ctx, &c.indptr);
    let sink = c.sink.as_ref().map(|s| Dev::upload(ctx, s));
    let apart = (!c.in_place).then(|| {
        let out = Dev::zeroed(ctx, c.t * c.h * 512 * 2);
        out.poison();
        out
    });
    let out = apart.as_ref().unwrap_or(&q);
    let lse = Dev::zeroed(ctx, c.t * c.h * 4);
    lse.poison();
    let n_idx = c.indices.len().max(1);
    if prefill {
        let ekv = Dev::upload(ctx, &c.extend_kv);
        let eidx = Dev::upload(
            ctx,
            &c.extend_indices
                .iter()
                .copied()
                .chain([0])
                .collect::<Vec<_>>(),
        );
        let eptr = Dev::upload(ctx, &c.extend_indptr);
        let args = unikv_prefill_args {
            struct_size: std::mem::size_of::<unikv_prefill_args>(),
            q: q.t::<bf16>(&[c.t, c.h, 512]),
            indices: idx.t::<i32>(&[n_idx]),
            indptr: ptr_.t::<i32>(&[c.t + 1]),
            sink: sink.as_ref().map_or(absent(), |s| s.t::<f32>(&[c.h])),
            out: out.t::<bf16>(&[c.t, c.h, 512]),
            lse: lse.t::<f32>(&[c.t, c.h]),
            extend_kv: ekv.t::<bf16>(&[c.extend_kv.len() / 512, 512]),
            extend_indices: eidx.t::<i32>(&[c.extend_indices.len().max(1)]),
            extend_indptr: eptr.t::<i32>(&[c.t + 1]),
            layer,
            num_tokens: c.t as u32,
            softmax_scale: c.scale,
            reserved: 0,
            kv: Default::default(),
            extend_cache: Default::default(),
        };
        ok(unsafe {
            unikv_sparse_prefill(
                plan.handle.cast(),
                pool.0,
                &args,
                plan.ws_ptr(),
                plan.bytes,
                ptr::null_mut(),
            )
        });
    } else {
        let rope = c.rope.as_ref().map(|(table, pos)| {
            (
                Dev::upload(ctx, table),
                Dev::upload(ctx, pos),
                table.len() / 64,
            )
        });
        let args = unikv_decode_args {
            struct_size: std::mem::size_of::<unikv_decode_args>(),
            q: q.t::<bf16>(&[c.t, c.h, 512]),
            indices: idx.t::<i32>(&[n_idx]),
            indptr: ptr_.t::<i32>(&[c.t + 1]),
            sink: sink.as_ref().map_or(absent(), |s| s.t::<f32>(&[c.h])),
            out: out.t::<bf16>(&[c.t, c.h, 512]),
            lse: lse.t::<f32>(&[c.t, c.h]),
            layer,
            num_tokens: c.t as u32,
            softmax_scale: c.scale,
            reserved: 0,
            rope_table: rope.as_ref().map_or(absent(), |r| r.0.t::<f32>(&[r.2, 64])),
            positions: rope.as_ref().map_or(absent(), |r| r.1.t::<i64>(&[c.t])),
            kv: Default::default(),
            extra_kv: Default::default(),
            extra_indices: Default::default(),
            extra_indptr: Default::default(),
        };
        ok(unsafe {
            unikv_sparse_decode(
                plan.handle.cast(),
                pool.0,
                &args,
                plan.ws_ptr(),
                plan.bytes,
                ptr::null_mut(),
            )
        });
    }
    (out.read::<bf16>(), lse.read::<f32>())
}

fn attention_pools(s: &Setup, rng: &mut impl Rng) -> (Pool, Pool, usize) {
    attention_pools_of(s, rng, unikv_dtype::UNIKV_DTYPE_BF16)
}

/// Two pools (CPU, GPU) of `kv_dtype` rows holding the same random rows.
fn attention_pools_of(s: &Setup, rng: &mut impl Rng, kv_dtype: unikv_dtype) -> (Pool, Pool, usize) {
    let spec = PoolSpec {
        ratios: vec![0, 0],
        max_requests: 23,
        window: 128,
        spec_extra: 0,
        c128_blocks: 0,
    };
    let (pc, pg) = (
        Pool::of(&s.cpu, &spec, kv_dtype),
        Pool::of(&s.gpu, &spec, kv_dtype),
    );
    let rows = pc.layer(1).rows as usize;
    for layer in 0..2 {
        let data = random_bf16(rng, rows * 512);
        fill_layer(&s.cpu, &pc, layer, &data);
        fill_layer(&s.gpu, &pg, layer, &data);
    }
    (pc, pg, rows)
}

/// Decode of a fresh random case on the GPU against the CPU backend, and twice
/// on the GPU bitwise.
fn check_decode(s: &Setup, pc: &Pool, pg: &Pool, rows: usize, t: usize, h: usize, what: &str) {
    check_decode_case(
        s,
        pc,
        pg,
        &random_case(&mut rand::rng(), t, h, rows, false),
        what,
    );
}

/// Decode of case `c` on the GPU against the CPU backend, and twice on the
/// GPU bitwise.
fn check_decode_case(s: &Setup, pc: &Pool, pg: &Pool, c: &AttnCase, what: &str) {
    let (t, h) = (c.t, c.h);
    let kv = pc.info().kv_dtype;
    let cp = plan_kv(&s.cpu, true, t, h, kv);
    let gp = plan_kv(&s.gpu, true, t, h, kv);
    let want = run_attention(&s.cpu, pc, 1, c, &cp);
    let got = run_attention(&s.gpu, pg, 1, c, &gp);
    compare((c.t, c.h), &got, &want, &format!("{what} T={t} H={h}"));
    let again = run_attention(&s.gpu, pg, 1, c, &gp);
    assert_eq!(
        bytes_of(&got.0),
        bytes_of(&again.0),
        "{what} T={t} H={h}: not deterministic"
    );
}

/// A random prefill chunk (pool rows and the chunk's own rows), GPU against CPU.
fn check_prefill(
    s: &Setup,
    (pc, pg, rows): (&Pool, &Pool, usize),
    dtype: unikv_dtype,
    t: usize,
    h: usize,
    what: &str,
) {
    let c = random_case(&mut rand::rng(), t, h, rows, true);
    let want = run_attention(
        &s.cpu,
        pc,
        0,
        &c,
        &plan_kv(&s.cpu, false, t, h, dtype as u32),
    );
    let got = run_attention(
        &s.gpu,
        pg,
        0,
        &c,
        &plan_kv(&s.gpu, false, t, h, dtype as u32),
    );
    compare((c.t, c.h), &got, &want, what);
}

/// Decode with the inverse-RoPE epilogue at random positions, GPU against CPU.
fn check_rope_epilogue(
    s: &Setup,
    (pc, pg, rows): (&Pool, &Pool, usize),
    t: usize,
    h: usize,
    (table, max_pos): (&[f32], u32),
    what: &str,
) {
    let mut rng = rand::rng();
    let mut c = random_case(&mut rng, t, h, rows, false);
    let pos = (0..t)
        .map(|_| rng.random_range(0..i64::from(max_pos)))
        .collect();
    c.rope = Some((table.to_vec(), pos));
    let kv = pc.info().kv_dtype;
    let want = run_attention(&s.cpu, pc, 1, &c, &plan_kv(&s.cpu, true, t, h, kv));
    let got = run_attention(&s.gpu, pg, 1, &c, &plan_kv(&s.gpu, true, t, h, kv));
    compare((t, h), &got, &want, what);
}
