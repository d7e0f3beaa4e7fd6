//! Indexer query and key preparation on the GPU against the CPU backend and
//! the float64 references of tests/common/indexer/. Queries: codes and
//! folded weights bit for bit (the same fp32 operations in the same order).
//! Keys: each code within 1 of the CPU's and the scale within 2 f32 ulps (the
//! RMSNorm factor's double sum is a reduction). A position outside the table
//! skips the vector on the GPU and fails with OUT_OF_RANGE, nothing written,
//! under `validate`.

use super::*;
use common::indexer::{
    csa_pool, run_topk_csa, CsaStream, KeyCase, KeyPointers, QueryCase, QueryPointers, ScoreTol,
    Spread, TopkCase, TopkPointers, DIM, FP8_TENSOR_CORE_EPS, PAGE, PAGE_BYTES,
};
use unikv::ffi::indexer::{
    unikv_indexer_prepare_k, unikv_indexer_prepare_q, unikv_indexer_topk,
    unikv_indexer_topk_from_logits,
};
use unikv::ffi::status::unikv_status;

fn queries_on(ctx: &Ctx, case: &QueryCase) -> (unikv_status, Vec<u8>, Vec<f32>) {
    let q = Dev::upload(ctx, &case.q);
    let w = Dev::upload(ctx, &case.weights);
    let table = Dev::upload(ctx, &case.table);
    let pos = Dev::upload(ctx, &case.positions_bytes());
    let q_fp8 = Dev::zeroed(ctx, case.q_fp8_len());
    let weights_out = Dev::zeroed(ctx, case.weights_out_len() * 4);
    q_fp8.poison();
    weights_out.poison();
    let args = case.args(&QueryPointers {
        q: q.ptr,
        weights: w.ptr,
        table: table.ptr,
        positions: pos.ptr,
        q_fp8: q_fp8.ptr,
        weights_out: weights_out.ptr,
    });
    let status = unsafe { unikv_indexer_prepare_q(ctx.0, &args, ptr::null_mut()) };
    (status, q_fp8.read(), weights_out.read())
}

fn keys_on(ctx: &Ctx, case: &KeyCase) -> (unikv_status, Vec<u8>) {
    let cache = Dev::zeroed(ctx, case.cache_bytes());
    cache.poison();
    let key = Dev::upload(ctx, &case.key_bytes());
    let weight = Dev::upload(ctx, &case.norm_weight);
    let table = Dev::upload(ctx, &case.table);
    let pos = Dev::upload(ctx, &case.positions_bytes());
    let loc = Dev::upload(ctx, &case.loc_bytes());
    let args = case.args(&KeyPointers {
        cache: cache.ptr,
        key: key.ptr,
        norm_weight: weight.ptr,
        table: table.ptr,
        positions: pos.ptr,
        loc: loc.ptr,
    });
    let status = unsafe { unikv_indexer_prepare_k(ctx.0, &args, ptr::null_mut()) };
    (status, cache.read())
}

#[test]
fn indexer_queries_match_cpu_exactly() {
    let Some(s) = setup() else { return };
    let (mut rng, _) = seeded("indexer_queries_match_cpu_exactly");
    let strict = validating_gpu();
    let shapes: &[(usize, usize)] = if small() {
        &[(3, 64)]
    } else {
        &[(1, 64), (64, 64), (300, 64), (7, 5)]
    };
    for fmt in [Fp8Format::E4m3Fn, Fp8Format::E4m3Fnuz] {
        for &(t, h) in shapes {
            let case = QueryCase::random(&mut rng, t, h, fmt);
            let what = format!("T={t} H={h} {fmt:?}");
            let (status, want_q, want_w) = queries_on(&s.cpu, &case);
            ok(status);
            let (status, got_q, got_w) = queries_on(&s.gpu, &case);
            ok(status);
            case.check(&got_q, &got_w);
            assert!(got_q == want_q, "{what}: q_fp8 differs from the CPU's");
            assert_eq!(bytes_of(&got_w), bytes_of(&want_w), "{what}: weights_out");

            // A position past the table: that token is skipped on the GPU.
            let mut bad = case.clone();
            let victim = t / 2;
            bad.positions[victim] = bad.max_pos as i64;
            let (status, got_q, _) = queries_on(&s.gpu, &bad);
            ok(status);
            let row = case.heads * case.out_head_stride();
            for (i, (&g, &w)) in got_q.iter().zip(&want_q).enumerate() {
                let want = if i / row == victim { POISON_BYTE } else { w };
                assert_eq!(g, want, "{what}: byte {i} with token {victim} skipped");
            }
            let (status, got_q, _) = queries_on(&strict, &bad);
            fails(status, UNIKV_OUT_OF_RANGE, "positions");
            assert!(
                got_q.iter().all(|&b| b == POISON_BYTE),
                "{what}: validate wrote q_fp8"
            );
        }
    }
}

