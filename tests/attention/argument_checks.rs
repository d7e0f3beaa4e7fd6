//! Argument and plan checks (nothing written on failure), and the CPU plans'
//! zero workspace.

use super::*;

/// A small valid decode batch (H = 8, 3 tokens) for the rejection tests.
fn small_batch(rng: &mut StdRng, pool: &KvPool) -> Batch {
    let lists = [3usize, 17, 1]
        .iter()
        .map(|&n| unique_rows(rng, pool.num_rows(), n))
        .collect();
    Batch::new(rng, 8, lists)
}

/// Asserts `o` still holds only poison.
#[track_caller]
fn assert_poisoned(what: &str, o: &Outputs) {
    assert!(
        o.out.as_slice().iter().all(|x| x.to_bits() == POISON_BF16),
        "{what}: out was written on failure"
    );
    assert!(
        o.lse.iter().all(|x| x.to_bits() == POISON_F32),
        "{what}: lse was written on failure"
    );
}

/// Decode rejections, each with the documented status, a message naming the
/// argument, and out / lse byte-identical to their poison:
/// num_tokens > max_tokens (CAPACITY_EXCEEDED), q with another H (BAD_SHAPE
/// "q"), out with another H or fewer than num_tokens rows (BAD_SHAPE "out"),
/// lse with another H (BAD_SHAPE "lse"), index -1 / index = rows / index valid only in another layer
/// (OUT_OF_RANGE "indices"), layer past the pool (OUT_OF_RANGE "layer"),
/// non-monotonic indptr, negative indptr[0] and indptr[T] past the indices
/// (OUT_OF_RANGE "indptr"), bf16 sink (BAD_DTYPE "sink"), q misaligned by 2
/// bytes (BAD_ALIGNMENT "q"), NaN / +-inf scale (INVALID_ARGUMENT
/// "softmax_scale"). The valid call succeeds afterwards.
#[test]
fn decode_rejects_invalid_arguments() {
    let (mut rng, seed) = seeded("decode_rejects_invalid_arguments");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    let b = small_batch(&mut rng, &pool);
    let heads = b.heads;
    let (indices, indptr) = csr(&b.lists);
    let plan = DecodePlan::new(&ctx, 3, heads);
    let mut o = Outputs::new(3, heads);
    let base = decode_args(&b, &indices, &indptr, &mut o, true);
    let expect = |what: &str, args: &unikv_decode_args, plan: &DecodePlan, want, name: &str| {
        fails(launch_decode(plan, &pool, args), want, name);
        assert_poisoned(&format!("seed {seed}, {what}"), &o);
    };

    // num_tokens over the plan.
    let small = DecodePlan::new(&ctx, 2, heads);
    expect(
        "capacity",
        &base,
        &small,
        UNIKV_CAPACITY_EXCEEDED,
        "num_tokens",
    );

    // q with another head count.
    let q16 = Buf::from_slice(&random_bf16(&mut rng, 3 * 16 * D));
    let mut a = base;
    a.q = tensor(q16.as_slice(), &[3, 16, D]);
    expect("q heads", &a, &plan, UNIKV_BAD_SHAPE, "q");
    // out with another head count, or fewer rows than num_tokens; lse likewise.
    let mut out16 = Buf::<bf16>::poisoned(3 * 16 * D);
    let mut a = base;
    a.out = tensor(out16.as_mut_slice(), &[3, 16, D]);
    expect("out heads", &a, &plan, UNIKV_BAD_SHAPE, "out");
    let mut a = base;
    a.out.shape[0] = 2;
    expect("out rows", &a, &plan, UNIKV_BAD_SHAPE, "out");
    let mut a = base;
    a.lse.shape[1] = heads as i64 - 1;
    expect("lse heads", &a, &plan, UNIKV_BAD_SHAPE, "lse");

    // Bad indices.
    let rows = pool.num_rows() as i32;
    let layer0_rows = pool.pool.layer(0).rows as i32;
    for (bad, layer) in [
        (-1, LAYER),
        (rows, LAYER),
        (i32::MAX, LAYER),
        (layer0_rows, 0),
    ] {
        let mut idx = indices.clone();
        let at = rng.random_range(0..idx.len());
        idx[at] = bad;
        let mut a = base;
        a.indices = vec1(&idx);
        a.layer = layer;
        expect(
            &format!("index {bad} in layer {layer}"),
            &a,
            &plan,
            UNIKV_OUT_OF_RANGE,
            "indices",
        );
    }
    let mut a = base;
    a.layer = 2;
    expect("layer 2", &a, &plan, UNIKV_OUT_OF_RANGE, "layer");

    // Bad indptr.
    let bad_ptrs = [
        ("non-monotonic", vec![0, 10, 3, indptr[3]]),
        ("negative first", vec![-1, indptr[1], indptr[2], indptr[3]]),
        (
            "past indices",
            vec![0, indptr[1], indptr[2], indices.len() as i32 + 1],
        ),
    ];
    for (what, ptr) in &bad_ptrs {
        let mut a = base;
        a.indptr = vec1(ptr);
        expect(what, &a, &plan, UNIKV_OUT_OF_RANGE, "indptr");
    }

    // Sink of the wrong dtype.
    let sink_bf16: Vec<bf16> = (0..heads).map(|_| bf16::from_f32(1.0)).collect();
    let mut a = base;
    a.sink = vec1(&sink_bf16);
    expect("bf16 sink", &a, &plan, UNIKV_BAD_DTYPE, "sink");

    // q misaligned by 2 bytes.
    let mut shifted = Buf::<bf16>::poisoned(3 * heads * D + 1);
    shifted.as_mut_slice()[1..].copy_from_slice(b.q.as_slice());
    let mut a = base;
    a.q = tensor(&shifted.as_slice()[1..], &[3, heads, D]);
    expect("misaligned q", &a, &plan, UNIKV_BAD_ALIGNMENT, "q");

    // Non-finite scale.
    for scale in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut a = base;
        a.softmax_scale = scale;
        expect(
            &format!("scale {scale}"),
            &a,
            &plan,
            UNIKV_INVALID_ARGUMENT,
            "softmax_scale",
        );
    }

    // The untouched arguments still work.
    ok(launch_decode(&plan, &pool, &base));
    check_decode(
        &format!("seed {seed}, valid after rejections"),
        &pool,
        &b,
        &o,
        true,
    );
}

