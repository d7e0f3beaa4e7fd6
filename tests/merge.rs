//! `unikv_attention_merge` against a float64 restatement of the merge, and
//! against decode over a whole slice (merge of per-part decodes without a sink).

mod common;

use std::ptr;

use common::*;
use half::bf16;
use rand::Rng;
use unikv::ffi::attention::*;

struct Parts {
    p: usize,
    t: usize,
    h: usize,
    out: Vec<bf16>,
    lse: Vec<f32>,
    sink: Option<Vec<f32>>,
}

fn merge(ctx: &Ctx, parts: &Parts, out: &[bf16], lse: &[f32]) -> unikv::ffi::status::unikv_status {
    let (p, t, h) = (parts.p, parts.t, parts.h);
    let args = unikv_merge_args {
        struct_size: std::mem::size_of::<unikv_merge_args>(),
        parts_out: tensor(&parts.out, &[p, t, h, 512]),
        parts_lse: tensor(&parts.lse, &[p, t, h]),
        sink: parts.sink.as_ref().map_or(absent(), |s| vec1(s)),
        out: tensor(out, &[t, h, 512]),
        lse: tensor(lse, &[t, h]),
        num_tokens: t as u32,
        reserved: 0,
    };
    unsafe { unikv_attention_merge(ctx.0, &args, ptr::null_mut()) }
}

/// The merge restated in float64.
fn reference(parts: &Parts, t: usize, h: usize) -> (Vec<f64>, f64) {
    let sink = parts
        .sink
        .as_ref()
        .map_or(f64::NEG_INFINITY, |s| s[h] as f64);
    let lse = |p: usize| parts.lse[(p * parts.t + t) * parts.h + h] as f64;
    let m = (0..parts.p).map(lse).fold(sink, f64::max);
    if m == f64::NEG_INFINITY {
        return (vec![0.0; 512], f64::NEG_INFINITY);
    }
    let mut den = (sink - m).exp();
    let mut acc = vec![0.0; 512];
    for p in 0..parts.p {
        if lse(p) == f64::NEG_INFINITY {
            continue;
        }
        let w = (lse(p) - m).exp();
        den += w;
        let row = &parts.out[((p * parts.t + t) * parts.h + h) * 512..][..512];
        for (a, x) in acc.iter_mut().zip(row) {
            *a += w * x.to_f64();
        }
    }
    (acc.iter().map(|a| a / den).collect(), m + den.ln())
}

#[test]
fn merge_matches_float64_reference() {
    let mut rng = rand::rng();
    let ctx = Ctx::cpu(0);
    for &(p, t, h, with_sink) in &[(1, 3, 8, true), (4, 5, 16, false), (7, 2, 128, true)] {
        let n = p * t * h;
        let mut lse: Vec<f32> = (0..n).map(|_| rng.random_range(-5.0f32..20.0)).collect();
        // Some empty parts, and one (token, head) empty in every part.
        for (i, l) in lse.iter_mut().enumerate() {
            if rng.random_bool(0.15) || i % (t * h) == 0 {
                *l = f32::NEG_INFINITY;
            }
        }
        let parts = Parts {
            p,
            t,
            h,
            out: random_bf16(&mut rng, n * 512),
            lse,
            sink: with_sink.then(|| (0..h).map(|_| rng.random_range(-2.0f32..8.0)).collect()),
        };
        let out: Vec<bf16> = poisoned(t * h * 512);
        let got_lse: Vec<f32> = poisoned(t * h);
        ok(merge(&ctx, &parts, &out, &got_lse));
        for ti in 0..t {
            for hi in 0..h {
                let (want, want_lse) = reference(&parts, ti, hi);
                let got = &out[(ti * h + hi) * 512..][..512];
                let norm = want.iter().map(|x| x * x).sum::<f64>().sqrt();
                let diff = got
                    .iter()
                    .zip(&want)
                    .map(|(g, w)| (g.to_f64() - w).powi(2))
                    .sum::<f64>()
                    .sqrt();
                if norm == 0.0 {
                    assert!(
                        got.iter().all(|x| x.to_f32() == 0.0),
                        "P={p} token {ti} head {hi}: zeros"
                    );
                } else {
                    assert!(
                        diff / norm < 1e-2,
                        "P={p} token {ti} head {hi}: relative error {}",
                        diff / norm
                    );
                }
                let gl = got_lse[ti * h + hi] as f64;
                if want_lse.is_infinite() {
                    assert_eq!(gl, want_lse);
                } else {
                    assert!(
                        (gl - want_lse).abs() < 1e-4 * want_lse.abs().max(1.0),
                        "lse {gl} vs {want_lse}"
                    );
                }
            }
        }
    }
}

