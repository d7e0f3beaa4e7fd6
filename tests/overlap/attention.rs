//! Attention: decode, prefill, merge, inverse RoPE.

use super::*;

fn plan_params() -> unikv_attention_plan_params {
    let bf = unikv_dtype::UNIKV_DTYPE_BF16 as u32;
    unikv_attention_plan_params {
        struct_size: size_of::<unikv_attention_plan_params>(),
        max_tokens: T as u32,
        num_heads: H as u32,
        head_dim: D as u32,
        q_dtype: bf,
        kv_dtype: bf,
        out_dtype: bf,
        kv_layout: 0,
        reserved: 0,
    }
}

/// Where an attention case keeps its tensors: q head-padded as in the
/// prepare cases, then the outputs and the streams (token 0: pool rows 0..3,
/// token 1: rows 3..5; prefill's extend stream: token 0 rows 0 and 1 of
/// `extend`, token 1 none).
struct AttentionCase {
    arena: Arena,
    q: usize,
    out: usize,
    lse: usize,
    sink: usize,
    indices: usize,
    indptr: usize,
    extend: usize,
    extend_indptr: usize,
}

impl AttentionCase {
    fn new(rng: &mut StdRng, pool: &Pool) -> Self {
        let rows = pool.layer(0).rows as usize;
        pool.rows_mut(0)
            .copy_from_slice(&random_bf16(rng, rows * D));
        let mut r = Regions::default();
        let q = r.take(T * (H + 1) * D * 2);
        let (out, lse, sink) = (r.take(T * H * D * 2), r.take(T * H * 4), r.take(H * 4));
        let (indices, indptr) = (r.take(5 * 4), r.take(3 * 4));
        let (extend, extend_indptr) = (r.take(2 * D * 2), r.take(3 * 4));
        let mut arena = Arena::new(&r);
        arena.write_rows(q, (H + 1) * D, H * D, &random_bf16(rng, T * H * D));
        arena.write(sink, &[0.5f32, -1.0]);
        arena.write(indices, &[0i32, 1, 2, 3, 4]);
        arena.write(indptr, &[0i32, 3, 5]);
        arena.write(extend, &random_bf16(rng, 2 * D));
        arena.write(extend_indptr, &[0i32, 2, 2]);
        AttentionCase {
            arena,
            q,
            out,
            lse,
            sink,
            indices,
            indptr,
            extend,
            extend_indptr,
        }
    }

    fn q(&self) -> unikv_tensor {
        self.arena.strided::<bf16>(self.q, &[T, H, D], &Q_STRIDES)
    }

    fn decode_args(&self) -> unikv_decode_args {
        let a = &self.arena;
        unikv_decode_args {
            struct_size: size_of::<unikv_decode_args>(),
            q: self.q(),
            indices: a.t::<i32>(self.indices, &[5]),
            indptr: a.t::<i32>(self.indptr, &[3]),
            sink: a.t::<f32>(self.sink, &[H]),
            out: a.t::<bf16>(self.out, &[T, H, D]),
            lse: a.t::<f32>(self.lse, &[T, H]),
            layer: 0,
            num_tokens: T as u32,
            softmax_scale: 0.05,
            reserved: 0,
            rope_table: absent(),
            positions: absent(),
            kv: Default::default(),
            extra_kv: Default::default(),
            extra_indices: Default::default(),
            extra_indptr: Default::default(),
        }
    }

    /// Decode's streams as the prefix, and the extend stream.
    fn prefill_args(&self) -> unikv_prefill_args {
        let d = self.decode_args();
        let a = &self.arena;
        unikv_prefill_args {
            struct_size: size_of::<unikv_prefill_args>(),
            q: d.q,
            indices: d.indices,
            indptr: d.indptr,
            sink: d.sink,
            out: d.out,
            lse: d.lse,
            extend_kv: a.t::<bf16>(self.extend, &[2, D]),
            extend_indices: a.t::<i32>(self.indices, &[2]),
            extend_indptr: a.t::<i32>(self.extend_indptr, &[3]),
            layer: 0,
            num_tokens: T as u32,
            softmax_scale: 0.05,
            reserved: 0,
            kv: Default::default(),
            extend_cache: Default::default(),
        }
    }

