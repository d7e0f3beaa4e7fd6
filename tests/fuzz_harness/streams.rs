//! Index-stream builders: build_decode_streams, fill_csa_tail and
//! build_prefill_streams. After a success (on a backend that checked the
//! values, or with honest values) every stream's indptr is monotone within
//! its indices buffer, every written index is in range (-1 only where the
//! stream may skip), nothing is written past the stream's end, and the
//! slice lengths are the documented ones.

use std::ptr;

use unikv::ffi::index::*;
use unikv::ffi::pool::unikv_pool;

use super::call::{with_struct, Call, Fill, Role, Spec, POISON_I32};
use super::stores::{
    absent, batch_ids, count, position, positions, req_slots, scalar, scalar_past, slack, tokens,
    IDX,
};
use super::{Cursor, StreamsMemo, World};

/// A pool for a stream call (no layer argument).
pub(super) fn pool_of(
    w: &mut World,
    c: &mut Cursor,
    call: &mut Call,
) -> Option<(usize, *const unikv_pool)> {
    let i = w.pick_pool(c)?;
    call.validates = w.pools[i].validates;
    // A pool without compressed layers accepts any c128_blocks; the stream
    // builders then refuse a pool whose CSA row ids (the most of any ratio)
    // would pass 2^31 - 1, whatever the call's own ratio.
    let p = &w.pools[i];
    if p.swa_rows() + p.compressed(4) > i32::MAX as usize {
        call.honest_must_pass = false;
    }
    let h = w.handle(c, call, w.pools[i].h.cast());
    Some((i, h.cast_const().cast()))
}

/// Checks one stream written by a successful call. `lens`: the expected
/// slice length of each token, when known. `bound`: indices are below it;
/// `minus_one`: -1 may be written; `unwritten_ok`: poison may remain
/// inside the stream (a CSA slice's tail before fill_csa_tail); `before`:
/// the indices were updated in place, and only changed entries are checked
/// inside the stream (none may change outside it).
#[allow(clippy::too_many_arguments)]
fn check_stream(
    call: &Call,
    what: &str,
    indptr_arg: usize,
    indices_arg: usize,
    t: usize,
    lens: Option<&[i64]>,
    bound: i64,
    minus_one: bool,
    unwritten_ok: bool,
    before: Option<&[i64]>,
) {
    let name = call.name;
    let ip = call.ints_after(indptr_arg);
    let idx = call.ints_after(indices_arg);
    assert!(
        ip.len() > t,
        "{name}: {what} indptr shorter than num_tokens + 1"
    );
    assert!(ip[0] >= 0, "{name}: {what} indptr[0] = {}", ip[0]);
    for k in 0..t {
        assert!(
            ip[k] <= ip[k + 1],
            "{name}: {what} indptr not monotone at {k}: {:?}",
            &ip[..=t]
        );
        if let Some(lens) = lens {
            assert_eq!(
                ip[k + 1] - ip[k],
                lens[k],
                "{name}: {what} slice {k} length; indptr {:?}",
                &ip[..=t]
            );
        }
    }
    let end = ip[t] as usize;
    assert!(
        end <= idx.len(),
        "{name}: {what} indptr[{t}] = {end} past {} indices",
        idx.len()
    );
    for (j, &v) in idx.iter().enumerate() {
        if j >= ip[0] as usize && j < end {
            // An in-place update (fill_csa_tail) answers only for what it wrote.
            let kept = before.is_some_and(|b| b[j] == v);
            let ok = (0..bound).contains(&v)
                || (minus_one && v == -1)
                || (unwritten_ok && v == POISON_I32 as i64)
                || kept;
            assert!(
                ok,
                "{name}: {what} index {j} = {v} (bound {bound}); indptr {:?}",
                &ip[..=t]
            );
        } else if let Some(before) = before {
            assert_eq!(
                v, before[j],
                "{name}: {what} index {j} outside the stream was changed"
            );
        } else {
            assert_eq!(
                v, POISON_I32 as i64,
                "{name}: {what} index {j} written outside the stream"
            );
        }
    }
}

/// Front-packed page-index rows of width `w`: row k holds `valid[k]`
/// indices below `bound`, then -1.
fn page_table(
    c: &mut Cursor,
    rows: usize,
    width: usize,
    valid: &[usize],
    bound: usize,
) -> Vec<i64> {
    let mut v = Vec::with_capacity(rows * width);
    for r in 0..rows {
        let n = valid.get(r).copied().unwrap_or(0).min(width);
        for j in 0..width {
            v.push(if j < n && bound > 0 {
                c.below(bound) as i64
            } else {
                -1
            });
        }
    }
    v
}