/// Decode over a slice with the sink equals the merge of decodes over disjoint
/// parts of the slice run without a sink.
#[test]
fn merge_of_partial_decodes_equals_decode() {
    let mut rng = rand::rng();
    let ctx = Ctx::cpu(0);
    let pool = Pool::new(
        &ctx,
        &PoolSpec {
            ratios: vec![0],
            max_requests: 15,
            window: 128,
            spec_extra: 0,
            c128_blocks: 0,
        },
    );
    let rows = pool.layer(0).rows as usize;
    pool.rows_mut(0)
        .copy_from_slice(&random_bf16(&mut rng, rows * 512));
    let (t, h, len, p) = (2usize, 16usize, 900usize, 3usize);
    let q = random_bf16(&mut rng, t * h * 512);
    let sink: Vec<f32> = (0..h).map(|_| rng.random_range(-1.0f32..3.0)).collect();
    let keys: Vec<i32> = (0..t * len)
        .map(|_| rng.random_range(0..rows as i32))
        .collect();
    let params = unikv_attention_plan_params {
        struct_size: std::mem::size_of::<unikv_attention_plan_params>(),
        max_tokens: t as u32,
        num_heads: h as u32,
        head_dim: 512,
        q_dtype: 1,
        kv_dtype: 1,
        out_dtype: 1,
        kv_layout: 0,
        reserved: 0,
    };
    let mut plan = ptr::null_mut();
    ok(unsafe { unikv_decode_plan_create(ctx.0, &params, &mut plan) });
    let decode = |idx: &[i32], indptr: &[i32], sink: Option<&[f32]>, out: &[bf16], lse: &[f32]| {
        let args = unikv_decode_args {
            struct_size: std::mem::size_of::<unikv_decode_args>(),
            q: tensor(&q, &[t, h, 512]),
            indices: vec1(idx),
            indptr: vec1(indptr),
            sink: sink.map_or(absent(), vec1),
            out: tensor(out, &[t, h, 512]),
            lse: tensor(lse, &[t, h]),
            layer: 0,
            num_tokens: t as u32,
            softmax_scale: 0.05,
            reserved: 0,
            rope_table: absent(),
            positions: absent(),
            kv: Default::default(),
            extra_kv: Default::default(),
            extra_indices: Default::default(),
            extra_indptr: Default::default(),
        };
        ok(unsafe {
            unikv_sparse_decode(plan, pool.0, &args, ptr::null_mut(), 0, ptr::null_mut())
        });
    };
    let whole: Vec<bf16> = poisoned(t * h * 512);
    let whole_lse: Vec<f32> = poisoned(t * h);
    let indptr: Vec<i32> = (0..=t).map(|i| (i * len) as i32).collect();
    decode(&keys, &indptr, Some(&sink), &whole, &whole_lse);
    // Parts: uneven cuts of every token's slice, one of them empty for token 1.
    let cuts = [[0, 300, 301, 900], [0, 450, 450, 900]];
    let mut parts = Parts {
        p,
        t,
        h,
        out: vec![],
        lse: vec![],
        sink: Some(sink.clone()),
    };
    for part in 0..p {
        let mut idx = vec![];
        let mut ptr_ = vec![0i32];
        for (ti, cut) in cuts.iter().enumerate() {
            idx.extend_from_slice(&keys[ti * len + cut[part]..ti * len + cut[part + 1]]);
            ptr_.push(idx.len() as i32);
        }
        idx.push(0); // keep the index buffer non-empty
        let out: Vec<bf16> = poisoned(t * h * 512);
        let lse: Vec<f32> = poisoned(t * h);
        decode(&idx, &ptr_, None, &out, &lse);
        parts.out.extend(out);
        parts.lse.extend(lse);
    }
    let merged: Vec<bf16> = poisoned(t * h * 512);
    let merged_lse: Vec<f32> = poisoned(t * h);
    ok(merge(&ctx, &parts, &merged, &merged_lse));
    for row in 0..t * h {
        let (a, b) = (&merged[row * 512..][..512], &whole[row * 512..][..512]);
        let norm = b.iter().map(|x| x.to_f64().powi(2)).sum::<f64>().sqrt();
        let diff = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x.to_f64() - y.to_f64()).powi(2))
            .sum::<f64>()
            .sqrt();
        assert!(
            diff / norm < 1e-2,
            "row {row}: relative error {}",
            diff / norm
        );
        assert!((merged_lse[row] - whole_lse[row]).abs() < 1e-3 * whole_lse[row].abs().max(1.0));
    }
    unsafe { unikv_decode_plan_destroy(plan) };
}