    /// Token t's output heads as computed out of place.
    fn out_of_place(&self, t: usize) -> Vec<u8> {
        self.arena.region(self.out + t * H * D * 2, H * D * 2)
    }

    /// Token t's heads of the q region (the output when run in place).
    fn in_place(&self, t: usize) -> Vec<u8> {
        self.arena.region(self.q + t * (H + 1) * D * 2, H * D * 2)
    }
}

/// Decode's `out` may be `q` itself: the same bytes and LSE as out of place.
/// `out` one head further, `lse` inside `q`, or `out` inside the pool rows
/// the call reads are refused.
#[test]
fn sparse_decode_out_may_be_q_exactly() {
    let (mut rng, _) = seeded("sparse_decode_out_may_be_q_exactly");
    let ctx = Ctx::cpu(2);
    let pool = dense_pool(&ctx, unikv_dtype::UNIKV_DTYPE_BF16);
    let mut plan = ptr::null_mut();
    ok(unsafe { unikv_decode_plan_create(ctx.0, &plan_params(), &mut plan) });
    let c = AttentionCase::new(&mut rng, &pool);
    let run = |args: unikv_decode_args| unsafe {
        unikv_sparse_decode(plan, pool.0, &args, ptr::null_mut(), 0, ptr::null_mut())
    };
    let read = Some((&pool, 0));

    let shifted = c.arena.strided::<bf16>(c.q + D * 2, &[T, H, D], &Q_STRIDES);
    refused_unchanged(
        &c.arena,
        read,
        || {
            run(unikv_decode_args {
                out: shifted,
                ..c.decode_args()
            })
        },
        "out",
        "q (partially; in-place use must be exact",
    );
    let lse = c.arena.t::<f32>(c.q + D * 2 + 64, &[T, H]);
    refused_unchanged(
        &c.arena,
        read,
        || {
            run(unikv_decode_args {
                lse,
                ..c.decode_args()
            })
        },
        "lse",
        "q (partially; exact in-place use is not supported",
    );
    let out = desc::<bf16>(pool.layer(0).data, &[T, H, D], &[H * D, D, 1]);
    refused_unchanged(
        &c.arena,
        read,
        || {
            run(unikv_decode_args {
                out,
                ..c.decode_args()
            })
        },
        "out",
        "the pool's rows of layer 0, which this operation reads",
    );

    ok(run(c.decode_args()));
    let lse_apart = c.arena.region(c.lse, T * H * 4);
    let in_place = unikv_decode_args {
        out: c.q(),
        ..c.decode_args()
    };
    ok(run(in_place));
    for t in 0..T {
        assert_eq!(c.in_place(t), c.out_of_place(t), "token {t}");
    }
    assert_eq!(c.arena.region(c.lse, T * H * 4), lse_apart);
    unsafe { unikv_decode_plan_destroy(plan) };
}

/// Prefill likewise, and its extend rows are an input `out` may not overlap.
#[test]
fn sparse_prefill_out_may_be_q_exactly() {
    let (mut rng, _) = seeded("sparse_prefill_out_may_be_q_exactly");
    let ctx = Ctx::cpu(2);
    let pool = dense_pool(&ctx, unikv_dtype::UNIKV_DTYPE_BF16);
    let mut plan = ptr::null_mut();
    ok(unsafe { unikv_prefill_plan_create(ctx.0, &plan_params(), &mut plan) });
    let c = AttentionCase::new(&mut rng, &pool);
    let run = |args: unikv_prefill_args| unsafe {
        unikv_sparse_prefill(plan, pool.0, &args, ptr::null_mut(), 0, ptr::null_mut())
    };
    let read = Some((&pool, 0));

    let extend_kv = c.arena.t::<bf16>(c.out + 1024, &[2, D]);
    refused_unchanged(
        &c.arena,
        read,
        || {
            run(unikv_prefill_args {
                extend_kv,
                ..c.prefill_args()
            })
        },
        "out",
        "extend_kv",
    );
    let shifted = c.arena.strided::<bf16>(c.q + D * 2, &[T, H, D], &Q_STRIDES);
    refused_unchanged(
        &c.arena,
        read,
        || {
            run(unikv_prefill_args {
                out: shifted,
                ..c.prefill_args()
            })
        },
        "out",
        "q (partially",
    );

    ok(run(c.prefill_args()));
    let in_place = unikv_prefill_args {
        out: c.q(),
        ..c.prefill_args()
    };
    ok(run(in_place));
    for t in 0..T {
        assert_eq!(c.in_place(t), c.out_of_place(t), "token {t}");
    }
    unsafe { unikv_prefill_plan_destroy(plan) };
}

