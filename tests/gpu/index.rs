//! The decode index builders (build_decode_streams, fill_csa_tail) against
//! the CPU backend, exactly.

use super::*;

fn index_pools(s: &Setup) -> (Pool, Pool, PoolSpec) {
    index_pools_of(s, unikv_dtype::UNIKV_DTYPE_BF16)
}

/// Runs build_decode_streams + fill_csa_tail on one context; returns the six outputs.
fn decode_streams(ctx: &Ctx, pool: &Pool, inp: &DecodeInputs) -> Vec<Vec<i32>> {
    let t = inp.batch.len();
    let win = 32;
    let caps = [t * win, t * (win + inp.c128_width), t * (win + inp.topk)];
    let b = Dev::upload(ctx, &inp.batch);
    let sl = Dev::upload(ctx, &inp.slots);
    let p = Dev::upload(ctx, &inp.pos);
    let c128 = Dev::upload(ctx, &inp.c128);
    let csa = Dev::upload(ctx, &inp.csa);
    let outs: Vec<(Dev, Dev)> = caps
        .iter()
        .map(|&cap| {
            (
                Dev::zeroed(ctx, (t + 1) * 4),
                Dev::zeroed(ctx, cap.max(1) * 4),
            )
        })
        .collect();
    for (a, b) in &outs {
        a.poison();
        b.poison();
    }
    let args = unikv_decode_streams_args {
        struct_size: std::mem::size_of::<unikv_decode_streams_args>(),
        batch_id: b.t::<i32>(&[t]),
        req_slots: sl.t::<i32>(&[inp.slots.len()]),
        positions: p.t::<i32>(&[t]),
        c128_page_indices: c128.t::<i32>(&[t, inp.c128_width]),
        swa_indptr: outs[0].0.t::<i32>(&[t + 1]),
        swa_indices: outs[0].1.t::<i32>(&[caps[0]]),
        hca_indptr: outs[1].0.t::<i32>(&[t + 1]),
        hca_indices: outs[1].1.t::<i32>(&[caps[1]]),
        csa_indptr: outs[2].0.t::<i32>(&[t + 1]),
        csa_indices: outs[2].1.t::<i32>(&[caps[2]]),
        num_tokens: t as u32,
        csa_topk: inp.topk as u32,
    };
    ok(unsafe { unikv_build_decode_streams(pool.0, &args, ptr::null_mut()) });
    if inp.topk > 0 {
        let tail = unikv_csa_tail_args {
            struct_size: std::mem::size_of::<unikv_csa_tail_args>(),
            batch_id: args.batch_id,
            positions: args.positions,
            csa_page_indices: csa.t::<i32>(&[t, inp.topk]),
            csa_indptr: args.csa_indptr,
            csa_indices: args.csa_indices,
            num_tokens: t as u32,
            reserved: 0,
        };
        ok(unsafe { unikv_fill_csa_tail(pool.0, &tail, ptr::null_mut()) });
    }
    let mut result = vec![];
    for (ptr_, idx) in &outs {
        let ptr_v = ptr_.read::<i32>();
        let n = ptr_v[t] as usize;
        result.push(ptr_v);
        result.push(idx.read::<i32>()[..n].to_vec());
    }
    result
}

struct DecodeInputs {
    batch: Vec<i32>,
    slots: Vec<i32>,
    pos: Vec<i32>,
    c128: Vec<i32>,
    c128_width: usize,
    csa: Vec<i32>,
    topk: usize,
}

