//! Attention over FlashMLA caches and scaled FP8 rows (docs/attention.md §6)
//! on the GPU against the CPU backend: the same cache bytes in both contexts,
//! every layout and flavour, head counts 1 to 128 on every kernel family the
//! plans pick (and the fallbacks and portable kernels the test hooks force),
//! two-source decode and prefill, validate mode, and a CUDA graph replayed
//! with new indices.

use super::*;

use crate::layouts::{flashmla_cache, scaled_rows, Cache, Fmt};
use crate::run::{random_lists, Batch, Plan as SourcePlan, Stream as KeyStream, StreamBufs};

/// The caches of one flavour, built on the CPU backend: FlashMLA with each
/// page size (about 2600 tokens each, so slices pass 2048 keys) and scaled
/// rows.
fn caches<'a>(cpu: &'a Ctx, rng: &mut rand::rngs::StdRng, fmt: Fmt) -> Vec<Cache<'a>> {
    let pages = if small() { [40, 3, 2] } else { [1300, 41, 11] };
    let mut out: Vec<Cache> = [2, 64, 256]
        .iter()
        .zip(pages)
        .map(|(&p, n)| flashmla_cache(cpu, rng, fmt, p, n))
        .collect();
    out.push(scaled_rows(cpu, rng, fmt, if small() { 90 } else { 2600 }));
    out
}

/// Lengths up to past 2048 (splits), an empty slice included.
fn lengths() -> &'static [usize] {
    if small() {
        &[0, 1, 33, 70]
    } else {
        &[0, 1, 64, 640, 2176, 2500]
    }
}

/// Decode over `cache` on both backends; compares per (token, head).
fn decode_matches(
    s: &Setup,
    rng: &mut rand::rngs::StdRng,
    cache: &Cache,
    t: usize,
    h: usize,
    what: &str,
) {
    let gcache = cache.copy_to(&s.gpu);
    let lists = random_lists(rng, t, cache.rows, lengths());
    let cb = Batch::new(&s.cpu, rng, t, h);
    let gb = cb.copy_to(&s.gpu);
    let run = |ctx: &Ctx, b: &Batch, c: &Cache| {
        let plan = SourcePlan::for_cache(ctx, false, t, h, Some(c));
        let src = KeyStream {
            kv: c.desc(),
            lists: lists.clone(),
        };
        ok(b.decode(&plan, ptr::null(), 0, &src, None, &|_| {}));
        b.outputs()
    };
    let want = run(&s.cpu, &cb, cache);
    let got = run(&s.gpu, &gb, &gcache);
    compare((t, h), &got, &want, what);
}

#[test]
fn decode_over_each_layout_matches_cpu() {
    let Some(s) = setup() else { return };
    let (mut rng, _) = seeded("decode_over_each_layout_matches_cpu");
    let heads: &[usize] = if small() {
        &[1, 16, 64]
    } else {
        &[1, 3, 16, 32, 40, 64, 100, 128]
    };
    for fmt in Fmt::ALL {
        for cache in caches(&s.cpu, &mut rng, fmt) {
            for &h in heads {
                let t = if h >= 64 { 3 } else { 5 };
                let what = format!("{fmt:?} {:?} P={} H={h}", cache.layout, cache.page_size);
                decode_matches(&s, &mut rng, &cache, t, h, &what);
            }
        }
    }
}