/// Merge has no in-place use: an output that is one part of its input is
/// refused.
#[test]
fn merge_refuses_outputs_inside_the_parts() {
    let (mut rng, _) = seeded("merge_refuses_outputs_inside_the_parts");
    let ctx = Ctx::cpu(1);
    let (p, t, h) = (2, 1, 2);
    let mut r = Regions::default();
    let (parts_out, parts_lse) = (r.take(p * t * h * D * 2), r.take(p * t * h * 4));
    let (out, lse) = (r.take(t * h * D * 2), r.take(t * h * 4));
    let mut a = Arena::new(&r);
    a.write(parts_out, &random_bf16(&mut rng, p * t * h * D));
    a.write(parts_lse, &[1.0f32, 2.0, 0.5, -1.0]);
    let args = unikv_merge_args {
        struct_size: size_of::<unikv_merge_args>(),
        parts_out: a.t::<bf16>(parts_out, &[p, t, h, D]),
        parts_lse: a.t::<f32>(parts_lse, &[p, t, h]),
        sink: absent(),
        out: a.t::<bf16>(out, &[t, h, D]),
        lse: a.t::<f32>(lse, &[t, h]),
        num_tokens: t as u32,
        reserved: 0,
    };
    let run =
        |args: unikv_merge_args| unsafe { unikv_attention_merge(ctx.0, &args, ptr::null_mut()) };
    let part0 = a.t::<bf16>(parts_out, &[t, h, D]);
    refused_unchanged(
        &a,
        None,
        || run(unikv_merge_args { out: part0, ..args }),
        "out",
        "parts_out (partially",
    );
    let lse1 = a.t::<f32>(parts_lse + t * h * 4, &[t, h]);
    refused_unchanged(
        &a,
        None,
        || run(unikv_merge_args { lse: lse1, ..args }),
        "lse",
        "parts_lse",
    );
    ok(run(args));
}

#[test]
fn inverse_rope_refuses_inputs_inside_x() {
    let (mut rng, _) = seeded("inverse_rope_refuses_inputs_inside_x");
    let ctx = Ctx::cpu(1);
    let mut r = Regions::default();
    let (x, positions, table) = (
        r.take(T * H * D * 2),
        r.take(T * 4),
        r.take(MAX_POS * 64 * 4),
    );
    let mut a = Arena::new(&r);
    a.write(x, &random_bf16(&mut rng, T * H * D));
    a.write(positions, &[1i32, 6]);
    a.write(table, &rope_table(10000.0, 0.0, MAX_POS as u32));
    let args = unikv_inverse_rope_args {
        struct_size: size_of::<unikv_inverse_rope_args>(),
        x: a.t::<bf16>(x, &[T, H, D]),
        positions: a.t::<i32>(positions, &[T]),
        rope_table: a.t::<f32>(table, &[MAX_POS, 64]),
        num_tokens: T as u32,
        num_heads: H as u32,
    };
    let run = |args: unikv_inverse_rope_args| unsafe {
        unikv_inverse_rope(ctx.0, &args, ptr::null_mut())
    };
    // Inside the nope dims, which the op never writes: still refused.
    let rope_table = a.t::<f32>(x + 32, &[MAX_POS, 64]);
    refused_unchanged(
        &a,
        None,
        || run(unikv_inverse_rope_args { rope_table, ..args }),
        "x",
        "rope_table",
    );
    let positions = a.t::<i32>(x + 2000, &[T]);
    refused_unchanged(
        &a,
        None,
        || run(unikv_inverse_rope_args { positions, ..args }),
        "x",
        "positions",
    );
    ok(run(args));
}
