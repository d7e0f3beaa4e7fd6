//! Prefill against the reference: all head counts, an empty prefix (equal to
//! decode over the extend rows), and -1 entries skipped in both streams.

use super::*;

/// Prefill over ragged batches for H in {8, 64, 128}: random prefix streams into
/// the pool (lengths incl. 0, 1, 2300, -1 entries sprinkled in) plus random
/// extend streams (0..=128 rows, -1 sprinkled) share one softmax with the sink;
/// compared to the f64 reference over the valid rows of both sources.
#[test]
fn prefill_matches_reference_all_head_counts() {
    let (mut rng, seed) = seeded("prefill_matches_reference_all_head_counts");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    for (i, heads) in [8usize, 64, 128].into_iter().enumerate() {
        let tokens = rng.random_range(5..=7);
        let lens = ragged_lengths(&mut rng, tokens);
        let mut b = random_prefill_batch(&mut rng, &pool, heads, &lens);
        b.scale = if i % 2 == 0 { SCALE } else { 0.25 };
        if heads == 64 {
            b.sink = None;
        }
        let plan = PrefillPlan::new(&ctx, tokens, heads);
        let o = run_prefill(&plan, &pool, &b);
        let ext: Vec<usize> = b.ext.iter().map(|e| e.len()).collect();
        let tag = format!("seed {seed}, H={heads}, prefix lens {lens:?}, extend lens {ext:?}");
        check_prefill(&tag, &pool, &b, &o);
    }
    assert!(
        bytes_of(pool.pool.rows_mut(LAYER)) == bytes_of(&pool.rows),
        "seed {seed}: prefill modified the pool"
    );
}

/// A prefill token whose prefix stream is empty equals decode over its extend
/// rows: both are checked against the f64 reference, and decode over the same
/// rows copied into the pool agrees with prefill within 1e-2. H = 16.
#[test]
fn prefill_with_empty_prefix_equals_decode_over_extend() {
    let (mut rng, seed) = seeded("prefill_with_empty_prefix_equals_decode_over_extend");
    let ctx = Ctx::cpu(0);
    let mut pool = KvPool::new(&ctx, &mut rng);
    let heads = 16;
    let ext_lens = [1usize, 64, 128, 17, 128];
    let mut b = Batch::new(&mut rng, heads, vec![Vec::new(); ext_lens.len()]);
    b.ext = ext_lens
        .iter()
        .map(|&n| unique_rows(&mut rng, EXTEND_ROWS, n))
        .collect();
    let plan = PrefillPlan::new(&ctx, ext_lens.len(), heads);
    let pre = run_prefill(&plan, &pool, &b);
    check_prefill(
        &format!("seed {seed}, prefill, ext {ext_lens:?}"),
        &pool,
        &b,
        &pre,
    );

    // Copy the extend rows into distinct pool rows and run decode over them.
    let targets = unique_rows(&mut rng, pool.num_rows(), EXTEND_ROWS);
    let layer = pool.pool.rows_mut(LAYER);
    for (e, &r) in targets.iter().enumerate() {
        let r = r as usize;
        layer[r * D..(r + 1) * D].copy_from_slice(&b.extend_kv.as_slice()[e * D..(e + 1) * D]);
    }
    pool.rows = layer.to_vec();
    let dec = Batch {
        heads,
        scale: b.scale,
        q: Buf::from_slice(b.q.as_slice()),
        lists: b
            .ext
            .iter()
            .map(|l| l.iter().map(|&e| targets[e as usize]).collect())
            .collect(),
        sink: b.sink.clone(),
        extend_kv: Buf::poisoned(0),
        ext: Vec::new(),
    };
    let dplan = DecodePlan::new(&ctx, ext_lens.len(), heads);
    let out = run_decode(&dplan, &pool, &dec, true);
    check_decode(
        &format!("seed {seed}, decode over extend rows"),
        &pool,
        &dec,
        &out,
        true,
    );
    // Prefill vs decode directly.
    let as_ref = Reference {
        heads,
        out: out.out.as_slice().iter().map(|x| x.to_f64()).collect(),
        lse: out.lse.iter().map(|&x| x as f64).collect(),
        keys: ext_lens.to_vec(),
    };
    check(
        &format!("seed {seed}, prefill vs decode"),
        &as_ref,
        pre.out.as_slice(),
        Layout::dense(heads),
        Some((&pre.lse, heads)),
    );
}

/// -1 entries are skipped in both prefill streams: tokens whose streams are
/// all -1 (or empty) give exact zeros with lse = sink (-inf without sink);
/// -1 interleaved anywhere (front, back, runs) drops just those entries.
/// Runs with and without a sink. H = 8.
#[test]
fn prefill_skips_minus_one_in_both_streams() {
    let (mut rng, seed) = seeded("prefill_skips_minus_one_in_both_streams");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    let heads = 8;
    let rows = pool.num_rows();
    let mut p = |n| unique_rows(&mut rng, rows, n);
    let prefix = vec![
        vec![-1, -1, -1],
        {
            let r = p(2);
            vec![-1, r[0], -1, -1, r[1], -1]
        },
        vec![-1; 300],
        {
            let mut v = p(640);
            for i in (0..v.len()).step_by(5) {
                v[i] = -1;
            }
            v
        },
        Vec::new(),
        vec![-1],
        p(1),
    ];
    let mut e = |n| unique_rows(&mut rng, EXTEND_ROWS, n);
    let extend = vec![
        vec![-1],
        {
            let r = e(2);
            vec![-1, r[0], -1, r[1]]
        },
        e(128),
        vec![-1; 20],
        Vec::new(),
        Vec::new(),
        {
            let r = e(3);
            vec![r[0], -1, r[1], r[2], -1, -1]
        },
    ];
    let mut b = Batch::new(&mut rng, heads, prefix);
    b.ext = extend;
    let plan = PrefillPlan::new(&ctx, b.tokens(), heads);
    let empty = [0usize, 4, 5];
    for with_sink in [true, false] {
        if !with_sink {
            b.sink = None;
        }
        let o = run_prefill(&plan, &pool, &b);
        check_prefill(&format!("seed {seed}, sink {with_sink}"), &pool, &b, &o);
        for &t in &empty {
            for h in 0..heads {
                let want = b.sink.as_ref().map_or(f32::NEG_INFINITY, |s| s[h]);
                assert_eq!(
                    o.lse[t * heads + h],
                    want,
                    "seed {seed}: token {t} head {h}"
                );
            }
        }
    }
}
