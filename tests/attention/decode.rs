//! Decode against the reference: all head counts, the sink and empty-slice
//! edge cases, dense softmax without a sink, and the inverse-RoPE epilogue.

use super::*;

/// Decode over ragged batches (lengths 0, 1, 2300 and others in every batch,
/// unique random rows per token) for H in {1, 8, 16, 64, 128}: every (token,
/// head) within 1e-2 relative L2 of the f64 reference and lse within 1e-3.
/// Varies the scale (0.0442 / 0.25), sink presence and lse presence; the pool
/// itself is left unmodified.
#[test]
fn decode_matches_reference_all_head_counts() {
    let (mut rng, seed) = seeded("decode_matches_reference_all_head_counts");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    for (i, heads) in [1usize, 8, 16, 64, 128].into_iter().enumerate() {
        let tokens = if heads >= 64 {
            6
        } else {
            rng.random_range(6..=9)
        };
        let lens = ragged_lengths(&mut rng, tokens);
        let lists = lens
            .iter()
            .map(|&n| unique_rows(&mut rng, pool.num_rows(), n))
            .collect();
        let mut b = Batch::new(&mut rng, heads, lists);
        b.scale = if i % 2 == 0 { SCALE } else { 0.25 };
        if heads == 16 {
            b.sink = None;
        }
        let with_lse = heads != 64;
        let plan = DecodePlan::new(&ctx, tokens + rng.random_range(0..4), heads);
        let o = run_decode(&plan, &pool, &b, with_lse);
        let tag = format!(
            "seed {seed}, H={heads}, lens {lens:?}, scale {}, sink {}, lse {with_lse}",
            b.scale,
            b.sink.is_some()
        );
        check_decode(&tag, &pool, &b, &o, with_lse);
    }
    assert!(
        bytes_of(pool.pool.rows_mut(LAYER)) == bytes_of(&pool.rows),
        "seed {seed}: decode modified the pool"
    );
}

/// docs/attention.md §1 edge cases on one ragged batch (H = 16, empty slices included):
/// finite sink: empty slices give exact zeros and lse == sink exactly;
/// no sink: zeros and lse == -inf, and a sink tensor of -inf is bitwise equal
/// to an absent sink (plain softmax); sink 1e6 drives every output to ~0
/// (|out| < 1e-3) with lse ~ 1e6; a per-head mix of -inf / 1e6 / finite sinks
/// in one launch; a large scale (4.0, scores ~ +-100) stays finite and exact.
#[test]
fn decode_sink_and_empty_slice_edge_cases() {
    let (mut rng, seed) = seeded("decode_sink_and_empty_slice_edge_cases");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    let heads = 16;
    let lens = [0usize, 5, 300, 0, 2300, 1, 128];
    let lists = lens
        .iter()
        .map(|&n| unique_rows(&mut rng, pool.num_rows(), n))
        .collect();
    let mut b = Batch::new(&mut rng, heads, lists);
    let plan = DecodePlan::new(&ctx, lens.len(), heads);
    let empty: Vec<usize> = (0..lens.len()).filter(|&t| lens[t] == 0).collect();

    // Finite sink.
    let o = run_decode(&plan, &pool, &b, true);
    check_decode(&format!("seed {seed}, finite sink"), &pool, &b, &o, true);
    let sink = b.sink.clone().unwrap();
    for &t in &empty {
        for (h, &z) in sink.iter().enumerate() {
            assert_eq!(
                o.lse[t * heads + h],
                z,
                "seed {seed}: empty slice lse must equal the sink"
            );
        }
    }

    // No sink: plain softmax; explicit -inf sink gives the same bits.
    b.sink = None;
    let absent_sink = run_decode(&plan, &pool, &b, true);
    check_decode(
        &format!("seed {seed}, no sink"),
        &pool,
        &b,
        &absent_sink,
        true,
    );
    for &t in &empty {
        assert!(
            absent_sink.lse[t * heads..(t + 1) * heads]
                .iter()
                .all(|&l| l == f32::NEG_INFINITY),
            "seed {seed}: empty slice without sink must have lse -inf"
        );
    }
    b.sink = Some(vec![f32::NEG_INFINITY; heads]);
    let inf_sink = run_decode(&plan, &pool, &b, true);
    check_decode(
        &format!("seed {seed}, -inf sink"),
        &pool,
        &b,
        &inf_sink,
        true,
    );
    assert!(
        bytes_of(inf_sink.out.as_slice()) == bytes_of(absent_sink.out.as_slice())
            && bytes_of(&inf_sink.lse) == bytes_of(&absent_sink.lse),
        "seed {seed}: a -inf sink must equal an absent sink bitwise"
    );

    // Huge sink: outputs ~0, lse = 1e6.
    b.sink = Some(vec![1e6; heads]);
    let big = run_decode(&plan, &pool, &b, true);
    check_decode(&format!("seed {seed}, sink 1e6"), &pool, &b, &big, true);
    let max = big
        .out
        .as_slice()
        .iter()
        .map(|x| x.to_f32().abs())
        .fold(0.0, f32::max);
    assert!(max < 1e-3, "seed {seed}: sink 1e6 left max |out| = {max}");

    // Per-head mix in one launch.
    let mix = [f32::NEG_INFINITY, 1e6, 0.0, -3.0, 7.5, 2.0, -30.0, 12.0];
    b.sink = Some((0..heads).map(|h| mix[h % mix.len()]).collect());
    let mixed = run_decode(&plan, &pool, &b, true);
    check_decode(
        &format!("seed {seed}, mixed sinks"),
        &pool,
        &b,
        &mixed,
        true,
    );
    for &t in &empty {
        for h in 0..heads {
            assert_eq!(
                mixed.lse[t * heads + h],
                mix[h % mix.len()],
                "seed {seed}: head {h}"
            );
        }
    }

    // Large scale: the max subtraction keeps e^(s - M) finite.
    b.scale = 4.0;
    b.sink = Some(random_sink(&mut rng, heads));
    let sharp = run_decode(&plan, &pool, &b, true);
    check_decode(&format!("seed {seed}, scale 4"), &pool, &b, &sharp, true);
}

