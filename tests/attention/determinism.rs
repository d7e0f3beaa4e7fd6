//! Determinism and batch composition: runs and victims bitwise invariant.

use super::*;

/// Two runs of the same batch are bitwise equal (decode and prefill), and so is
/// a run on a second context with one worker thread. H = 16.
#[test]
fn runs_are_deterministic() {
    let (mut rng, seed) = seeded("runs_are_deterministic");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    let heads = 16;
    let lens = ragged_lengths(&mut rng, 8);
    let lists = lens
        .iter()
        .map(|&n| unique_rows(&mut rng, pool.num_rows(), n))
        .collect();
    let b = Batch::new(&mut rng, heads, lists);
    let plan = DecodePlan::new(&ctx, b.tokens(), heads);
    let first = run_decode(&plan, &pool, &b, true);
    let second = run_decode(&plan, &pool, &b, true);
    assert!(
        bytes_of(first.out.as_slice()) == bytes_of(second.out.as_slice())
            && bytes_of(&first.lse) == bytes_of(&second.lse),
        "seed {seed}: decode runs differ"
    );
    let ctx1 = Ctx::cpu(1);
    let pool1 = pool.clone_on(&ctx1);
    let plan1 = DecodePlan::new(&ctx1, b.tokens(), heads);
    let single = run_decode(&plan1, &pool1, &b, true);
    assert!(
        bytes_of(first.out.as_slice()) == bytes_of(single.out.as_slice())
            && bytes_of(&first.lse) == bytes_of(&single.lse),
        "seed {seed}: decode differs between 1 and all worker threads"
    );

    let pb = random_prefill_batch(&mut rng, &pool, heads, &lens);
    let pplan = PrefillPlan::new(&ctx, pb.tokens(), heads);
    let a = run_prefill(&pplan, &pool, &pb);
    let c = run_prefill(&pplan, &pool, &pb);
    assert!(
        bytes_of(a.out.as_slice()) == bytes_of(c.out.as_slice())
            && bytes_of(&a.lse) == bytes_of(&c.lse),
        "seed {seed}: prefill runs differ"
    );
}

/// Batch layouts for the victim: (tokens, victim position, plan max_tokens).
const LAYOUTS: [(usize, usize, usize); 6] = [
    (1, 0, 1),
    (1, 0, 64),
    (4, 0, 4),
    (5, 2, 8),
    (9, 8, 9),
    (12, 5, 128),
];

/// docs/testing.md §1, decode: a victim token (H = 64, 1152 keys) gives bitwise the same
/// out and lse alone (plans of max_tokens 1 and 64), first, in the middle or
/// last of batches of random mates (lengths incl. 0, 1, 2300) at different
/// index-buffer offsets; it also matches the reference.
#[test]
fn decode_batch_composition_invariance() {
    let (mut rng, seed) = seeded("decode_batch_composition_invariance");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    let heads = 64;
    let victim_rows = unique_rows(&mut rng, pool.num_rows(), 1152);
    let victim_q = random_bf16(&mut rng, heads * D);
    let sink = random_sink(&mut rng, heads);
    let mut baseline: Option<(Vec<u8>, Vec<u8>)> = None;
    for (tokens, pos, max_tokens) in LAYOUTS {
        let mut lists: Vec<Vec<i32>> = (0..tokens)
            .map(|_| {
                let n = LENGTHS[rng.random_range(0..LENGTHS.len())];
                unique_rows(&mut rng, pool.num_rows(), n)
            })
            .collect();
        if tokens >= 4 {
            // Mates of very different lengths, including an empty and a long one.
            lists[(pos + 1) % tokens] = unique_rows(&mut rng, pool.num_rows(), 2300);
            lists[(pos + 2) % tokens] = Vec::new();
        }
        lists[pos] = victim_rows.clone();
        let mut b = Batch::new(&mut rng, heads, lists);
        b.sink = Some(sink.clone());
        b.q.as_mut_slice()[pos * heads * D..(pos + 1) * heads * D].copy_from_slice(&victim_q);
        let plan = DecodePlan::new(&ctx, max_tokens, heads);
        let o = run_decode(&plan, &pool, &b, true);
        let got = o.token_bytes(pos, heads);
        let lens: Vec<usize> = b.lists.iter().map(|l| l.len()).collect();
        match &baseline {
            None => {
                check_decode(&format!("seed {seed}, victim alone"), &pool, &b, &o, true);
                baseline = Some(got);
            }
            Some(base) => assert!(
                *base == got,
                "seed {seed}: victim at {pos} of {lens:?} (plan max {max_tokens}) differs from alone"
            ),
        }
    }
}

/// docs/testing.md §1, prefill (the ATOM composition test): a victim (prefix 131 pool
/// rows with -1 entries, extend 64 rows) is bitwise identical alone and among
/// mates with long prefixes (up to 2300) and full extends, at any position.
#[test]
fn prefill_batch_composition_invariance() {
    let (mut rng, seed) = seeded("prefill_batch_composition_invariance");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    let heads = 64;
    let victim_prefix = {
        let rows = unique_rows(&mut rng, pool.num_rows(), 131);
        sprinkle(&mut rng, rows, 7)
    };
    let victim_ext = unique_rows(&mut rng, EXTEND_ROWS, 64);
    let victim_q = random_bf16(&mut rng, heads * D);
    let sink = random_sink(&mut rng, heads);
    let extend_kv = random_bf16(&mut rng, EXTEND_ROWS * D);
    let mut baseline: Option<(Vec<u8>, Vec<u8>)> = None;
    for (tokens, pos, max_tokens) in LAYOUTS {
        let mut lens: Vec<usize> = (0..tokens)
            .map(|_| [0usize, 1, 512, 643, 2300][rng.random_range(0..5)])
            .collect();
        if tokens >= 4 {
            lens[(pos + 1) % tokens] = 2300;
            lens[(pos + 2) % tokens] = 0;
        }
        let mut b = random_prefill_batch(&mut rng, &pool, heads, &lens);
        b.lists[pos] = victim_prefix.clone();
        b.ext[pos] = victim_ext.clone();
        b.sink = Some(sink.clone());
        b.extend_kv = Buf::from_slice(&extend_kv);
        b.q.as_mut_slice()[pos * heads * D..(pos + 1) * heads * D].copy_from_slice(&victim_q);
        let plan = PrefillPlan::new(&ctx, max_tokens, heads);
        let o = run_prefill(&plan, &pool, &b);
        let got = o.token_bytes(pos, heads);
        match &baseline {
            None => {
                check_prefill(&format!("seed {seed}, victim alone"), &pool, &b, &o);
                baseline = Some(got);
            }
            Some(base) => assert!(
                *base == got,
                "seed {seed}: prefill victim at {pos} of prefix lens {lens:?} (plan max {max_tokens}) \
                 differs from alone"
            ),
        }
    }
}