#[test]
fn indexer_keys_match_cpu() {
    let Some(s) = setup() else { return };
    let (mut rng, _) = seeded("indexer_keys_match_cpu");
    let strict = validating_gpu();
    let sizes: &[usize] = if small() { &[9] } else { &[1, 64, 190] };
    for fmt in [Fp8Format::E4m3Fn, Fp8Format::E4m3Fnuz] {
        for &n in sizes {
            let case = KeyCase::random(&mut rng, n, fmt);
            let what = format!("N={n} {fmt:?} f32 keys {}", case.key_f32);
            let (status, want) = keys_on(&s.cpu, &case);
            ok(status);
            let (status, got) = keys_on(&s.gpu, &case);
            ok(status);
            case.check(&got);
            for page in 0..case.pages {
                let base = page * PAGE_BYTES;
                for i in 0..PAGE * DIM {
                    let (g, w) = (got[base + i], want[base + i]);
                    assert!(
                        g == w || (g as i32 - w as i32).abs() == 1,
                        "{what}: page {page} code byte {i}: GPU {g:#04x}, CPU {w:#04x}"
                    );
                }
                for slot in 0..PAGE {
                    let at = base + PAGE * DIM + slot * 4;
                    let g = u32::from_le_bytes(got[at..at + 4].try_into().unwrap());
                    let w = u32::from_le_bytes(want[at..at + 4].try_into().unwrap());
                    assert!(
                        (g as i64 - w as i64).abs() <= 2,
                        "{what}: page {page} slot {slot} scale"
                    );
                }
            }

            let mut bad = case.clone();
            let victim = (0..n).find(|&t| bad.locations[t] >= 0).unwrap();
            bad.positions[victim] = -5;
            let (status, got_bad) = keys_on(&s.gpu, &bad);
            ok(status);
            let l = bad.locations[victim] as usize;
            let (value, scale) = (
                (l / PAGE) * PAGE_BYTES + (l % PAGE) * DIM,
                (l / PAGE) * PAGE_BYTES + PAGE * DIM + (l % PAGE) * 4,
            );
            assert!(
                got_bad[value..value + DIM]
                    .iter()
                    .all(|&b| b == POISON_BYTE),
                "{what}: skipped key stored"
            );
            assert!(
                got_bad[scale..scale + 4].iter().all(|&b| b == POISON_BYTE),
                "{what}: skipped scale stored"
            );
            let (status, got_bad) = keys_on(&strict, &bad);
            fails(status, UNIKV_OUT_OF_RANGE, "positions");
            assert!(
                got_bad.iter().all(|&b| b == POISON_BYTE),
                "{what}: validate wrote the cache"
            );
        }
    }
}

/// A case's buffers in `ctx`'s memory: inputs uploaded, logits and table
/// sized for the case.
struct TopkBuffers<'a> {
    q: Dev<'a>,
    weights: Dev<'a>,
    cache: Dev<'a>,
    page_table: Dev<'a>,
    batch_id: Dev<'a>,
    positions: Dev<'a>,
    logits: Dev<'a>,
    out: Dev<'a>,
}

impl<'a> TopkBuffers<'a> {
    fn new(ctx: &'a Ctx, case: &TopkCase) -> Self {
        TopkBuffers {
            q: Dev::upload(ctx, &case.q),
            weights: Dev::upload(ctx, &case.weights),
            cache: Dev::upload(ctx, &case.cache),
            page_table: Dev::upload(ctx, &case.page_table),
            batch_id: Dev::upload(ctx, &case.batch_id),
            positions: Dev::upload(ctx, &case.positions_bytes()),
            logits: Dev::upload(ctx, &case.logits),
            out: Dev::zeroed(ctx, case.tokens * case.width * 4),
        }
    }