/// Dense softmax computed separately (log-sum-exp form, no sink): keys are all
/// rows 0..n of the layer; with no sink (absent, or a -inf tensor) decode
/// equals `softmax(scale q K^T) K`, whatever the order of the indices (in
/// order, reversed, shuffled). H = 8.
#[test]
fn decode_without_sink_equals_dense_softmax() {
    let (mut rng, seed) = seeded("decode_without_sink_equals_dense_softmax");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    let heads = 8;
    let n = [640usize, 2300][rng.random_range(0..2)];
    let forward: Vec<i32> = (0..n as i32).collect();
    let reversed: Vec<i32> = forward.iter().rev().copied().collect();
    let mut shuffled = forward.clone();
    shuffled.shuffle(&mut rng);
    let mut b = Batch::new(&mut rng, heads, vec![forward, reversed, shuffled]);
    // Same query for the three tokens.
    let q0 = b.q.as_slice()[..heads * D].to_vec();
    for t in 1..3 {
        b.q.as_mut_slice()[t * heads * D..(t + 1) * heads * D].copy_from_slice(&q0);
    }
    b.scale = [SCALE, 0.25][rng.random_range(0..2)];
    // Dense reference: logits, log-sum-exp, probabilities, weighted sum.
    let keys = &pool.rows[..n * D];
    let mut dense = vec![0f64; heads * D];
    let mut dense_lse = vec![0f64; heads];
    for h in 0..heads {
        let q: Vec<f64> = q0[h * D..(h + 1) * D].iter().map(|x| x.to_f64()).collect();
        let logits: Vec<f64> = keys
            .chunks_exact(D)
            .map(|k| b.scale as f64 * k.iter().zip(&q).map(|(x, y)| x.to_f64() * y).sum::<f64>())
            .collect();
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + logits.iter().map(|l| (l - max).exp()).sum::<f64>().ln();
        dense_lse[h] = lse;
        for (l, k) in logits.iter().zip(keys.chunks_exact(D)) {
            let p = (l - lse).exp();
            for (o, x) in dense[h * D..(h + 1) * D].iter_mut().zip(k) {
                *o += p * x.to_f64();
            }
        }
    }
    let plan = DecodePlan::new(&ctx, 3, heads);
    for sink in [None, Some(vec![f32::NEG_INFINITY; heads])] {
        b.sink = sink;
        let o = run_decode(&plan, &pool, &b, true);
        let r = Reference {
            heads,
            out: [dense.clone(), dense.clone(), dense.clone()].concat(),
            lse: [dense_lse.clone(), dense_lse.clone(), dense_lse.clone()].concat(),
            keys: vec![n; 3],
        };
        let tag = format!(
            "seed {seed}, n {n}, scale {}, sink {:?}",
            b.scale,
            b.sink.is_some()
        );
        check(
            &tag,
            &r,
            o.out.as_slice(),
            Layout::dense(heads),
            Some((&o.lse, heads)),
        );
    }
}

