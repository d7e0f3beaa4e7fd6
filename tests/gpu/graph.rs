//! A decode step captured into a CUDA graph and replayed.

use super::*;

/// A full decode step (store, index build, CSA tail, attention on a dense, a CSA
/// and an HCA layer) captured once into a CUDA graph on a test-owned stream and
/// replayed with new positions, padding, empty and > 2048-key slices and new
/// indices written into the same buffers; every replay matches the CPU backend.
#[test]
fn cuda_graph_replays_a_decode_step() {
    use unikv::backend::gpu::devtools::OwnedStream;
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    let spec = PoolSpec {
        ratios: vec![0, 4, 128],
        max_requests: 4,
        window: 128,
        spec_extra: 0,
        c128_blocks: 2400,
    };
    let (pc, pg) = (Pool::new(&s.cpu, &spec), Pool::new(&s.gpu, &spec));
    for layer in 0..3 {
        let rows = pc.layer(layer).rows as usize;
        let data = random_bf16(&mut rng, rows * 512);
        fill_layer(&s.cpu, &pc, layer, &data);
        fill_layer(&s.gpu, &pg, layer, &data);
    }
    let (t, h, reqs, w128, topk) = (6usize, 16usize, 4usize, 2300usize, 64usize);
    let csa_rows = spec.c128_blocks as i32 * 32 + 64;
    let stream = OwnedStream::new(0).unwrap();
    // Device buffers written before every replay, read by the captured graph.
    let g = &s.gpu;
    let dv = |n: usize| Dev::zeroed(g, n);
    let (d_kv, d_batch, d_slots, d_pos, d_c128, d_csa, d_q, d_sink) = (
        dv(t * 512 * 2),
        dv(t * 4),
        dv(reqs * 4),
        dv(t * 4),
        dv(t * w128 * 4),
        dv(t * topk * 4),
        dv(3 * t * h * 512 * 2),
        dv(h * 4),
    );
    let caps = [t * 128, t * (128 + w128), t * (128 + topk)];
    let streams: Vec<(Dev, Dev)> = caps.iter().map(|&c| (dv((t + 1) * 4), dv(c * 4))).collect();
    let outs: Vec<Dev> = (0..3).map(|_| dv(t * h * 512 * 2)).collect();
    let gp = plan(g, true, t, h);
    let stream_args = |ctx_streams: &[(Dev, Dev)], b: &Dev, sl: &Dev, p: &Dev, c128: &Dev| {
        unikv_decode_streams_args {
            struct_size: std::mem::size_of::<unikv_decode_streams_args>(),
            batch_id: b.t::<i32>(&[t]),
            req_slots: sl.t::<i32>(&[reqs]),
            positions: p.t::<i32>(&[t]),
            c128_page_indices: c128.t::<i32>(&[t, w128]),
            swa_indptr: ctx_streams[0].0.t::<i32>(&[t + 1]),
            swa_indices: ctx_streams[0].1.t::<i32>(&[caps[0]]),
            hca_indptr: ctx_streams[1].0.t::<i32>(&[t + 1]),
            hca_indices: ctx_streams[1].1.t::<i32>(&[caps[1]]),
            csa_indptr: ctx_streams[2].0.t::<i32>(&[t + 1]),
            csa_indices: ctx_streams[2].1.t::<i32>(&[caps[2]]),
            num_tokens: t as u32,
            csa_topk: topk as u32,
        }
    };
    // One serving step on `pool`, on `strm`: the sequence the graph captures.
    let step = |pool: &Pool,
                plan: &Plan,
                strm: *mut c_void,
                ins: (&Dev, &Dev, &Dev, &Dev, &Dev, &Dev, &Dev, &Dev),
                sts: &[(Dev, Dev)],
                outs: &[Dev]| {
        let (kv, b, sl, p, c128, csa, q, sink) = ins;
        for layer in 0..3u32 {
            let st = unikv_store_swa_args {
                struct_size: std::mem::size_of::<unikv_store_swa_args>(),
                kv: kv.t::<bf16>(&[t, 512]),
                batch_id: b.t::<i32>(&[t]),
                req_slots: sl.t::<i32>(&[reqs]),
                positions: p.t::<i32>(&[t]),
                final_pos: absent(),
                layer,
                num_tokens: t as u32,
            };
            ok(unsafe { unikv_store_swa(pool.0, &st, strm) });
        }
        let sa = stream_args(sts, b, sl, p, c128);
        ok(unsafe { unikv_build_decode_streams(pool.0, &sa, strm) });
        let tail = unikv_csa_tail_args {
            struct_size: std::mem::size_of::<unikv_csa_tail_args>(),
            batch_id: sa.batch_id,
            positions: sa.positions,
            csa_page_indices: csa.t::<i32>(&[t, topk]),
            csa_indptr: sa.csa_indptr,
            csa_indices: sa.csa_indices,
            num_tokens: t as u32,
            reserved: 0,
        };
        ok(unsafe { unikv_fill_csa_tail(pool.0, &tail, strm) });
        for (layer, out) in outs.iter().enumerate() {
            let (ip, ix) = match layer {
                0 => (sa.swa_indptr, sa.swa_indices),
                1 => (sa.csa_indptr, sa.csa_indices),
                _ => (sa.hca_indptr, sa.hca_indices),
            };
            let mut qd = q.t::<bf16>(&[t, h, 512]);
            qd.data = unsafe { q.ptr.cast::<bf16>().add(layer * t * h * 512).cast() };
            let args = unikv_decode_args {
                struct_size: std::mem::size_of::<unikv_decode_args>(),
                q: qd,
                indices: ix,
                indptr: ip,
                sink: sink.t::<f32>(&[h]),
                out: out.t::<bf16>(&[t, h, 512]),
                lse: absent(),
                layer: layer as u32,
                num_tokens: t as u32,
                softmax_scale: 1.0 / (512f32).sqrt(),
                reserved: 0,
                rope_table: absent(),
                positions: absent(),
                kv: Default::default(),
                extra_kv: Default::default(),
                extra_indices: Default::default(),
                extra_indptr: Default::default(),
            };
            let ws = plan.ws_ptr();
            ok(unsafe {
                unikv_sparse_decode(plan.handle.cast(), pool.0, &args, ws, plan.bytes, strm)
            });
        }
    };
    let ins = (
        &d_kv, &d_batch, &d_slots, &d_pos, &d_c128, &d_csa, &d_q, &d_sink,
    );
    stream.begin_capture().unwrap();
    step(&pg, &gp, stream.raw, ins, &streams, &outs);
    let graph = stream.end_capture().unwrap();

    let cp = plan(&s.cpu, true, t, h);
    let mut positions: Vec<i32> = vec![3, 1000, 130_000, 290_000];
    for replay in 0..4i32 {
        // New inputs each replay: positions advance, the padding moves, one request is empty-ish.
        for p in positions.iter_mut() {
            *p += 1 + replay;
        }
        let pad = (2 * replay as usize) % t; // never request 3's long token
        let batch: Vec<i32> = (0..t)
            .map(|i| if i == pad { -1 } else { (i % reqs) as i32 })
            .collect();
        let slots: Vec<i32> = vec![1, 2, 3, 4];
        let pos: Vec<i32> = (0..t)
            .map(|i| positions[i % reqs] + (i / reqs) as i32)
            .collect();
        // Request i's c128 table: (pos+1)/128 valid entries, a -1 cut on replay 2.
        let mut c128 = vec![-1i32; t * w128];
        for i in 0..t {
            let n = (((pos[i] + 1) / 128) as usize).min(w128);
            let cut = if replay == 2 && i == 1 { 0 } else { n };
            for j in 0..cut {
                c128[i * w128 + j] = ((i % reqs) * 50 + j) as i32 % (spec.c128_blocks as i32 + 2);
            }
        }
        let csa: Vec<i32> = (0..t * topk)
            .map(|_| rng.random_range(0..csa_rows))
            .collect();
        let kv = random_bf16(&mut rng, t * 512);
        let q = random_bf16(&mut rng, 3 * t * h * 512);
        let sink: Vec<f32> = (0..h).map(|_| rng.random_range(-1.0f32..2.0)).collect();
        d_kv.write(&kv);
        d_batch.write(&batch);
        d_slots.write(&slots);
        d_pos.write(&pos);
        d_c128.write(&c128);
        d_csa.write(&csa);
        d_q.write(&q);
        d_sink.write(&sink);
        for o in &outs {
            o.poison();
        }
        ok(unsafe { unikv_stream_synchronize(g.0, ptr::null_mut()) });
        graph.launch(&stream).unwrap();
        ok(unsafe { unikv_stream_synchronize(g.0, stream.raw) });

        // The same step on the CPU backend.
        let c = &s.cpu;
        let up = |v: &[i32]| Dev::upload(c, v);
        let (ckv, cq, csink) = (
            Dev::upload(c, &kv),
            Dev::upload(c, &q),
            Dev::upload(c, &sink),
        );
        let (cb, csl, cpos, cc128, ccsa) = (up(&batch), up(&slots), up(&pos), up(&c128), up(&csa));
        let cstreams: Vec<(Dev, Dev)> = caps
            .iter()
            .map(|&cap| (Dev::zeroed(c, (t + 1) * 4), Dev::zeroed(c, cap * 4)))
            .collect();
        let couts: Vec<Dev> = (0..3).map(|_| Dev::zeroed(c, t * h * 512 * 2)).collect();
        step(
            &pc,
            &cp,
            ptr::null_mut(),
            (&ckv, &cb, &csl, &cpos, &cc128, &ccsa, &cq, &csink),
            &cstreams,
            &couts,
        );
        let lens: Vec<i32> = cstreams[1]
            .0
            .read::<i32>()
            .windows(2)
            .map(|w| w[1] - w[0])
            .collect();
        assert!(
            lens.iter().any(|&l| l > 2048),
            "replay {replay}: HCA lengths {lens:?} include > 2048"
        );
        for layer in 0..3 {
            let got = (outs[layer].read::<bf16>(), vec![0f32; t * h]);
            let want = (couts[layer].read::<bf16>(), vec![0f32; t * h]);
            compare(
                (t, h),
                &got,
                &want,
                &format!("graph replay {replay} layer {layer}"),
            );
        }
        for (i, (gs, cs)) in streams.iter().zip(&cstreams).enumerate() {
            let (gptr, cptr) = (gs.0.read::<i32>(), cs.0.read::<i32>());
            assert_eq!(gptr, cptr, "replay {replay}: indptr of stream {i}");
            let n = cptr[t] as usize;
            assert_eq!(
                gs.1.read::<i32>()[..n],
                cs.1.read::<i32>()[..n],
                "replay {replay}: stream {i}"
            );
        }
    }
    assert_eq!(
        bytes_of(&read_layer(g, &pg, 0)),
        bytes_of(&read_layer(&s.cpu, &pc, 0)),
        "pool after replays"
    );
    drop(graph);
}
