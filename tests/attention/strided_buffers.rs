//! Strided and oversized buffers: only the described elements are read and
//! written.

use super::*;

/// Checks that every element of `buf` outside `written` still holds poison.
fn assert_untouched<T: Copy>(tag: &str, buf: &[T], written: &[bool]) {
    let size = std::mem::size_of::<T>();
    let bytes = bytes_of(buf);
    for (i, w) in written.iter().enumerate() {
        if !w {
            assert!(
                bytes[i * size..(i + 1) * size]
                    .iter()
                    .all(|&x| x == POISON_BYTE),
                "{tag}: element {i} outside the written region changed"
            );
        }
    }
}

/// Strided, longer-than-needed buffers, decode and prefill (H = 16): q and out
/// with padded head and token strides (multiples of 8 elements), extra token
/// rows in q / out / lse, lse with a padded row stride, indptr and indices with
/// garbage entries before indptr[0] (> 0) and past the used ones, extend_kv with a padded row stride and
/// extra rows. Results match the reference; every element of out and lse
/// outside the first num_tokens rows' data (padding, extra rows) keeps its
/// poison. A zero-token decode succeeds and writes nothing.
#[test]
fn strided_and_oversized_buffers() {
    let (mut rng, seed) = seeded("strided_and_oversized_buffers");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    let heads = 16;
    let tokens = 5;
    let lens = ragged_lengths(&mut rng, tokens);
    let sink = random_sink(&mut rng, heads);
    let ql = Layout {
        token: heads * (D + 8) + 64,
        head: D + 8,
    };
    let ol = Layout {
        token: heads * (D + 16) + 128,
        head: D + 16,
    };
    let lse_stride = heads + 3;
    let (q_rows, out_rows, lse_rows) = (tokens + 2, tokens + 3, tokens + 2);
    let q = Buf::from_slice(&random_bf16(&mut rng, ql.len(q_rows, heads)));
    let mut written = vec![false; ol.len(out_rows, heads)];
    let mut lse_written = vec![false; lse_rows * lse_stride];
    for t in 0..tokens {
        for h in 0..heads {
            written[ol.at(t, h)..ol.at(t, h) + D].fill(true);
            lse_written[t * lse_stride + h] = true;
        }
    }

    // Decode.
    let lists: Vec<Vec<i32>> = lens
        .iter()
        .map(|&n| unique_rows(&mut rng, pool.num_rows(), n))
        .collect();
    let (mut indices, mut indptr) = csr(&lists);
    with_leading(&[-1, i32::MAX, -5], &mut indices, &mut indptr);
    indices.extend_from_slice(&[-1, i32::MAX, -5]);
    indptr.extend_from_slice(&[-7, i32::MAX]);
    let mut out = Buf::<bf16>::poisoned(ol.len(out_rows, heads));
    let lse: Vec<f32> = poisoned(lse_rows * lse_stride);
    let plan = DecodePlan::new(&ctx, tokens + 4, heads);
    let args = unikv_decode_args {
        struct_size: std::mem::size_of::<unikv_decode_args>(),
        q: ql.descriptor(q.as_slice(), q_rows, heads),
        indices: vec1(&indices),
        indptr: vec1(&indptr),
        sink: vec1(&sink),
        out: ol.descriptor(out.as_mut_slice(), out_rows, heads),
        lse: strided(&lse, &[lse_rows, heads], &[lse_stride, 1]),
        layer: LAYER,
        num_tokens: tokens as u32,
        softmax_scale: SCALE,
        reserved: 0,
        rope_table: absent(),
        positions: absent(),
        kv: Default::default(),
        extra_kv: Default::default(),
        extra_indices: Default::default(),
        extra_indptr: Default::default(),
    };
    ok(launch_decode(&plan, &pool, &args));
    let tag = format!("seed {seed}, strided decode, lens {lens:?}");
    let keys = decode_keys(&pool, &lists);
    let r = reference(q.as_slice(), ql, heads, &keys, Some(&sink), SCALE);
    check(&tag, &r, out.as_slice(), ol, Some((&lse, lse_stride)));
    assert_untouched(&tag, out.as_slice(), &written);
    assert_untouched(&tag, &lse, &lse_written);

    // Zero tokens: succeeds and writes nothing.
    let mut out = Buf::<bf16>::poisoned(ol.len(out_rows, heads));
    let lse: Vec<f32> = poisoned(lse_rows * lse_stride);
    let zero = unikv_decode_args {
        out: ol.descriptor(out.as_mut_slice(), out_rows, heads),
        lse: strided(&lse, &[lse_rows, heads], &[lse_stride, 1]),
        num_tokens: 0,
        ..args
    };
    ok(launch_decode(&plan, &pool, &zero));
    let nothing = vec![false; out.as_slice().len()];
    assert_untouched(
        &format!("seed {seed}, zero tokens"),
        out.as_slice(),
        &nothing,
    );
    assert_untouched(
        &format!("seed {seed}, zero tokens"),
        &lse,
        &vec![false; lse.len()],
    );

    // Prefill.
    let mut pre = random_prefill_batch(&mut rng, &pool, heads, &lens);
    pre.sink = Some(sink.clone());
    let ext_stride = D + 24;
    let ext_rows = EXTEND_ROWS + 5;
    let ext = Buf::from_slice(&random_bf16(&mut rng, ext_rows * ext_stride));
    let mut s = PrefillStreams::of(&pre);
    with_leading(&[-2, i32::MAX], &mut s.indices, &mut s.indptr);
    with_leading(&[i32::MIN, -2, 7], &mut s.ext_indices, &mut s.ext_indptr);
    s.indices.extend_from_slice(&[-3, i32::MAX]);
    s.indptr.extend_from_slice(&[i32::MIN, 0]);
    s.ext_indices.extend_from_slice(&[i32::MAX, -9]);
    s.ext_indptr.extend_from_slice(&[-1, -1, 5]);
    let mut out = Buf::<bf16>::poisoned(ol.len(out_rows, heads));
    let lse: Vec<f32> = poisoned(lse_rows * lse_stride);
    let pplan = PrefillPlan::new(&ctx, tokens, heads);
    let args = unikv_prefill_args {
        struct_size: std::mem::size_of::<unikv_prefill_args>(),
        q: ql.descriptor(q.as_slice(), q_rows, heads),
        indices: vec1(&s.indices),
        indptr: vec1(&s.indptr),
        sink: vec1(&sink),
        out: ol.descriptor(out.as_mut_slice(), out_rows, heads),
        lse: strided(&lse, &[lse_rows, heads], &[lse_stride, 1]),
        extend_kv: strided(ext.as_slice(), &[ext_rows, D], &[ext_stride, 1]),
        extend_indices: vec1(&s.ext_indices),
        extend_indptr: vec1(&s.ext_indptr),
        layer: LAYER,
        num_tokens: tokens as u32,
        softmax_scale: SCALE,
        reserved: 0,
        kv: Default::default(),
        extend_cache: Default::default(),
    };
    ok(launch_prefill(&pplan, &pool, &args));
    let tag = format!("seed {seed}, strided prefill, prefix lens {lens:?}");
    let keys = prefill_keys(&pool, &pre.lists, ext.as_slice(), ext_stride, &pre.ext);
    let r = reference(q.as_slice(), ql, heads, &keys, Some(&sink), SCALE);
    check(&tag, &r, out.as_slice(), ol, Some((&lse, lse_stride)));
    assert_untouched(&tag, out.as_slice(), &written);
    assert_untouched(&tag, &lse, &lse_written);
}
