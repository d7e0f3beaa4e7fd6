//! Decode attention: against the CPU backend, in place, with the inverse-RoPE
//! epilogue, on the fallback paths, and batch invariance.

use super::*;

/// Head counts cover every kernel: heads-on-N wgmma (1-16, 24-32), the
/// mma.sync kernel with three m-tiles (40), heads-on-M wgmma (64, 128).
#[test]
fn decode_matches_cpu() {
    let Some(s) = setup() else { return };
    let (pc, pg, rows) = attention_pools(&s, &mut rand::rng());
    let (tokens, heads): (&[usize], &[usize]) = if small() {
        (&[1, 3, 140], &[1, 16, 24, 40, 64])
    } else {
        (&[1, 3, 64, 257], &[1, 8, 16, 24, 32, 40, 64, 128])
    };
    for &t in tokens {
        for &h in heads {
            check_decode(&s, &pc, &pg, rows, t, h, "decode");
        }
    }
}

/// Key lists past 4096 keys a token: plans for a few tokens split them
/// further than a cluster holds and merge through the workspace (the plan's
/// long key splits). Rows repeat (the pools hold fewer), which the math allows.
/// bf16 (heads-on-N at 16 heads, heads-on-M at 64) and FP8 pools (16-head
/// blocks at 128 heads, 32-head blocks at 64 heads and T = 4).
#[test]
fn long_key_lists_match_cpu() {
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    for (dtype, shapes) in [
        (unikv_dtype::UNIKV_DTYPE_BF16, [(1, 16), (2, 64)]),
        (unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN, [(1, 128), (4, 64)]),
    ] {
        let (pc, pg, rows) = attention_pools_of(&s, &mut rng, dtype);
        for (t, h) in shapes {
            let mut c = random_case(&mut rng, t, h, rows, false);
            c.indices.clear();
            c.indptr = vec![0];
            for _ in 0..t {
                let keys = rng.random_range(4096..6000);
                c.indices
                    .extend((0..keys).map(|_| rng.random_range(0..rows as i32)));
                c.indptr.push(c.indices.len() as i32);
            }
            let info = plan_kv(&s.gpu, true, t, h, pc.info().kv_dtype).info();
            assert!(info.long_key_splits > 0, "{dtype:?} T={t} H={h}: {info:?}");
            check_decode_case(&s, &pc, &pg, &c, &format!("{dtype:?} long keys"));
        }
    }
}

/// `out` may be `q` itself (the header's exact in-place use): every kernel
/// family, decode and prefill, bf16 and FP8 pools, split and unsplit tokens,
/// gives the bits it gives out of place.
#[test]
fn attention_in_place_matches_out_of_place() {
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    let shapes: &[(usize, usize)] = if small() {
        &[(3, 16), (3, 32), (3, 64)]
    } else {
        &[
            (1, 16),
            (3, 32),
            (64, 16),
            (64, 32),
            (3, 40),
            (5, 64),
            (64, 128),
        ]
    };
    for dtype in [
        unikv_dtype::UNIKV_DTYPE_BF16,
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
    ] {
        let (_pc, pg, rows) = attention_pools_of(&s, &mut rng, dtype);
        for decode in [true, false] {
            for &(t, h) in shapes {
                let mut c = random_case(&mut rng, t, h, rows, !decode);
                let p = plan_kv(&s.gpu, decode, t, h, dtype as u32);
                let apart = run_attention(&s.gpu, &pg, 1, &c, &p);
                c.in_place = true;
                let over_q = run_attention(&s.gpu, &pg, 1, &c, &p);
                let what = format!("{dtype:?} decode={decode} T={t} H={h}");
                assert_eq!(bytes_of(&apart.0), bytes_of(&over_q.0), "{what}: out");
                assert_eq!(bytes_of(&apart.1), bytes_of(&over_q.1), "{what}: lse");
            }
        }
    }
}