/// The kernels a plan does not pick on an H200 by itself: mma.sync without
/// clusters (sm_80's path, cp.async gathers) and the portable kernels (the
/// HIP build's).
#[cfg(feature = "test-hooks")]
#[test]
fn fallback_and_portable_kernels_read_each_layout() {
    use unikv::ffi::test_hooks::{gpu_plan_fallbacks, gpu_plan_portable, PortableKernel};
    let Some(s) = setup() else { return };
    let (mut rng, _) = seeded("fallback_and_portable_kernels_read_each_layout");
    for fmt in Fmt::ALL {
        let caches = caches(&s.cpu, &mut rng, fmt);
        for (name, fallbacks, portable) in [
            ("mma.sync, workspace combine", true, PortableKernel::Off),
            ("portable scalar", false, PortableKernel::Scalar),
            ("portable matrix", false, PortableKernel::Matrix),
        ] {
            gpu_plan_fallbacks(fallbacks, fallbacks);
            gpu_plan_portable(portable);
            for cache in &caches {
                for h in [16, 64] {
                    let what = format!(
                        "{fmt:?} {:?} P={} H={h} ({name})",
                        cache.layout, cache.page_size
                    );
                    decode_matches(&s, &mut rng, cache, 2, h, &what);
                }
            }
        }
        gpu_plan_fallbacks(false, false);
        gpu_plan_portable(PortableKernel::Off);
    }
}

/// FlashMLA's two-cache decode, scaled rows in both decode sources, and
/// prefill over a cache prefix with bf16 or cache extend rows (-1 skipped).
#[test]
fn two_source_calls_match_cpu() {
    let Some(s) = setup() else { return };
    let (mut rng, _) = seeded("two_source_calls_match_cpu");
    for fmt in Fmt::ALL {
        let caches = caches(&s.cpu, &mut rng, fmt);
        let pairs = [
            (&caches[2], &caches[1]),
            (&caches[3], &caches[3]),
            (&caches[0], &caches[2]),
        ];
        for h in [8, 64, 128] {
            let t = 4;
            for (i, (a, b)) in pairs.iter().enumerate() {
                let (ga, gb) = (a.copy_to(&s.gpu), b.copy_to(&s.gpu));
                let la = random_lists(&mut rng, t, a.rows, &[0, 128, 100]);
                let lb = random_lists(&mut rng, t, b.rows, lengths());
                let cb = Batch::new(&s.cpu, &mut rng, t, h);
                let gbatch = cb.copy_to(&s.gpu);
                let decode = |ctx: &Ctx, batch: &Batch, x: &Cache, y: &Cache| {
                    let plan = SourcePlan::for_cache(ctx, false, t, h, Some(x));
                    let sx = KeyStream {
                        kv: x.desc(),
                        lists: la.clone(),
                    };
                    let sy = KeyStream {
                        kv: y.desc(),
                        lists: lb.clone(),
                    };
                    ok(batch.decode(&plan, ptr::null(), 0, &sx, Some(&sy), &|_| {}));
                    batch.outputs()
                };
                let want = decode(&s.cpu, &cb, a, b);
                let got = decode(&s.gpu, &gbatch, &ga, &gb);
                compare(
                    (t, h),
                    &got,
                    &want,
                    &format!("{fmt:?} two-source decode {i} H={h}"),
                );

                // Prefill: a's prefix and b's rows as the extend source, with
                // -1 entries; then b's rows as bf16 extend_kv.
                let skip = |l: &Vec<Vec<i32>>| -> Vec<Vec<i32>> {
                    l.iter()
                        .map(|v| {
                            v.iter()
                                .enumerate()
                                .map(|(j, &x)| if j % 5 == 2 { -1 } else { x })
                                .collect()
                        })
                        .collect()
                };
                let (pa, pb) = (skip(&la), skip(&lb));
                let ext_rows: Vec<bf16> = (0..b.rows).flat_map(|r| b.bf16_row(r)).collect();
                let prefill = |ctx: &Ctx, batch: &Batch, x: &Cache, y: &Cache, bf16_ext: bool| {
                    let plan = SourcePlan::for_cache(ctx, true, t, h, Some(x));
                    let ext = Dev::upload(ctx, &ext_rows);
                    let sx = KeyStream {
                        kv: x.desc(),
                        lists: pa.clone(),
                    };
                    let (sy, ext_kv) = if bf16_ext {
                        let d = ext.t::<bf16>(&[y.rows, 512]);
                        (
                            KeyStream {
                                kv: Default::default(),
                                lists: pb.clone(),
                            },
                            d,
                        )
                    } else {
                        (
                            KeyStream {
                                kv: y.desc(),
                                lists: pb.clone(),
                            },
                            absent(),
                        )
                    };
                    batch.poison();
                    ok(batch.prefill(&plan, ptr::null(), 0, &sx, &sy, ext_kv, &|_| {}));
                    batch.outputs()
                };
                for bf16_ext in [false, true] {
                    let want = prefill(&s.cpu, &cb, a, b, bf16_ext);
                    let got = prefill(&s.gpu, &gbatch, &ga, &gb, bf16_ext);
                    let what = format!("{fmt:?} prefill {i} H={h} bf16 extend {bf16_ext}");
                    compare((t, h), &got, &want, &what);
                }
            }
        }
    }
}

