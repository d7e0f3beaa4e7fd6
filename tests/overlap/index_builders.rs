//! Index builders: overlapping streams refused.

use super::*;

fn index_pool(ctx: &Ctx) -> Pool {
    let spec = PoolSpec {
        ratios: vec![0, 4, 128],
        max_requests: 3,
        window: 4,
        spec_extra: 0,
        c128_blocks: 4,
    };
    Pool::new(ctx, &spec)
}

#[test]
fn index_builders_refuse_overlapping_streams() {
    let ctx = Ctx::cpu(1);
    let pool = index_pool(&ctx);
    // Three tokens, window 4, c128 width 2, top-k 8 (tests/bad_input.rs).
    let mut r = Regions::default();
    let (batch, slots, pos, c128) = (r.take(12), r.take(8), r.take(12), r.take(24));
    let outs = [4, 12, 4, 18, 4, 36].map(|n| r.take(n * 4));
    let mut a = Arena::new(&r);
    a.write(batch, &[0i32, 1, -1]);
    a.write(slots, &[1i32, 3]);
    a.write(pos, &[300i32, 7, 0]);
    a.write(c128, &[0i32, 1, 2, 3, 4, 5]);
    let out = |i: usize, n| a.t::<i32>(outs[i], &[n]);
    let decode = unikv_decode_streams_args {
        struct_size: size_of::<unikv_decode_streams_args>(),
        batch_id: a.t::<i32>(batch, &[3]),
        req_slots: a.t::<i32>(slots, &[2]),
        positions: a.t::<i32>(pos, &[3]),
        c128_page_indices: a.t::<i32>(c128, &[3, 2]),
        swa_indptr: out(0, 4),
        swa_indices: out(1, 12),
        hca_indptr: out(2, 4),
        hca_indices: out(3, 18),
        csa_indptr: out(4, 4),
        csa_indices: out(5, 36),
        num_tokens: 3,
        csa_topk: 8,
    };
    let build = |args: unikv_decode_streams_args| unsafe {
        unikv_build_decode_streams(pool.0, &args, ptr::null_mut())
    };
    let hca_indptr = a.t::<i32>(outs[1] + 8, &[4]);
    refused_unchanged(
        &a,
        None,
        || {
            build(unikv_decode_streams_args {
                hca_indptr,
                ..decode
            })
        },
        "swa_indices",
        "hca_indptr",
    );
    let positions = a.t::<i32>(outs[5] + 100, &[3]);
    refused_unchanged(
        &a,
        None,
        || {
            build(unikv_decode_streams_args {
                positions,
                ..decode
            })
        },
        "csa_indices",
        "positions",
    );
    ok(build(decode));

    // fill_csa_tail updates csa_indices in place; its table may not overlap it.
    let mut r = Regions::default();
    let table = r.take(24 * 4);
    let mut t = Arena::new(&r);
    t.write(table, &(0..24).collect::<Vec<i32>>());
    let tail = unikv_csa_tail_args {
        struct_size: size_of::<unikv_csa_tail_args>(),
        batch_id: decode.batch_id,
        positions: decode.positions,
        csa_page_indices: t.t::<i32>(table, &[3, 8]),
        csa_indptr: decode.csa_indptr,
        csa_indices: decode.csa_indices,
        num_tokens: 3,
        reserved: 0,
    };
    let csa_page_indices = a.strided::<i32>(outs[5] + 16, &[3, 8], &[8, 1]);
    refused_unchanged(
        &a,
        None,
        || unsafe {
            unikv_fill_csa_tail(
                pool.0,
                &unikv_csa_tail_args {
                    csa_page_indices,
                    ..tail
                },
                ptr::null_mut(),
            )
        },
        "csa_indices",
        "csa_page_indices",
    );
    // The very same tensor is refused too where no in-place use is allowed.
    let exact = unikv_csa_tail_args {
        csa_indices: tail.csa_indptr,
        ..tail
    };
    refused_unchanged(
        &a,
        None,
        || unsafe { unikv_fill_csa_tail(pool.0, &exact, ptr::null_mut()) },
        "csa_indices",
        "csa_indptr (exactly; in-place use is not supported",
    );
    ok(unsafe { unikv_fill_csa_tail(pool.0, &tail, ptr::null_mut()) });

    // Prefill streams: two tokens of request 0 at slot 2, ratio 4.
    let mut r = Regions::default();
    let (ints, page_table) = (r.take(64), r.take(16));
    let outs = [3, 12, 3, 8].map(|n| r.take(n * 4));
    let mut p = Arena::new(&r);
    // batch_id x2, req_slots, positions x2, chunk_start, extend_start.
    p.write(ints, &[0i32, 0, 2, 10, 11, 10, 0]);
    p.write(page_table, &[0i32, 1, 0, 1]);
    let prefill = unikv_prefill_streams_args {
        struct_size: size_of::<unikv_prefill_streams_args>(),
        batch_id: p.t::<i32>(ints, &[2]),
        req_slots: p.t::<i32>(ints + 8, &[1]),
        positions: p.t::<i32>(ints + 12, &[2]),
        chunk_start: p.t::<i32>(ints + 20, &[1]),
        extend_start: p.t::<i32>(ints + 24, &[1]),
        page_indices: p.t::<i32>(page_table, &[2, 2]),
        prefix_indptr: p.t::<i32>(outs[0], &[3]),
        prefix_indices: p.t::<i32>(outs[1], &[12]),
        extend_indptr: p.t::<i32>(outs[2], &[3]),
        extend_indices: p.t::<i32>(outs[3], &[8]),
        num_tokens: 2,
        compress_ratio: 4,
    };
    let chunk_start = p.t::<i32>(outs[3] + 12, &[1]);
    refused_unchanged(
        &p,
        None,
        || unsafe {
            unikv_build_prefill_streams(
                pool.0,
                &unikv_prefill_streams_args {
                    chunk_start,
                    ..prefill
                },
                ptr::null_mut(),
            )
        },
        "extend_indices",
        "chunk_start",
    );
    ok(unsafe { unikv_build_prefill_streams(pool.0, &prefill, ptr::null_mut()) });
}