pub fn decode_streams(w: &mut World, c: &mut Cursor) {
    let mut call = w.call("unikv_build_decode_streams", true);
    call.honest_must_pass = true;
    let Some((i, h)) = pool_of(w, c, &mut call) else {
        return;
    };
    let p = &w.pools[i];
    let (win, swa_rows) = (p.window as usize, p.swa_rows() as i64);
    let hca_bound = swa_rows + p.compressed(128) as i64;
    let c128_pages = p.compressed(128);
    let n = tokens(c);
    let held = n + slack(c);
    let requests = c.range(1, 3);
    let slots = req_slots(w, c, i, requests);
    let bid = batch_ids(c, held, requests);
    let pos = positions(c, held);
    let width = c.below(4);
    let topk = c.range(1, 8);
    let batch_id = call.tensor(
        c,
        Spec::new("batch_id", IDX, &[held], Role::In, Fill::Ints(bid.clone())),
    );
    let req_slots = call.tensor(
        c,
        Spec::new("req_slots", IDX, &[requests], Role::In, Fill::Ints(slots)),
    );
    let positions = call.tensor(
        c,
        Spec::new("positions", IDX, &[held], Role::In, Fill::Ints(pos.clone())),
    );
    let valid: Vec<usize> = pos
        .iter()
        .map(|&q| {
            ((q as usize + 1) / 128)
                .min(width)
                .saturating_sub(c.below(2))
        })
        .collect();
    let c128 = if c.chance(220) {
        let table = page_table(c, held, width, &valid, c128_pages);
        call.tensor(
            c,
            Spec::new(
                "c128_page_indices",
                IDX,
                &[held, width],
                Role::In,
                Fill::Ints(table),
            )
            .pad()
            .optional(),
        )
    } else {
        absent()
    };
    let width = if c128.data.is_null() { 0 } else { width };
    let extra = slack(c);
    let out = |call: &mut Call, c: &mut Cursor, name, per: usize| {
        let ip = call.args.len();
        let name_ip: &'static str = name;
        let indptr = call.tensor(
            c,
            Spec::new(name_ip, IDX, &[n + 1 + extra], Role::Out, Fill::Poison),
        );
        let indices = call.tensor(
            c,
            Spec::new("indices", IDX, &[n * per + extra], Role::Out, Fill::Poison),
        );
        (ip, indptr, indices)
    };
    let (swa_ip, swa_indptr, swa_indices) = out(&mut call, c, "swa_indptr", win);
    let (hca_ip, hca_indptr, hca_indices) = out(&mut call, c, "hca_indptr", win + width);
    let (csa_ip, csa_indptr, csa_indices) = out(&mut call, c, "csa_indptr", win + topk);
    let csa_topk = if n > 0 {
        scalar_past(
            c,
            &mut call,
            topk as u32,
            &[topk as u32 + 1 + extra as u32, u32::MAX],
            "csa_topk past the capacity",
        )
    } else {
        topk as u32
    };
    let args = unikv_decode_streams_args {
        struct_size: std::mem::size_of::<unikv_decode_streams_args>(),
        batch_id,
        req_slots,
        positions,
        c128_page_indices: c128,
        swa_indptr,
        swa_indices,
        hca_indptr,
        hca_indices,
        csa_indptr,
        csa_indices,
        num_tokens: count(c, &mut call, n, held),
        csa_topk,
    };
    let s = with_struct(c, &mut call, args, |a| unsafe {
        unikv_build_decode_streams(h, a, ptr::null_mut())
    });
    if !call.finish(s) || call.aliased || !call.contents_trusted() {
        return;
    }
    // The values the call saw (the cursor may have changed a few).
    let (bid, pos) = (call.ints_before(0), call.ints_before(2));
    let real = |k: usize| bid[k] >= 0;
    let swa: Vec<i64> = (0..n)
        .map(|k| {
            if real(k) {
                (pos[k] + 1).min(win as i64)
            } else {
                0
            }
        })
        .collect();
    let csa: Vec<i64> = (0..n)
        .map(|k| {
            if real(k) {
                swa[k] + ((pos[k] + 1) / 4).min(csa_topk as i64)
            } else {
                0
            }
        })
        .collect();
    check_stream(
        &call,
        "swa",
        swa_ip,
        swa_ip + 1,
        n,
        Some(&swa),
        swa_rows,
        false,
        false,
        None,
    );
    check_stream(
        &call,
        "hca",
        hca_ip,
        hca_ip + 1,
        n,
        None,
        hca_bound,
        false,
        false,
        None,
    );
    check_stream(
        &call,
        "csa",
        csa_ip,
        csa_ip + 1,
        n,
        Some(&csa),
        swa_rows,
        false,
        true,
        None,
    );
    w.memo = Some(StreamsMemo {
        pool: i,
        batch_id: bid[..n].to_vec(),
        positions: pos[..n].to_vec(),
        csa_topk: csa_topk as usize,
        csa_indptr: call.ints_after(csa_ip),
        csa_indices: call.ints_after(csa_ip + 1),
    });
}