    /// Writes `case`'s inputs (the same shapes as the buffers were made for).
    fn write(&self, case: &TopkCase) {
        self.q.write(&case.q);
        self.weights.write(&case.weights);
        self.cache.write(&case.cache);
        self.page_table.write(&case.page_table);
        self.batch_id.write(&case.batch_id);
        self.positions.write(&case.positions_bytes());
    }

    fn pointers(&self) -> TopkPointers {
        TopkPointers {
            q: self.q.ptr,
            weights: self.weights.ptr,
            cache: self.cache.ptr,
            page_table: self.page_table.ptr,
            batch_id: self.batch_id.ptr,
            positions: self.positions.ptr,
            logits: self.logits.ptr,
            topk_indices: self.out.ptr,
        }
    }
}

/// Runs a top-k case on `ctx` (`score`: the fused op, else the selection from
/// the case's logits); returns the status, the logits and the index table.
fn topk_on(ctx: &Ctx, case: &TopkCase, score: bool) -> (unikv_status, Vec<f32>, Vec<i32>) {
    let bufs = TopkBuffers::new(ctx, case);
    if score {
        bufs.logits.poison();
    }
    bufs.out.poison();
    let args = case.args(&bufs.pointers());
    let status = unsafe {
        if score {
            unikv_indexer_topk(ctx.0, &args, ptr::null_mut())
        } else {
            unikv_indexer_topk_from_logits(ctx.0, &args, ptr::null_mut())
        }
    };
    (status, bufs.logits.read(), bufs.out.read())
}

/// The selection alone on tie-heavy scores (±0, NaN, -inf, repeated values),
/// rows of random lengths held in registers (logits up to 2048, 4096, 8192
/// and 32768 wide: 4 to 64 keys per thread; batches too large for clusters),
/// in a cluster's registers (small batches of rows past 4096: 4 to 32 keys
/// per thread) and re-read from memory (rows past 32768 in batches too large
/// for clusters): the GPU's table equals the CPU's entry for entry.
#[test]
fn indexer_topk_selection_matches_cpu_exactly() {
    let Some(s) = setup() else { return };
    let (mut rng, _) = seeded("indexer_topk_selection_matches_cpu_exactly");
    let cases: &[(usize, usize, usize, usize)] = if small() {
        &[(4, 2, 300, 64), (2, 1, 9000, 64)]
    } else {
        &[
            (64, 8, 8000, 512),
            (3, 2, 9000, 512),
            (2, 2, 6000, 512),
            (2, 1, 33000, 1024),
            (2, 1, 70000, 512),
            (20, 4, 33000, 512),
            (20, 4, 20000, 512),
            (7, 3, 2100, 1024),
            (5, 2, 1500, 512),
            (3, 2, 130, 1),
            (5, 2, 40, 2048),
        ]
    };
    // Each shape also with distinct scores and with exactly topk keys in a
    // top octave, where the radix passes stop early (third and first pass).
    let spreads = [None, Some(Spread::Distinct), Some(Spread::TopOctave)];
    for (&(t, requests, max_keys, topk), spread) in
        cases.iter().flat_map(|c| spreads.map(|s| (c, s)))
    {
        let mut case =
            TopkCase::random(&mut rng, t, requests, max_keys, topk, 1, Fp8Format::E4m3Fn);
        if let Some(spread) = spread {
            case.respread(&mut rng, spread);
        }
        let what = format!("T={t} keys {max_keys} topk {topk} {spread:?}");
        let (status, _, want) = topk_on(&s.cpu, &case, false);
        ok(status);
        let (status, _, got) = topk_on(&s.gpu, &case, false);
        ok(status);
        case.check_selection(&case.logits, &got);
        assert_eq!(got, want, "{what}: GPU table differs from the CPU's");
    }
}

/// The fused op on every score kernel (the launch's own choice: FP8 wgmma on
/// sm_90a for e4m3fn; f16 mma.sync; CUDA cores, the HIP build's): GPU scores
/// against the float64 reference (f32 sums: 1e-5 of the weighted terms; FP8
/// tensor cores: plus FP8_TENSOR_CORE_EPS of each dot product's terms), and
/// the GPU's table a correct top-k of its scores. A batch id past the page
/// table makes the token padding on the GPU and fails with OUT_OF_RANGE,
/// nothing written, under `validate`.
#[cfg(feature = "test-hooks")]
#[test]
fn indexer_topk_scores_match_reference_on_gpu() {
    use unikv::ffi::test_hooks::{gpu_indexer_score_kernel, IndexerScoreKernel};
    for kernel in [
        IndexerScoreKernel::Auto,
        IndexerScoreKernel::MmaSync,
        IndexerScoreKernel::CudaCores,
    ] {
        gpu_indexer_score_kernel(kernel);
        scores_match_reference(kernel);
    }
    gpu_indexer_score_kernel(IndexerScoreKernel::Auto);
}