#[test]
fn merge_rejects_bad_input() {
    let mut rng = rand::rng();
    let ctx = Ctx::cpu(1);
    let parts = Parts {
        p: 2,
        t: 1,
        h: 4,
        out: random_bf16(&mut rng, 2 * 4 * 512),
        lse: vec![0.5; 8],
        sink: None,
    };
    let out: Vec<bf16> = poisoned(4 * 512);
    let lse: Vec<f32> = poisoned(4);
    let good = unikv_merge_args {
        struct_size: std::mem::size_of::<unikv_merge_args>(),
        parts_out: tensor(&parts.out, &[2, 1, 4, 512]),
        parts_lse: tensor(&parts.lse, &[2, 1, 4]),
        sink: absent(),
        out: tensor(&out, &[1, 4, 512]),
        lse: tensor(&lse, &[1, 4]),
        num_tokens: 1,
        reserved: 0,
    };
    let three_heads = [0f32; 6];
    let cases = [
        (
            unikv_merge_args {
                parts_lse: tensor(&three_heads, &[2, 1, 3]),
                ..good
            },
            UNIKV_BAD_SHAPE,
            "parts_lse",
        ),
        (
            unikv_merge_args {
                out: tensor(&out[..3 * 512], &[1, 3, 512]),
                ..good
            },
            UNIKV_BAD_SHAPE,
            "out",
        ),
        (
            unikv_merge_args {
                num_tokens: 2,
                ..good
            },
            UNIKV_BAD_SHAPE,
            "parts_out",
        ),
        (
            unikv_merge_args {
                reserved: 1,
                ..good
            },
            UNIKV_INVALID_ARGUMENT,
            "args.reserved",
        ),
        (
            unikv_merge_args {
                struct_size: 0,
                ..good
            },
            UNIKV_BAD_STRUCT_SIZE,
            "args.struct_size",
        ),
    ];
    for (args, status, arg) in cases {
        fails(
            unsafe { unikv_attention_merge(ctx.0, &args, ptr::null_mut()) },
            status,
            arg,
        );
        assert_eq!(bytes_of(&out), vec![POISON_BYTE; 4 * 512 * 2]);
        assert_eq!(bytes_of(&lse), vec![POISON_BYTE; 16]);
    }
    fails(
        unsafe { unikv_attention_merge(ptr::null(), &good, ptr::null_mut()) },
        UNIKV_NULL_ARGUMENT,
        "ctx",
    );
    ok(unsafe { unikv_attention_merge(ctx.0, &good, ptr::null_mut()) });
}