pub fn csa_tail(w: &mut World, c: &mut Cursor) {
    let mut call = w.call("unikv_fill_csa_tail", true);
    call.honest_must_pass = true;
    let Some((i, h)) = pool_of(w, c, &mut call) else {
        return;
    };
    let p = &w.pools[i];
    let (win, swa_rows) = (p.window as i64, p.swa_rows() as i64);
    let pages = p.compressed(4);
    let memo = w.memo.as_ref().filter(|m| m.pool == i && c.chance(220));
    let (bid, pos, topk, indptr, indices) = match memo {
        Some(m) => (
            m.batch_id.clone(),
            m.positions.clone(),
            m.csa_topk,
            m.csa_indptr.clone(),
            m.csa_indices.clone(),
        ),
        None => {
            let n = tokens(c);
            let bid = batch_ids(c, n, 2);
            let pos: Vec<i64> = (0..n).map(|_| position(c)).collect();
            let topk = c.range(1, 8);
            let mut indptr = vec![0i64];
            for k in 0..n {
                let len = if bid[k] < 0 {
                    0
                } else {
                    (pos[k] + 1).min(win) + ((pos[k] + 1) / 4).min(topk as i64)
                };
                indptr.push(indptr[k] + len);
            }
            let total = indptr[n] as usize;
            (
                bid,
                pos,
                topk,
                indptr,
                vec![POISON_I32 as i64; total + c.below(3)],
            )
        }
    };
    let n = bid.len();
    let held = n + slack(c);
    let mut bid_h = bid.clone();
    let mut pos_h = pos.clone();
    bid_h.resize(held, -1);
    pos_h.resize(held, 0);
    let width = topk + c.below(2);
    let valid: Vec<usize> = pos_h
        .iter()
        .map(|&q| ((q.max(0) as usize).saturating_add(1) / 4).min(topk))
        .collect();
    let table = page_table(c, held, width, &valid, pages);
    let batch_id = call.tensor(
        c,
        Spec::new("batch_id", IDX, &[held], Role::In, Fill::Ints(bid_h)),
    );
    let positions = call.tensor(
        c,
        Spec::new("positions", IDX, &[held], Role::In, Fill::Ints(pos_h)),
    );
    let csa_page_indices = call.tensor(
        c,
        Spec::new(
            "csa_page_indices",
            IDX,
            &[held, width],
            Role::In,
            Fill::Ints(table),
        )
        .pad(),
    );
    let ip_arg = call.args.len();
    let csa_indptr = call.tensor(
        c,
        Spec::new(
            "csa_indptr",
            IDX,
            &[indptr.len()],
            Role::In,
            Fill::Ints(indptr),
        ),
    );
    let csa_indices = call.tensor(
        c,
        Spec::new(
            "csa_indices",
            IDX,
            &[indices.len()],
            Role::InOut,
            Fill::Ints(indices),
        ),
    );
    let args = unikv_csa_tail_args {
        struct_size: std::mem::size_of::<unikv_csa_tail_args>(),
        batch_id,
        positions,
        csa_page_indices,
        csa_indptr,
        csa_indices,
        num_tokens: count(c, &mut call, n, held),
        reserved: scalar(c, &mut call, 0, &[1, u32::MAX], "reserved"),
    };
    let s = with_struct(c, &mut call, args, |a| unsafe {
        unikv_fill_csa_tail(h, a, ptr::null_mut())
    });
    if !call.finish(s) || call.aliased || !call.contents_trusted() {
        return;
    }
    let bound = swa_rows + pages as i64;
    let before = call.ints_before(ip_arg + 1);
    check_stream(
        &call,
        "csa",
        ip_arg,
        ip_arg + 1,
        n,
        None,
        bound,
        false,
        true,
        Some(&before),
    );
}