/// Decode's inverse-RoPE epilogue on the GPU against the CPU backend, through
/// every write path: direct writes of each kernel (heads 16, 40, 64, 128), the
/// cluster merge (long slices), and the workspace combine of the fallback paths.
#[test]
fn decode_inverse_rope_epilogue_matches_cpu() {
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    let (pc, pg, rows) = attention_pools(&s, &mut rng);
    let max_pos = 5000u32;
    let table = rope_table(10_000.0, 0.0, max_pos);
    for (t, h, fallback) in [
        (1, 16, false),
        (3, 40, false),
        (64, 64, false),
        (17, 128, false),
        (5, 16, true),
        (9, 64, true),
    ] {
        #[cfg(feature = "test-hooks")]
        unikv::ffi::test_hooks::gpu_plan_fallbacks(fallback, fallback);
        #[cfg(not(feature = "test-hooks"))]
        if fallback {
            continue;
        }
        let what = format!("inverse-RoPE epilogue T={t} H={h} fallback {fallback}");
        check_rope_epilogue(&s, (&pc, &pg, rows), t, h, (&table, max_pos), &what);
    }
    #[cfg(feature = "test-hooks")]
    unikv::ffi::test_hooks::gpu_plan_fallbacks(false, false);
    // FP8 pools: the heads-on-N kernels' raw variant, whose rope tile pairs
    // dims across lanes as the bf16 kernels do (direct writes at T = 64, the
    // cluster merge at T = 1 and 3).
    let (pc, pg, rows) = attention_pools_of(&s, &mut rng, unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN);
    for (t, h) in [(1, 16), (3, 32), (64, 16), (64, 32)] {
        let what = format!("inverse-RoPE epilogue, FP8 pool, T={t} H={h}");
        check_rope_epilogue(&s, (&pc, &pg, rows), t, h, (&table, max_pos), &what);
    }
}

/// The paths GPUs without clusters or wgmma take (workspace + combine kernel,
/// mma.sync for 64-head blocks), forced on this thread's plans.
#[cfg(feature = "test-hooks")]
#[test]
fn decode_fallback_paths_match_cpu() {
    let Some(s) = setup() else { return };
    let (pc, pg, rows) = attention_pools(&s, &mut rand::rng());
    unikv::ffi::test_hooks::gpu_plan_fallbacks(true, true);
    for (t, h) in [(1, 16), (3, 64), (16, 32), (64, 128)] {
        check_decode(&s, &pc, &pg, rows, t, h, "decode (fallback paths)");
    }
    unikv::ffi::test_hooks::gpu_plan_fallbacks(false, false);
}

/// A victim token's output is bitwise the same alone, inside an MTP-sized batch,
/// and among other batch-mates at another position (same plan).
#[test]
fn decode_is_batch_invariant() {
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    let (_pc, pg, rows) = attention_pools(&s, &mut rng);
    let h = 16;
    let gp = plan(&s.gpu, true, 8, h);
    let base = random_case(&mut rng, 8, h, rows, false);
    let slice = |c: &AttnCase, t: usize| -> (Vec<bf16>, Vec<i32>) {
        let (lo, hi) = (c.indptr[t] as usize, c.indptr[t + 1] as usize);
        (
            c.q[t * h * 512..(t + 1) * h * 512].to_vec(),
            c.indices[lo..hi].to_vec(),
        )
    };
    let victim = 2; // the longest slice of the batch
    let (vq, vidx) = slice(&base, victim);
    let build = |order: &[usize]| -> AttnCase {
        let mut c = base.clone();
        c.t = order.len();
        c.q.clear();
        c.indices.clear();
        c.indptr = vec![0];
        for &t in order {
            let (q, idx) = if t == victim {
                (vq.clone(), vidx.clone())
            } else {
                slice(&base, t)
            };
            c.q.extend(q);
            c.indices.extend(idx);
            c.indptr.push(c.indices.len() as i32);
        }
        c
    };
    let row = |c: &AttnCase, out: &(Vec<bf16>, Vec<f32>), at: usize| {
        let _ = c;
        bytes_of(&out.0[at * h * 512..(at + 1) * h * 512])
    };
    let alone = build(&[victim]);
    let want = run_attention(&s.gpu, &pg, 1, &alone, &gp);
    for order in [
        vec![0, victim, 1, 3],
        vec![victim, 5, 6, 7, 4, 0, 1, 3],
        vec![7, 6, victim],
    ] {
        let c = build(&order);
        let got = run_attention(&s.gpu, &pg, 1, &c, &gp);
        let at = order.iter().position(|&t| t == victim).unwrap();
        assert_eq!(
            row(&c, &got, at),
            row(&alone, &want, 0),
            "victim differs in batch {order:?}"
        );
    }
}