#[cfg(feature = "test-hooks")]
fn scores_match_reference(kernel: unikv::ffi::test_hooks::IndexerScoreKernel) {
    use unikv::ffi::test_hooks::IndexerScoreKernel;
    let Some(s) = setup() else { return };
    let (mut rng, _) = seeded("indexer_topk_scores_match_reference_on_gpu");
    let strict = validating_gpu();
    // (tokens, requests, max keys, topk, heads): fewer than 64 heads leave
    // zero rows in the tensor-core kernels' query tiles.
    let cases: &[(usize, usize, usize, usize, usize)] = if small() {
        &[(3, 2, 200, 64, 64), (2, 1, 100, 16, 5)]
    } else {
        &[
            (16, 4, 2048, 512, 64),
            (5, 2, 700, 64, 8),
            (2, 1, 64, 16, 1),
            (4, 2, 300, 32, 37),
        ]
    };
    for fmt in [Fp8Format::E4m3Fn, Fp8Format::E4m3Fnuz] {
        let tol = if kernel == IndexerScoreKernel::Auto && fmt == Fp8Format::E4m3Fn {
            ScoreTol::FP8_TENSOR_CORE
        } else {
            ScoreTol::F32
        };
        let mut worst = 0f64;
        for &(t, requests, max_keys, topk, heads) in cases {
            let case = TopkCase::random(&mut rng, t, requests, max_keys, topk, heads, fmt);
            let (status, logits, table) = topk_on(&s.gpu, &case, true);
            ok(status);
            worst = worst.max(case.check_logits(&logits, tol));
            case.check_selection(&logits, &table);

            let mut bad = case.clone();
            bad.batch_id[0] = requests as i32;
            let (status, _, table) = topk_on(&s.gpu, &bad, true);
            ok(status);
            assert!(
                table[..case.width].iter().all(|&v| v == -1),
                "token 0 is padding"
            );
            let (status, logits, table) = topk_on(&strict, &bad, true);
            fails(status, UNIKV_OUT_OF_RANGE, "batch_id[0]");
            assert!(
                bytes_of(&table).iter().all(|&b| b == POISON_BYTE),
                "validate wrote the table"
            );
            assert!(
                bytes_of(&logits).iter().all(|&b| b == POISON_BYTE),
                "validate wrote logits"
            );
        }
        eprintln!(
            "indexer scores, {kernel:?} kernel, {fmt:?}: largest error {worst:.3e} of the terms"
        );
    }
}

/// The CSA path end to end on the GPU (tests/common/csa_pipeline.rs): indexer
/// keys and queries prepared, scored and selected, the decode streams and
/// CSA tail built (apart and fused), sparse decode, against float64.
#[test]
fn indexer_topk_feeds_csa_decode_on_gpu() {
    let Some(s) = setup() else { return };
    let (mut rng, _) = seeded("indexer_topk_feeds_csa_decode_on_gpu");
    for fused in [false, true] {
        common::csa_pipeline::run(&s.gpu, &mut rng, FP8_TENSOR_CORE_EPS, fused);
    }
}