/// Validate mode checks every index against the cache's token slots before
/// launching; without it the kernels skip such a key (here against the CPU
/// backend's prefill, which skips -1 where the GPU call had a bad index).
#[test]
fn out_of_range_keys_in_validate_mode_and_without() {
    let Some(s) = setup() else { return };
    let (mut rng, _) = seeded("out_of_range_keys_in_validate_mode_and_without");
    let strict = validating_gpu();
    let (t, h) = (3, 16);
    for cache in caches(&s.cpu, &mut rng, Fmt::Fn) {
        let mut lists = random_lists(&mut rng, t, cache.rows, &[5, 60]);
        lists[1][2] = cache.rows as i32;
        let vcache = cache.copy_to(&strict);
        let batch = Batch::new(&strict, &mut rng, t, h);
        let plan = SourcePlan::for_cache(&strict, false, t, h, Some(&vcache));
        let src = KeyStream {
            kv: vcache.desc(),
            lists: lists.clone(),
        };
        let before = batch.outputs();
        let status = batch.decode(&plan, ptr::null(), 0, &src, None, &|_| {});
        fails(status, UNIKV_OUT_OF_RANGE, "indices[");
        assert!(
            batch.outputs() == before,
            "{:?}: written in validate mode",
            cache.layout
        );

        // Without validate mode: prefill over [bad index] + extend equals the
        // CPU's prefill with -1 in its place.
        let gcache = cache.copy_to(&s.gpu);
        let gb = batch.copy_to(&s.gpu);
        let cb = batch.copy_to(&s.cpu);
        let ext: Vec<bf16> = random_bf16(&mut rng, 8 * 512);
        let ext_lists = vec![vec![1, 2], vec![3], vec![]];
        let run = |ctx: &Ctx, b: &Batch, c: &Cache, keys: Vec<Vec<i32>>| {
            let plan = SourcePlan::for_cache(ctx, true, t, h, Some(c));
            let e = Dev::upload(ctx, &ext);
            let sx = KeyStream {
                kv: c.desc(),
                lists: keys,
            };
            let sy = KeyStream {
                kv: Default::default(),
                lists: ext_lists.clone(),
            };
            ok(b.prefill(
                &plan,
                ptr::null(),
                0,
                &sx,
                &sy,
                e.t::<bf16>(&[8, 512]),
                &|_| {},
            ));
            b.outputs()
        };
        let mut skipped = lists.clone();
        skipped[1][2] = -1;
        let want = run(&s.cpu, &cb, &cache, skipped);
        let got = run(&s.gpu, &gb, &gcache, lists);
        compare(
            (t, h),
            &got,
            &want,
            &format!("{:?}: a key past the cache skipped", cache.layout),
        );
    }
}