/// Decode's inverse-RoPE epilogue: the rope dims of every output equal the
/// float64 reference output rotated by the conjugate of the token's table row
/// (within the decode tolerance); dims 0..447 and lse are bitwise those of
/// plain decode; int32 and int64 positions give the same bytes. A position past
/// the table is OUT_OF_RANGE and one of the two tensors alone NULL_ARGUMENT,
/// nothing written.
#[test]
fn decode_inverse_rope_epilogue() {
    let (mut rng, seed) = seeded("decode_inverse_rope_epilogue");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    let max_pos = 9000u32;
    let table = rope_table(40_000.0, 16.0, max_pos);
    for heads in [1usize, 16, 64] {
        let tokens = 6;
        let lens = ragged_lengths(&mut rng, tokens);
        let lists = lens
            .iter()
            .map(|&n| unique_rows(&mut rng, pool.num_rows(), n))
            .collect();
        let b = Batch::new(&mut rng, heads, lists);
        let plan = DecodePlan::new(&ctx, tokens, heads);
        let plain = run_decode(&plan, &pool, &b, true);
        let pos: Vec<i32> = (0..tokens)
            .map(|_| rng.random_range(0..max_pos as i32))
            .collect();
        let pos64: Vec<i64> = pos.iter().map(|&p| p as i64).collect();
        let (indices, indptr) = csr(&b.lists);
        let run = |positions: unikv_tensor, table_desc: unikv_tensor| {
            let mut o = Outputs::new(tokens, heads);
            let mut args = decode_args(&b, &indices, &indptr, &mut o, true);
            args.rope_table = table_desc;
            args.positions = positions;
            (launch_decode(&plan, &pool, &args), o)
        };
        let table_desc = tensor(&table, &[max_pos as usize, 64]);
        let (status, o) = run(vec1(&pos), table_desc);
        ok(status);
        let tag = format!("seed {seed}, H={heads}, lens {lens:?}");
        // The reference, rotated in float64.
        let mut r = b.decode_reference(&pool);
        for (t, &p) in pos.iter().enumerate() {
            let cs = &table[p as usize * 64..(p as usize + 1) * 64];
            for h in 0..heads {
                let row = &mut r.out[(t * heads + h) * D..(t * heads + h + 1) * D];
                for i in 0..32 {
                    let (c, s) = (cs[2 * i] as f64, cs[2 * i + 1] as f64);
                    let (re, im) = (row[448 + 2 * i], row[449 + 2 * i]);
                    row[448 + 2 * i] = re * c + im * s;
                    row[449 + 2 * i] = im * c - re * s;
                }
            }
        }
        check(
            &tag,
            &r,
            o.out.as_slice(),
            Layout::dense(heads),
            Some((&o.lse, heads)),
        );
        for t in 0..tokens * heads {
            let (a, b) = (&o.out.as_slice()[t * D..], &plain.out.as_slice()[t * D..]);
            assert!(
                bytes_of(&a[..448]) == bytes_of(&b[..448]),
                "{tag}: nope dims changed"
            );
        }
        assert!(
            bytes_of(&o.lse) == bytes_of(&plain.lse),
            "{tag}: lse changed"
        );
        let (status, o64) = run(vec1(&pos64), table_desc);
        ok(status);
        assert!(
            bytes_of(o64.out.as_slice()) == bytes_of(o.out.as_slice()),
            "{tag}: int64 positions differ"
        );

        let mut bad = pos.clone();
        bad[tokens - 1] = max_pos as i32;
        let (status, o) = run(vec1(&bad), table_desc);
        fails(
            status,
            UNIKV_OUT_OF_RANGE,
            &format!("positions[{}]", tokens - 1),
        );
        assert!(o.out.as_slice().iter().all(|x| x.to_bits() == POISON_BF16));
        for (positions, table_desc, arg) in [
            (vec1(&pos), absent(), "rope_table"),
            (absent(), table_desc, "positions"),
        ] {
            let (status, o) = run(positions, table_desc);
            fails(status, UNIKV_NULL_ARGUMENT, arg);
            assert!(o.out.as_slice().iter().all(|x| x.to_bits() == POISON_BF16));
        }
    }
}