/// `unikv_indexer_topk` captured into a CUDA graph once and replayed on new
/// inputs written into the captured buffers (queries, weights, cache, page
/// table, batch ids, positions): every replay's scores and table pass the
/// checks of a direct call.
#[test]
fn indexer_topk_replays_in_a_cuda_graph() {
    use unikv::backend::gpu::devtools::OwnedStream;
    let Some(s) = setup() else { return };
    let (mut rng, _) = seeded("indexer_topk_replays_in_a_cuda_graph");
    let g = &s.gpu;
    let (t, requests, max_keys, topk) = (9, 3, 1500, 256);
    let fmt = Fp8Format::E4m3Fn;
    let first = TopkCase::random(&mut rng, t, requests, max_keys, topk, 64, fmt);
    let bufs = TopkBuffers::new(g, &first);
    let args = first.args(&bufs.pointers());
    let stream = OwnedStream::new(0).unwrap();
    stream.begin_capture().unwrap();
    ok(unsafe { unikv_indexer_topk(g.0, &args, stream.raw) });
    let graph = stream.end_capture().unwrap();
    for _ in 0..3 {
        // Fresh values in the captured shapes.
        let mut case = TopkCase::random(&mut rng, t, requests, max_keys, topk, 64, fmt);
        case.logits_width = first.logits_width;
        case.logits = first.logits.clone();
        case.width = first.width;
        case.positions_i64 = first.positions_i64;
        bufs.write(&case);
        bufs.logits.poison();
        bufs.out.poison();
        ok(unsafe { unikv_stream_synchronize(g.0, ptr::null_mut()) });
        graph.launch(&stream).unwrap();
        ok(unsafe { unikv_stream_synchronize(g.0, stream.raw) });
        let (scores, table) = (bufs.logits.read::<f32>(), bufs.out.read::<i32>());
        case.check_logits(&scores, ScoreTol::FP8_TENSOR_CORE);
        case.check_selection(&scores, &table);
    }
}

/// `unikv_indexer_topk_fill_csa` on the GPU through every selection kernel
/// (one block holding 4 or 16 keys a thread, a cluster, rows re-read from
/// the logits): its logits and table equal `unikv_indexer_topk`'s on the
/// same GPU bit for bit, and its CSA stream holds the pool rows of that
/// table's leading entries, the window entries and the entries past the
/// stream untouched. Tails past the selection (a top-8 into slices sized for
/// the case's top-k) repeat the newest window row; under `validate` they
/// are OUT_OF_RANGE with nothing written.
#[test]
fn indexer_topk_fill_csa_matches_its_table_on_gpu() {
    let Some(s) = setup() else { return };
    let (mut rng, _) = seeded("indexer_topk_fill_csa_matches_its_table_on_gpu");
    let strict = validating_gpu();
    // (tokens, requests, max keys, topk)
    let cases: &[(usize, usize, usize, usize)] = if small() {
        &[(4, 2, 300, 64), (2, 1, 9000, 64)]
    } else {
        &[
            (5, 2, 1500, 512),
            (64, 8, 8000, 512),
            (2, 1, 9000, 512),
            (20, 4, 33000, 512),
            (2, 1, 70000, 1024),
        ]
    };
    for &(t, requests, max_keys, topk) in cases {
        let what = format!("T={t} keys {max_keys} topk {topk}");
        let case = TopkCase::random(&mut rng, t, requests, max_keys, topk, 4, Fp8Format::E4m3Fn);
        let stream = CsaStream::for_case(&mut rng, &case, true);
        let pool = csa_pool(&s.gpu, &case, case.cache_pages);
        let row_base = pool.layer(0).swa_rows as i32;
        let (status, logits, table, got) =
            run_topk_csa(&s.gpu, &pool, &case, &stream, true, |_, _| {});
        ok(status);
        let (status, want_logits, want_table) = topk_on(&s.gpu, &case, true);
        ok(status);
        assert_eq!(bytes_of(&logits), bytes_of(&want_logits), "{what}: logits");
        assert_eq!(table, want_table, "{what}: table");
        stream.check(&got, &table, case.width, row_base, &what);

        let top8 = |a: &mut unikv::ffi::indexer::unikv_indexer_topk_args, _: &mut _| a.topk = 8;
        let full = CsaStream::for_case(&mut rng, &case, false);
        let (status, _, table, got) = run_topk_csa(&s.gpu, &pool, &case, &full, true, top8);
        ok(status);
        full.check(
            &got,
            &table,
            case.width,
            row_base,
            &format!("{what}, top-8"),
        );
        if full.tails.iter().all(|&(_, len)| len <= 8) {
            continue; // no tail past a top-8 selection
        }
        let strict_pool = csa_pool(&strict, &case, case.cache_pages);
        let (status, logits, table, got) =
            run_topk_csa(&strict, &strict_pool, &case, &full, true, top8);
        fails(status, UNIKV_OUT_OF_RANGE, "csa_indptr[");
        assert!(
            bytes_of(&table).iter().all(|&b| b == POISON_BYTE)
                && bytes_of(&logits).iter().all(|&b| b == POISON_BYTE)
                && got == full.indices,
            "{what}: validate wrote an output"
        );
    }
}