/// Decode over FlashMLA's two caches captured once into a CUDA graph and
/// replayed with new indices, lengths and queries written into the same
/// buffers; every replay matches the CPU backend.
#[test]
fn graph_replays_decode_over_flashmla_caches() {
    use unikv::backend::gpu::devtools::OwnedStream;
    let Some(s) = setup() else { return };
    let (mut rng, _) = seeded("graph_replays_decode_over_flashmla_caches");
    for fmt in Fmt::ALL {
        let window = flashmla_cache(&s.cpu, &mut rng, fmt, 256, 2);
        let compressed = flashmla_cache(&s.cpu, &mut rng, fmt, 64, if small() { 4 } else { 40 });
        let (gw, gc) = (window.copy_to(&s.gpu), compressed.copy_to(&s.gpu));
        let (t, h, topk) = (5usize, 64usize, if small() { 64 } else { 2048 });
        let g = &s.gpu;
        // Buffers the graph reads: q, sink, and per source indptr + indices at
        // their capacities.
        let (q, sink, out, lse) = (
            Dev::zeroed(g, t * h * 512 * 2),
            Dev::zeroed(g, h * 4),
            Dev::zeroed(g, t * h * 512 * 2),
            Dev::zeroed(g, t * h * 4),
        );
        let caps = [t * 128, t * topk];
        let bufs: Vec<(Dev, Dev)> = caps
            .iter()
            .map(|&c| (Dev::zeroed(g, (t + 1) * 4), Dev::zeroed(g, c * 4)))
            .collect();
        let plan = SourcePlan::for_cache(g, false, t, h, Some(&gw));
        let ws = crate::run::Workspace::of(g, &plan);
        let SourcePlan::Decode(handle) = &plan else {
            unreachable!()
        };
        let handle = *handle;
        let args = unikv_decode_args {
            struct_size: std::mem::size_of::<unikv_decode_args>(),
            q: q.t::<bf16>(&[t, h, 512]),
            indices: bufs[0].1.t::<i32>(&[caps[0]]),
            indptr: bufs[0].0.t::<i32>(&[t + 1]),
            sink: sink.t::<f32>(&[h]),
            out: out.t::<bf16>(&[t, h, 512]),
            lse: lse.t::<f32>(&[t, h]),
            layer: 0,
            num_tokens: t as u32,
            softmax_scale: crate::SCALE,
            reserved: 0,
            rope_table: absent(),
            positions: absent(),
            kv: gw.desc(),
            extra_kv: gc.desc(),
            extra_indices: bufs[1].1.t::<i32>(&[caps[1]]),
            extra_indptr: bufs[1].0.t::<i32>(&[t + 1]),
        };
        let stream = OwnedStream::new(0).unwrap();
        stream.begin_capture().unwrap();
        ok(unsafe {
            unikv_sparse_decode(handle, ptr::null(), &args, ws.ptr(), ws.bytes, stream.raw)
        });
        let graph = stream.end_capture().unwrap();
        for replay in 0..3 {
            let lw = random_lists(&mut rng, t, window.rows, &[0, 1, 128]);
            let lc = random_lists(&mut rng, t, compressed.rows, &[0, 7, topk]);
            let cb = Batch::new(&s.cpu, &mut rng, t, h);
            for (buf, lists) in bufs.iter().zip([&lw, &lc]) {
                let sb = StreamBufs::new(&s.cpu, lists);
                buf.0.write(&sb.indptr.read::<i32>()[..t + 1]);
                buf.1.write(&sb.indices.read::<i32>()[..sb.len]);
            }
            q.write(&cb.q_host);
            sink.write(&cb.sink_host);
            out.poison();
            lse.poison();
            ok(unsafe { unikv_stream_synchronize(g.0, ptr::null_mut()) });
            graph.launch(&stream).unwrap();
            ok(unsafe { unikv_stream_synchronize(g.0, stream.raw) });
            let got = (out.read::<bf16>(), lse.read::<f32>());

            let cplan = SourcePlan::for_cache(&s.cpu, false, t, h, Some(&window));
            let sw = KeyStream {
                kv: window.desc(),
                lists: lw,
            };
            let sc = KeyStream {
                kv: compressed.desc(),
                lists: lc,
            };
            ok(cb.decode(&cplan, ptr::null(), 0, &sw, Some(&sc), &|_| {}));
            compare(
                (t, h),
                &got,
                &cb.outputs(),
                &format!("{fmt:?} graph replay {replay}"),
            );
        }
    }
}