pub fn prefill_streams(w: &mut World, c: &mut Cursor) {
    let mut call = w.call("unikv_build_prefill_streams", true);
    let Some((i, h)) = pool_of(w, c, &mut call) else {
        return;
    };
    let p = &w.pools[i];
    let (win, swa_rows) = (p.window as usize, p.swa_rows() as i64);
    let ratio = c.pick(&[0, 4, 128]);
    let pages = p.compressed(ratio);
    let requests = c.range(1, 2);
    // Each request's chunk: consecutive positions from chunk_start, its
    // extend rows from extend_start; padding tokens last.
    let mut bid = Vec::new();
    let mut pos = Vec::new();
    let mut chunk_start = Vec::new();
    let mut extend_start = Vec::new();
    for b in 0..requests {
        let len = c.range(if b == 0 { 1 } else { 0 }, 2);
        let start = position(c);
        chunk_start.push(start);
        extend_start.push(bid.len() as i64);
        for k in 0..len {
            bid.push(b as i64);
            pos.push(start + k as i64);
        }
    }
    if c.chance(40) {
        bid.push(-1);
        pos.push(0);
    }
    let n = bid.len();
    let held = n + slack(c);
    bid.resize(held, -1);
    pos.resize(held, 0);
    let slots = req_slots(w, c, i, requests);
    let width = c.range(1, 3);
    let valid: Vec<usize> = pos
        .iter()
        .map(|&q| ((q as usize + 1) / if ratio == 0 { 1 } else { ratio as usize }).min(width))
        .collect();
    let table = page_table(c, held, width, &valid, pages);
    let batch_id = call.tensor(
        c,
        Spec::new("batch_id", IDX, &[held], Role::In, Fill::Ints(bid)),
    );
    let req_slots = call.tensor(
        c,
        Spec::new("req_slots", IDX, &[requests], Role::In, Fill::Ints(slots)),
    );
    let positions = call.tensor(
        c,
        Spec::new("positions", IDX, &[held], Role::In, Fill::Ints(pos)),
    );
    let chunk_start = call.tensor(
        c,
        Spec::new(
            "chunk_start",
            IDX,
            &[requests],
            Role::In,
            Fill::Ints(chunk_start),
        ),
    );
    let extend_start = call.tensor(
        c,
        Spec::new(
            "extend_start",
            IDX,
            &[requests],
            Role::In,
            Fill::Ints(extend_start),
        ),
    );
    let mut spec = Spec::new(
        "page_indices",
        IDX,
        &[held, width],
        Role::In,
        Fill::Ints(table),
    )
    .pad();
    if ratio == 0 {
        spec = spec.unchecked();
    }
    let page_indices = call.tensor(c, spec);
    let extra = slack(c);
    let pre_ip = call.args.len();
    let prefix_indptr = call.tensor(
        c,
        Spec::new(
            "prefix_indptr",
            IDX,
            &[n + 1 + extra],
            Role::Out,
            Fill::Poison,
        ),
    );
    let prefix_indices = call.tensor(
        c,
        Spec::new(
            "prefix_indices",
            IDX,
            &[n * (win + width) + extra],
            Role::Out,
            Fill::Poison,
        ),
    );
    let ext_ip = call.args.len();
    let extend_indptr = call.tensor(
        c,
        Spec::new(
            "extend_indptr",
            IDX,
            &[n + 1 + extra],
            Role::Out,
            Fill::Poison,
        ),
    );
    let extend_indices = call.tensor(
        c,
        Spec::new(
            "extend_indices",
            IDX,
            &[n * win + extra],
            Role::Out,
            Fill::Poison,
        ),
    );
    let compress_ratio = scalar(
        c,
        &mut call,
        ratio,
        &[1, 2, 5, 64, u32::MAX],
        "bad compress_ratio",
    );
    let args = unikv_prefill_streams_args {
        struct_size: std::mem::size_of::<unikv_prefill_streams_args>(),
        batch_id,
        req_slots,
        positions,
        chunk_start,
        extend_start,
        page_indices,
        prefix_indptr,
        prefix_indices,
        extend_indptr,
        extend_indices,
        num_tokens: count(c, &mut call, n, held),
        compress_ratio,
    };
    let s = with_struct(c, &mut call, args, |a| unsafe {
        unikv_build_prefill_streams(h, a, ptr::null_mut())
    });
    if !call.finish(s) || call.aliased || !call.contents_trusted() {
        return;
    }
    let bound = swa_rows + pages as i64;
    check_stream(
        &call,
        "prefix",
        pre_ip,
        pre_ip + 1,
        n,
        None,
        bound,
        true,
        false,
        None,
    );
    let extend_rows = if call.bad_contents {
        i64::MAX
    } else {
        n as i64
    };
    check_stream(
        &call,
        "extend",
        ext_ip,
        ext_ip + 1,
        n,
        None,
        extend_rows,
        true,
        false,
        None,
    );
}