/// Prefill rejections (OUT_OF_RANGE, nothing written): -2 in either stream,
/// an extend index past extend_kv's rows, a prefix index past the layer
/// (message names "indices", not "extend_"), non-monotonic extend_indptr,
/// extend_indptr[T] past extend_indices; num_tokens > max_tokens is
/// CAPACITY_EXCEEDED.
#[test]
fn prefill_rejects_invalid_streams() {
    let (mut rng, seed) = seeded("prefill_rejects_invalid_streams");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    let mut b = small_batch(&mut rng, &pool);
    b.ext = vec![
        unique_rows(&mut rng, EXTEND_ROWS, 4),
        Vec::new(),
        vec![-1, 5],
    ];
    let heads = b.heads;
    let plan = PrefillPlan::new(&ctx, 3, heads);
    let good = PrefillStreams::of(&b);
    let run = |what: &str, s: &PrefillStreams, plan: &PrefillPlan, want, name: &str| {
        let mut o = Outputs::new(3, heads);
        let args = prefill_args(&b, s, &mut o);
        fails(launch_prefill(plan, &pool, &args), want, name);
        assert_poisoned(&format!("seed {seed}, {what}"), &o);
        last_error()
    };
    let rows = pool.num_rows() as i32;
    for (what, bad, extend) in [
        ("prefix -2", -2, false),
        ("prefix past rows", rows, false),
        ("extend -2", -2, true),
        ("extend past rows", EXTEND_ROWS as i32, true),
    ] {
        let mut s = PrefillStreams::of(&b);
        let list = if extend {
            &mut s.ext_indices
        } else {
            &mut s.indices
        };
        let at = rng.random_range(0..list.len());
        list[at] = bad;
        let name = if extend { "extend_indices" } else { "indices" };
        let msg = run(what, &s, &plan, UNIKV_OUT_OF_RANGE, name);
        if !extend {
            assert!(
                !msg.contains("extend_"),
                "{what}: message {msg:?} blames the extend stream"
            );
        }
    }
    let mut s = PrefillStreams::of(&b);
    s.ext_indptr = vec![0, 4, 2, 6];
    run(
        "extend indptr non-monotonic",
        &s,
        &plan,
        UNIKV_OUT_OF_RANGE,
        "extend_indptr",
    );
    let mut s = PrefillStreams::of(&b);
    s.ext_indptr[3] = s.ext_indices.len() as i32 + 1;
    run(
        "extend indptr past",
        &s,
        &plan,
        UNIKV_OUT_OF_RANGE,
        "extend_indptr",
    );
    let small = PrefillPlan::new(&ctx, 2, heads);
    run(
        "capacity",
        &good,
        &small,
        UNIKV_CAPACITY_EXCEEDED,
        "num_tokens",
    );

    let o = run_prefill(&plan, &pool, &b);
    check_prefill(
        &format!("seed {seed}, valid after rejections"),
        &pool,
        &b,
        &o,
    );
}

/// Both plan kinds report a workspace of 0 bytes on the CPU backend (and run
/// with a NULL workspace, as every test here does).
#[test]
fn workspace_size_is_zero_on_cpu() {
    let ctx = Ctx::cpu(0);
    for (max_tokens, heads) in [(1usize, 1usize), (64, 16), (4096, 128)] {
        let d = DecodePlan::new(&ctx, max_tokens, heads);
        let p = PrefillPlan::new(&ctx, max_tokens, heads);
        let mut bytes = usize::MAX;
        ok(unsafe { unikv_decode_plan_workspace_size(d.0, &mut bytes) });
        assert_eq!(bytes, 0, "decode plan ({max_tokens}, {heads})");
        bytes = usize::MAX;
        ok(unsafe { unikv_prefill_plan_workspace_size(p.0, &mut bytes) });
        assert_eq!(bytes, 0, "prefill plan ({max_tokens}, {heads})");
    }
}