#[test]
fn index_builders_match_cpu_exactly() {
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    let (pc, pg, spec) = index_pools(&s);
    let hca_rows = spec.c128_blocks as i32 + 2;
    let csa_rows = spec.c128_blocks as i32 * 32 + 64;
    for &t in &[1usize, 3, 64, 257] {
        let reqs = 6;
        let c128_width = rng.random_range(1..80usize);
        let topk = *[0usize, 8, 64, 512].choose(&mut rng).unwrap();
        let inp = DecodeInputs {
            batch: (0..t).map(|_| rng.random_range(-1..reqs)).collect(),
            slots: (0..reqs).map(|_| rng.random_range(0..7)).collect(),
            pos: (0..t).map(|_| rng.random_range(0..12000)).collect(),
            c128: (0..t * c128_width)
                .map(|_| {
                    if rng.random_bool(0.98) {
                        rng.random_range(0..hca_rows)
                    } else {
                        -1
                    }
                })
                .collect(),
            c128_width,
            csa: (0..t * topk)
                .map(|_| rng.random_range(0..csa_rows))
                .collect(),
            topk,
        };
        let want = decode_streams(&s.cpu, &pc, &inp);
        let got = decode_streams(&s.gpu, &pg, &inp);
        assert_eq!(got, want, "decode streams T={t}");

        // Prefill streams for each layer kind.
        for ratio in [0u32, 4, 128] {
            let width = 40;
            let chunk_start: Vec<i32> = (0..reqs).map(|_| rng.random_range(0..6000)).collect();
            let batch: Vec<i32> = (0..t).map(|_| rng.random_range(-1..reqs)).collect();
            let pos: Vec<i32> = batch
                .iter()
                .map(|&b| {
                    if b < 0 {
                        0
                    } else {
                        chunk_start[b as usize] + rng.random_range(0..300)
                    }
                })
                .collect();
            let rows = if ratio == 4 { csa_rows } else { hca_rows };
            let table: Vec<i32> = (0..t * width)
                .map(|_| {
                    if rng.random_bool(0.97) {
                        rng.random_range(0..rows)
                    } else {
                        -1
                    }
                })
                .collect();
            let extend_start: Vec<i32> = (0..reqs).map(|_| rng.random_range(0..1000)).collect();
            let run = |ctx: &Ctx, pool: &Pool| -> Vec<Vec<i32>> {
                let up = |v: &Vec<i32>| Dev::upload(ctx, v);
                let (b, sl, p, cs, es, tb) = (
                    up(&batch),
                    up(&inp.slots),
                    up(&pos),
                    up(&chunk_start),
                    up(&extend_start),
                    up(&table),
                );
                let caps = [t * (32 + width), t * 32];
                let outs: Vec<(Dev, Dev)> = caps
                    .iter()
                    .map(|&cap| (Dev::zeroed(ctx, (t + 1) * 4), Dev::zeroed(ctx, cap * 4)))
                    .collect();
                let args = unikv_prefill_streams_args {
                    struct_size: std::mem::size_of::<unikv_prefill_streams_args>(),
                    batch_id: b.t::<i32>(&[t]),
                    req_slots: sl.t::<i32>(&[reqs as usize]),
                    positions: p.t::<i32>(&[t]),
                    chunk_start: cs.t::<i32>(&[reqs as usize]),
                    extend_start: es.t::<i32>(&[reqs as usize]),
                    page_indices: tb.t::<i32>(&[t, width]),
                    prefix_indptr: outs[0].0.t::<i32>(&[t + 1]),
                    prefix_indices: outs[0].1.t::<i32>(&[caps[0]]),
                    extend_indptr: outs[1].0.t::<i32>(&[t + 1]),
                    extend_indices: outs[1].1.t::<i32>(&[caps[1]]),
                    num_tokens: t as u32,
                    compress_ratio: ratio,
                };
                ok(unsafe { unikv_build_prefill_streams(pool.0, &args, ptr::null_mut()) });
                let mut r = vec![];
                for (a, i) in &outs {
                    let pv = a.read::<i32>();
                    let n = pv[t] as usize;
                    r.push(pv);
                    r.push(i.read::<i32>()[..n].to_vec());
                }
                r
            };
            assert_eq!(
                run(&s.gpu, &pg),
                run(&s.cpu, &pc),
                "prefill streams T={t} ratio {ratio}"
            );
        }
    }
}
