//! The KV compressor (`unikv_compress_decode` / `_prefill`, the pool's
//! compressor state and its queries) on the CPU backend through the C ABI.
//!
//! * Every stored group against the float64 reference of `reference.rs`
//!   (docs/compressor.md §2), per group: ‖out − ref‖ / ‖ref‖ below 4e-3 for
//!   bf16 rows (the bf16 rounding is 2^-9 per element) and 5e-2 for FP8 (3
//!   mantissa bits), on fresh random inputs (seed printed, replay with
//!   UNIKV_TEST_SEED); outputs are poisoned before each call and bytes that no
//!   group owns must stay poisoned.
//! * Equivalences, bit for bit (pooled values are exact functions of the raw
//!   rows whatever call they come through): one prefill chunk = every split
//!   into two (and, for ratio 4, three) chunks = a prefix then decode token by
//!   token; bf16 `kv_score` = its f32 widening; padding tokens change nothing;
//!   a speculative append rolled back by length = never appended; FP8 pool rows
//!   = `unikv_store_compressed` of the bf16 rows, FlashMLA = `unikv_store_flashmla`,
//!   indexer keys = `unikv_indexer_prepare_k` of the pooled key.
//! * The state: each request's last `ring` raw rows exactly, empty rows
//!   elsewhere, cleared on release; group 0 of ratio 4 never reads its
//!   (masked) overlap rows.
//! * Bad input of every argument class: the status, a message naming the
//!   argument, and not one byte of the state or the target written.

#[path = "../common/mod.rs"]
mod common;
mod harness;
mod reference;

use std::ptr;

use common::cache_store::{strided, HostBytes};
use common::*;
use half::bf16;
use harness::*;
use rand::Rng;
use unikv::cache_layouts::flashmla::FlashMlaGeometry;
use unikv::cache_layouts::indexer::IndexerGeometry;
use unikv::ffi::compressor::*;
use unikv::ffi::pool::*;
use unikv::ffi::sizes::*;
use unikv::ffi::types::unikv_dtype;
use unikv::fp8::Fp8Format;

const BF16: unikv_dtype = unikv_dtype::UNIKV_DTYPE_BF16;

/// A prefill of `lens[b]` tokens of request b (slot b + 1) from position 0,
/// in one call, requests one after the other.
fn full_prefill(kind: Kind, rows: &[Vec<Vec<f32>>], lens: &[usize]) -> Vec<Tok> {
    let mut toks = Vec::new();
    for (b, &len) in lens.iter().enumerate() {
        toks.extend((0..len).map(|p| tok(kind, b, p, &rows[b])));
    }
    toks
}

const SLOTS: [i32; 3] = [1, 2, 3];

/// Groups closed at or before each request's length, as (request, group).
fn groups(kind: Kind, lens: &[usize]) -> Vec<(usize, usize)> {
    lens.iter()
        .enumerate()
        .flat_map(|(b, &len)| (0..len / kind.ratio()).map(move |n| (b, n)))
        .collect()
}

fn check_reference(
    setup: &Setup,
    model: &Model,
    target: &Target,
    rows: &[Vec<Vec<f32>>],
    lens: &[usize],
    tol: f64,
) {
    let kind = model.kind;
    for (b, n) in groups(kind, lens) {
        let want = model.reference(&rows[b], n);
        let got = setup.stored(kind, target, kind.loc(b, n));
        let err = reference::relative_error(&got, &want);
        assert!(
            err < tol,
            "{kind:?} request {b} group {n}: relative error {err} >= {tol}"
        );
    }
}

#[test]
fn stored_groups_match_the_float64_reference() {
    let (mut rng, _) = seeded("stored_groups_match_the_float64_reference");
    let fp8 = [
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ,
    ];
    let mut cases: Vec<(Kind, unikv_dtype, Target, f64)> = vec![
        (CSA_KV, BF16, Target::Pool, 4e-3),
        (HCA_KV, BF16, Target::Pool, 4e-3),
        (CSA_KV, BF16, Target::flashmla(Fp8Format::E4m3Fn), 5e-2),
        (HCA_KV, BF16, Target::flashmla(Fp8Format::E4m3Fnuz), 5e-2),
        (CSA_INDEXER, BF16, Target::indexer(Fp8Format::E4m3Fn), 5e-2),
        (
            CSA_INDEXER,
            BF16,
            Target::indexer(Fp8Format::E4m3Fnuz),
            5e-2,
        ),
    ];
    for d in fp8 {
        cases.push((CSA_KV, d, Target::Pool, 5e-2));
        cases.push((HCA_KV, d, Target::Pool, 5e-2));
    }
    for (kind, dtype, target, tol) in cases {
        let setup = Setup::new(dtype, (8, 128));
        let model = Model::random(&mut rng, kind);
        let lens: Vec<usize> = if kind.ratio() == 4 {
            vec![rng.random_range(4..40), 3, rng.random_range(17..40)]
        } else {
            vec![rng.random_range(256..384), 100, 128]
        };
        let rows: Vec<_> = lens
            .iter()
            .map(|&l| random_rows(&mut rng, kind, l, false))
            .collect();
        setup.poison_rows(kind.layer);
        let before = setup.snapshot(kind, &target);
        ok(setup.call(
            &model,
            false,
            &full_prefill(kind, &rows, &lens),
            &SLOTS,
            &target,
            false,
        ));
        check_reference(&setup, &model, &target, &rows, &lens, tol);
        if let Target::Pool = target {
            // Only the groups' rows changed in the layer.
            let info = setup.pool.layer(kind.layer);
            let state_bytes = setup.state(kind).len() * 4;
            let after = setup.snapshot(kind, &target);
            let row_bytes = if info.rope_data.is_null() { 1024 } else { 512 };
            let owned: Vec<usize> = groups(kind, &lens)
                .iter()
                .map(|&(b, n)| info.swa_rows as usize + kind.loc(b, n) as usize)
                .collect();
            for (i, (x, y)) in before[state_bytes..]
                .iter()
                .zip(&after[state_bytes..])
                .enumerate()
            {
                let row = if i < info.bytes as usize {
                    i / row_bytes
                } else {
                    (i - info.bytes as usize) / 128
                };
                if !owned.contains(&row) {
                    assert_eq!(
                        x, y,
                        "{kind:?}: byte {i} (row {row}) outside the groups' rows changed"
                    );
                }
            }
        }
    }
}

#[test]
fn the_state_keeps_each_requests_last_ring_rows() {
    let (mut rng, _) = seeded("the_state_keeps_each_requests_last_ring_rows");
    for kind in KINDS {
        let setup = Setup::bf16();
        let model = Model::random(&mut rng, kind);
        let info = setup.compressor(kind);
        let ring = info.ring as usize;
        // Everything starts empty.
        for (i, x) in setup.state(kind).iter().enumerate() {
            let score = i % kind.row() >= kind.values();
            assert_eq!(
                *x,
                if score { f32::NEG_INFINITY } else { 0.0 },
                "{kind:?} float {i}"
            );
        }
        let lens = [ring + 5, 3, ring];
        let rows: Vec<_> = lens
            .iter()
            .map(|&l| random_rows(&mut rng, kind, l, false))
            .collect();
        let target = Target::of(kind);
        ok(setup.call(
            &model,
            false,
            &full_prefill(kind, &rows, &lens),
            &SLOTS,
            &target,
            false,
        ));
        let mut empty = vec![0f32; kind.row()];
        empty[kind.values()..].fill(f32::NEG_INFINITY);
        for (b, &len) in lens.iter().enumerate() {
            let slot = SLOTS[b] as usize;
            for (pos, row) in rows[b].iter().enumerate().skip(len.saturating_sub(ring)) {
                assert!(
                    setup.state_row(kind, slot, pos) == *row,
                    "{kind:?} slot {slot} pos {pos}"
                );
            }
            for pos in len..ring {
                assert!(
                    setup.state_row(kind, slot, pos) == empty,
                    "{kind:?} slot {slot} pos {pos}"
                );
            }
        }
        for pos in 0..ring {
            assert!(
                setup.state_row(kind, 0, pos) == empty,
                "{kind:?} slot 0 pos {pos}"
            );
        }
    }
}

/// Runs request rows through calls of the given chunk boundaries (each
/// request b cut at `cuts[b]`, chunk i of every request in call i) and
/// returns the state and target bytes.
fn chunked(
    model: &Model,
    rows: &[Vec<Vec<f32>>],
    cuts: &[Vec<usize>],
    decode_tail: bool,
) -> Vec<u8> {
    let kind = model.kind;
    let setup = Setup::bf16();
    let target = Target::of(kind);
    let calls = cuts[0].len() - 1;
    for c in 0..calls {
        let mut toks = Vec::new();
        for (b, cut) in cuts.iter().enumerate() {
            toks.extend((cut[c]..cut[c + 1]).map(|p| tok(kind, b, p, &rows[b])));
        }
        ok(setup.call(model, false, &toks, &SLOTS, &target, false));
    }
    if decode_tail {
        // The rest one token per request per call, with padding between.
        let ends: Vec<usize> = rows.iter().map(|r| r.len()).collect();
        let mut next: Vec<usize> = cuts.iter().map(|c| c[calls]).collect();
        while next.iter().zip(&ends).any(|(n, e)| n < e) {
            let mut toks = vec![padding(kind)];
            for b in 0..rows.len() {
                if next[b] < ends[b] {
                    toks.push(tok(kind, b, next[b], &rows[b]));
                    toks.push(padding(kind));
                    next[b] += 1;
                }
            }
            ok(setup.call(model, true, &toks, &SLOTS, &target, false));
        }
    }
    setup.snapshot(kind, &target)
}

#[test]
fn every_split_into_chunks_gives_the_bytes_of_one_chunk() {
    let (mut rng, _) = seeded("every_split_into_chunks_gives_the_bytes_of_one_chunk");
    for kind in KINDS {
        let model = Model::random(&mut rng, kind);
        let lens: [usize; 2] = if kind.ratio() == 4 {
            [13, 9]
        } else {
            [260, 131]
        };
        let rows: Vec<_> = lens
            .iter()
            .map(|&l| random_rows(&mut rng, kind, l, false))
            .collect();
        let whole = chunked(&model, &rows, &[vec![0, lens[0]], vec![0, lens[1]]], false);
        let points: Vec<usize> = if kind.ratio() == 4 {
            (0..=lens[0]).collect()
        } else {
            vec![0, 1, 2, 127, 128, 129, 200, 255, 256, 257, 259, 260]
        };
        for &a in &points {
            let b = a * lens[1] / lens[0];
            let two = chunked(
                &model,
                &rows,
                &[vec![0, a, lens[0]], vec![0, b, lens[1]]],
                false,
            );
            assert!(two == whole, "{kind:?}: split at {a} / {b}");
            if kind.ratio() == 4 && kind.compressor == 0 {
                for c in a..=lens[0] {
                    let three = chunked(
                        &model,
                        &rows,
                        &[
                            vec![0, a, c, lens[0]],
                            vec![0, b, (b + lens[1]).div_ceil(2), lens[1]],
                        ],
                        false,
                    );
                    assert!(three == whole, "{kind:?}: splits at {a}, {c}");
                }
            }
        }
        // A prefix, then decode token by token (with padding tokens).
        let prefixes: Vec<usize> = if kind.ratio() == 4 {
            vec![0, 3, 4, 5, 8]
        } else {
            vec![0, 127, 128, 200]
        };
        for p in prefixes {
            let q = p.min(lens[1]);
            let mixed = chunked(&model, &rows, &[vec![0, p], vec![0, q]], true);
            assert!(mixed == whole, "{kind:?}: prefix {p}, then decode");
        }
    }
}

#[test]
fn bf16_rows_give_the_bytes_of_their_f32_widening() {
    let (mut rng, _) = seeded("bf16_rows_give_the_bytes_of_their_f32_widening");
    for kind in KINDS {
        let model = Model::random(&mut rng, kind);
        let lens = [kind.ratio() * 2 + 1, kind.ratio(), 1];
        let rows: Vec<_> = lens
            .iter()
            .map(|&l| random_rows(&mut rng, kind, l, true))
            .collect();
        let mut out = Vec::new();
        for bf16_rows in [false, true] {
            let setup = Setup::bf16();
            let target = Target::of(kind);
            ok(setup.call(
                &model,
                false,
                &full_prefill(kind, &rows, &lens),
                &SLOTS,
                &target,
                bf16_rows,
            ));
            out.push(setup.snapshot(kind, &target));
        }
        assert!(out[0] == out[1], "{kind:?}");
    }
}

#[test]
fn group_zero_never_reads_its_masked_overlap_rows() {
    let (mut rng, _) = seeded("group_zero_never_reads_its_masked_overlap_rows");
    for kind in [CSA_KV, CSA_INDEXER] {
        let model = Model::random(&mut rng, kind);
        let rows = vec![random_rows(&mut rng, kind, 8, false)];
        let mut out = Vec::new();
        for garbage in [false, true] {
            let setup = Setup::bf16();
            if garbage {
                // What a previous owner of the slot might have left.
                for (i, x) in setup.state(kind).iter_mut().enumerate() {
                    *x = if i % 3 == 0 { f32::NAN } else { 1e30 };
                }
            }
            let target = Target::of(kind);
            // Group 0 alone, then group 1 (whose overlap is group 0's rows).
            for (a, b) in [(0, 4), (4, 8)] {
                let toks: Vec<Tok> = (a..b).map(|p| tok(kind, 0, p, &rows[0])).collect();
                ok(setup.call(&model, false, &toks, &SLOTS, &target, false));
            }
            check_reference(
                &setup,
                &model,
                &target,
                &rows,
                &[8],
                if kind.indexer() { 5e-2 } else { 4e-3 },
            );
            let skip = setup.state(kind).len() * 4;
            out.push(setup.snapshot(kind, &target)[skip..].to_vec());
        }
        assert!(
            out[0] == out[1],
            "{kind:?}: garbage in the state changed a group"
        );
    }
}

#[test]
fn padding_tokens_read_and_write_nothing() {
    let (mut rng, _) = seeded("padding_tokens_read_and_write_nothing");
    for kind in KINDS {
        let model = Model::random(&mut rng, kind);
        let r = kind.ratio();
        let lens = [2 * r, r + 1];
        let rows: Vec<_> = lens
            .iter()
            .map(|&l| random_rows(&mut rng, kind, l, false))
            .collect();
        let mut out = Vec::new();
        for pad in [false, true] {
            let setup = Setup::bf16();
            let target = Target::of(kind);
            let prefix: Vec<usize> = lens.iter().map(|l| l - 1).collect();
            let mut toks = Vec::new();
            for b in 0..2 {
                if pad {
                    toks.push(padding(kind));
                }
                toks.extend((0..prefix[b]).map(|p| tok(kind, b, p, &rows[b])));
            }
            ok(setup.call(&model, false, &toks, &SLOTS, &target, false));
            let mut last: Vec<Tok> = (0..2).map(|b| tok(kind, b, prefix[b], &rows[b])).collect();
            if pad {
                last.insert(1, padding(kind));
                last.push(padding(kind));
            }
            ok(setup.call(&model, true, &last, &SLOTS, &target, false));
            out.push(setup.snapshot(kind, &target));
        }
        assert!(out[0] == out[1], "{kind:?}");
    }
}

#[test]
fn a_speculative_append_rolls_back_by_length() {
    let (mut rng, _) = seeded("a_speculative_append_rolls_back_by_length");
    for kind in KINDS {
        let setup = Setup::new(BF16, (16, 256));
        for want in 1..=3 {
            let mut s = 0;
            ok(unsafe { unikv_pool_acquire_slot(setup.pool.0, &mut s) });
            assert_eq!(s, want);
        }
        let model = Model::random(&mut rng, kind);
        let target = Target::of(kind);
        let info = setup.compressor(kind);
        let (ring, rollback) = (info.ring as usize, info.max_rollback as usize);
        assert_eq!(rollback, ring + 1 - if kind.ratio() == 4 { 8 } else { 128 });
        let r = kind.ratio();
        let len = 3 * r + 2;
        let starts: Vec<usize> = if r == 4 {
            (0..=len - 4).collect()
        } else {
            vec![0, 100, 127, 128, 255]
        };
        let drafts: Vec<usize> = if r == 4 {
            (1..=rollback).collect()
        } else {
            vec![1, 64, rollback]
        };
        let rows = random_rows(&mut rng, kind, len + rollback, false);
        for &start in &starts {
            for &k in &drafts {
                // Request 0 in slot 1: the true sequence. Request 1 in slot 2:
                // the same up to `start`, then k rejected drafts, then the
                // true sequence again from `start`.
                let junk = random_rows(&mut rng, kind, start + k, false);
                let clean: Vec<Tok> = (0..len).map(|p| tok(kind, 0, p, &rows)).collect();
                ok(setup.call(&model, false, &clean, &[1, 2], &target, false));
                let prefix: Vec<Tok> = (0..start).map(|p| tok(kind, 1, p, &rows)).collect();
                ok(setup.call(&model, false, &prefix, &[1, 2], &target, false));
                let draft: Vec<Tok> = (start..start + k)
                    .map(|p| Tok {
                        row: junk[p].clone(),
                        ..tok(kind, 1, p, &rows)
                    })
                    .collect();
                ok(setup.call(&model, false, &draft, &[1, 2], &target, false));
                let redo: Vec<Tok> = (start..len).map(|p| tok(kind, 1, p, &rows)).collect();
                ok(setup.call(&model, false, &redo, &[1, 2], &target, false));
                for n in 0..len / r {
                    let a = setup.stored(kind, &target, kind.loc(0, n));
                    let b = setup.stored(kind, &target, kind.loc(1, n));
                    assert!(a == b, "{kind:?}: start {start}, {k} drafts: group {n}");
                }
                // The rows later groups need (the current group's and, for
                // ratio 4, the previous group's) are the clean run's.
                let overlap = if r == 4 { 4 } else { 0 };
                let needed = (len / r * r).saturating_sub(overlap);
                for pos in needed..len {
                    assert!(
                        setup.state_row(kind, 1, pos) == setup.state_row(kind, 2, pos),
                        "{kind:?}: start {start}, {k} drafts: state row of position {pos}"
                    );
                }
                for slot in [1, 2] {
                    ok(unsafe {
                        unikv_pool_release_slot_async(setup.pool.0, slot, ptr::null_mut())
                    });
                    let mut s = 0;
                    ok(unsafe { unikv_pool_acquire_slot(setup.pool.0, &mut s) });
                }
            }
        }
    }
}

#[test]
fn stores_equal_the_store_calls_of_the_same_values() {
    let (mut rng, _) = seeded("stores_equal_the_store_calls_of_the_same_values");
    for kind in [CSA_KV, HCA_KV] {
        let model = Model::random(&mut rng, kind);
        let lens = [2 * kind.ratio() + 3, kind.ratio(), kind.ratio() - 1];
        let rows: Vec<_> = lens
            .iter()
            .map(|&l| random_rows(&mut rng, kind, l, false))
            .collect();
        let toks = full_prefill(kind, &rows, &lens);
        let locs: Vec<i32> = groups(kind, &lens)
            .iter()
            .map(|&(b, n)| kind.loc(b, n) as i32)
            .collect();
        // The bf16 rows the compressor stores.
        let base = Setup::bf16();
        ok(base.call(&model, false, &toks, &SLOTS, &Target::Pool, false));
        let info = base.pool.layer(kind.layer);
        let kv: Vec<bf16> = locs
            .iter()
            .flat_map(|&l| {
                let row = info.swa_rows as usize + l as usize;
                base.pool.rows_mut(kind.layer)[row * 512..(row + 1) * 512].to_vec()
            })
            .collect();
        for dtype in [
            unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
            unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ,
        ] {
            let fused = Setup::new(dtype, (8, 128));
            let split = Setup::new(dtype, (8, 128));
            for s in [&fused, &split] {
                s.poison_rows(kind.layer);
            }
            ok(fused.call(&model, false, &toks, &SLOTS, &Target::Pool, false));
            let args = unikv::ffi::store::unikv_store_compressed_args {
                struct_size: std::mem::size_of::<unikv::ffi::store::unikv_store_compressed_args>(),
                kv: tensor(&kv, &[locs.len(), 512]),
                loc: vec1(&locs),
                layer: kind.layer,
                num_rows: locs.len() as u32,
            };
            ok(unsafe {
                unikv::ffi::store::unikv_store_compressed(split.pool.0, &args, ptr::null_mut())
            });
            let skip = fused.state(kind).len() * 4;
            assert!(
                fused.snapshot(kind, &Target::Pool)[skip..]
                    == split.snapshot(kind, &Target::Pool)[skip..],
                "{kind:?} {dtype:?}"
            );
        }
        for fmt in [Fp8Format::E4m3Fn, Fp8Format::E4m3Fnuz] {
            let fused = Setup::bf16();
            let target = Target::flashmla(fmt);
            ok(fused.call(&model, false, &toks, &SLOTS, &target, false));
            let g = FlashMlaGeometry::new(CACHE_PAGE.into(), fmt).unwrap();
            let mut cache = HostBytes::poisoned(CACHE_PAGES * g.bytes_per_page() as usize);
            let bpp = g.bytes_per_page() as usize;
            let args = unikv::ffi::cache_store::unikv_store_flashmla_args {
                struct_size: std::mem::size_of::<unikv::ffi::cache_store::unikv_store_flashmla_args>(
                ),
                cache: strided(
                    cache.ptr(),
                    unikv_dtype::UNIKV_DTYPE_U8,
                    [CACHE_PAGES, bpp],
                    bpp,
                ),
                kv: tensor(&kv, &[locs.len(), 512]),
                loc: vec1(&locs),
                page_size: CACHE_PAGE,
                cache_dtype: fp8_dtype(fmt),
                num_tokens: locs.len() as u32,
                reserved: 0,
            };
            ok(unsafe {
                unikv::ffi::cache_store::unikv_store_flashmla(fused.ctx.0, &args, ptr::null_mut())
            });
            let Target::FlashMla(_, got) = &target else {
                unreachable!()
            };
            assert!(
                got.bytes() == cache.bytes_mut(),
                "{kind:?} FlashMLA {fmt:?}"
            );
        }
    }
    // Indexer keys: unikv_indexer_prepare_k of the pooled f32 key.
    let kind = CSA_INDEXER;
    let model = Model::random(&mut rng, kind);
    let lens = [13, 4, 8];
    let rows: Vec<_> = lens
        .iter()
        .map(|&l| random_rows(&mut rng, kind, l, false))
        .collect();
    let setup = Setup::bf16();
    let target = Target::indexer(Fp8Format::E4m3Fn);
    ok(setup.call(
        &model,
        false,
        &full_prefill(kind, &rows, &lens),
        &SLOTS,
        &target,
        false,
    ));
    let (mut keys, mut positions, mut locs) = (Vec::new(), Vec::new(), Vec::new());
    for (b, n) in groups(kind, &lens) {
        let window: Vec<&[f32]> = (0..8)
            .map(|i| {
                let q = 4 * n as i64 - 4 + i;
                if q < 0 {
                    &[][..]
                } else {
                    &rows[b][q as usize][..]
                }
            })
            .collect();
        let mut key = vec![0f32; 128];
        unikv::compressor::pool_group(
            unikv::geometry::Ratio::Csa,
            n as u64,
            &window,
            &model.ape,
            &mut key,
        );
        keys.extend(key);
        positions.push((4 * n) as i32);
        locs.push(kind.loc(b, n) as i32);
    }
    let norm: Vec<bf16> = model.norm.iter().map(|&x| bf16::from_f32(x)).collect();
    let g = IndexerGeometry::new(CACHE_PAGE.into(), Fp8Format::E4m3Fn).unwrap();
    let bpp = g.bytes_per_page() as usize;
    let cache = HostBytes::poisoned(CACHE_PAGES * bpp);
    let args = unikv::ffi::indexer::unikv_indexer_prepare_k_args {
        struct_size: std::mem::size_of::<unikv::ffi::indexer::unikv_indexer_prepare_k_args>(),
        cache: strided(
            cache.ptr(),
            unikv_dtype::UNIKV_DTYPE_U8,
            [CACHE_PAGES, bpp],
            bpp,
        ),
        key: tensor(&keys, &[locs.len(), 128]),
        norm_weight: vec1(&norm),
        rope_table: tensor(&model.table, &[MAX_POS as usize, 64]),
        positions: vec1(&positions),
        loc: vec1(&locs),
        page_size: CACHE_PAGE,
        cache_dtype: fp8_dtype(Fp8Format::E4m3Fn),
        num_tokens: locs.len() as u32,
        eps: EPS,
        reserved: 0,
    };
    ok(unsafe {
        unikv::ffi::indexer::unikv_indexer_prepare_k(setup.ctx.0, &args, ptr::null_mut())
    });
    let Target::Indexer(_, got) = &target else {
        unreachable!()
    };
    assert!(got.bytes() == cache.bytes(), "indexer keys");
}

#[test]
fn releasing_a_slot_clears_its_rings_in_every_layer() {
    let (mut rng, _) = seeded("releasing_a_slot_clears_its_rings_in_every_layer");
    let setup = Setup::bf16();
    let mut slots = [0u32; 3];
    for s in &mut slots {
        ok(unsafe { unikv_pool_acquire_slot(setup.pool.0, s) });
    }
    assert_eq!(slots, [1, 2, 3]);
    for kind in KINDS {
        let model = Model::random(&mut rng, kind);
        let lens = [5, 6, 7];
        let rows: Vec<_> = lens
            .iter()
            .map(|&l| random_rows(&mut rng, kind, l, false))
            .collect();
        ok(setup.call(
            &model,
            false,
            &full_prefill(kind, &rows, &lens),
            &SLOTS,
            &Target::of(kind),
            false,
        ));
    }
    let before: Vec<Vec<f32>> = KINDS.iter().map(|&k| setup.state(k).to_vec()).collect();
    // Not acquired: fails, clears nothing.
    fails(
        unsafe { unikv_pool_release_slot(setup.pool.0, 0) },
        UNIKV_OUT_OF_RANGE,
        "slot",
    );
    for (i, f) in [
        |p, s| unsafe { unikv_pool_release_slot(p, s) },
        |p, s| unsafe { unikv_pool_release_slot_async(p, s, ptr::null_mut()) },
    ]
    .into_iter()
    .enumerate()
    {
        let slot = 2 + i as u32;
        ok(f(setup.pool.0, slot));
        check(f(setup.pool.0, slot), UNIKV_INVALID_STATE);
        for (k, &kind) in KINDS.iter().enumerate() {
            let row = kind.row();
            let ring = setup.compressor(kind).ring as usize;
            let now = setup.state(kind);
            for (j, (a, b)) in now.iter().zip(&before[k]).enumerate() {
                let s = j / row / ring;
                let cleared = s >= 2 && s <= slot as usize;
                let want = if !cleared {
                    *b
                } else if j % row >= kind.values() {
                    f32::NEG_INFINITY
                } else {
                    0.0
                };
                assert!(a.to_bits() == want.to_bits(), "{kind:?} slot {s} float {j}");
            }
        }
    }
}

fn get_info(
    params: &unikv_pool_params,
    layer: u32,
    c: u32,
) -> (unikv_status, unikv_compressor_info) {
    let mut info: unikv_compressor_info = unsafe { std::mem::zeroed() };
    info.struct_size = std::mem::size_of_val(&info);
    let s = unsafe { unikv_pool_params_get_compressor(params, layer, c, &mut info) };
    (s, info)
}

use unikv::ffi::status::unikv_status;

#[test]
fn state_geometry_is_reported_before_and_after_creation() {
    let s = spec();
    for rings in [(8u32, 128u32), (16, 256)] {
        let params = state_params(&s, BF16, rings);
        let setup = Setup::new(BF16, rings);
        let mut total = [0u64; 3];
        for kind in KINDS {
            let (status, before) = get_info(&params, kind.layer, kind.compressor);
            ok(status);
            let after = setup.compressor(kind);
            let ring = if kind.ratio() == 4 { rings.0 } else { rings.1 };
            assert_eq!(after.ring, ring);
            assert_eq!(after.row_floats as usize, kind.row());
            assert_eq!(after.score_offset as usize, kind.values());
            assert_eq!(after.head_dim as usize, kind.dim());
            assert_eq!(after.compress_ratio as usize, kind.ratio());
            assert_eq!(after.num_slots, 4);
            assert_eq!(after.slot_bytes, ring as u64 * kind.row() as u64 * 4);
            assert_eq!(after.bytes, 4 * after.slot_bytes);
            assert_eq!(
                after.offset_bytes,
                if kind == CSA_INDEXER { total[1] } else { 0 }
            );
            total[kind.layer as usize] += after.bytes;
            let layer = setup.pool.layer(kind.layer);
            assert_eq!(
                after.state as usize,
                layer.state_data as usize + after.offset_bytes as usize
            );
            assert!(before.state.is_null());
            assert_eq!(
                (
                    before.offset_bytes,
                    before.bytes,
                    before.slot_bytes,
                    before.ring,
                    before.row_floats
                ),
                (
                    after.offset_bytes,
                    after.bytes,
                    after.slot_bytes,
                    after.ring,
                    after.row_floats
                )
            );
        }
        for layer in 0..3u32 {
            let mut from_params: unikv_pool_layer_info = unsafe { std::mem::zeroed() };
            from_params.struct_size = std::mem::size_of_val(&from_params);
            ok(unsafe { unikv_pool_params_get_layer(&params, layer, &mut from_params) });
            assert_eq!(from_params.state_bytes, total[layer as usize]);
            assert!(from_params.state_data.is_null());
            let created = setup.pool.layer(layer);
            assert_eq!(created.state_bytes, total[layer as usize]);
            assert_eq!(created.state_data.is_null(), layer == 0);
        }
        let info = setup.pool.info();
        assert_eq!((info.c4_state_ring, info.c128_state_ring), rings);
        fails(
            get_info(&params, 0, 0).0,
            UNIKV_INVALID_ARGUMENT,
            "compressor",
        );
        fails(
            get_info(&params, HCA, 1).0,
            UNIKV_INVALID_ARGUMENT,
            "compressor",
        );
        fails(get_info(&params, 3, 0).0, UNIKV_OUT_OF_RANGE, "layer");
        fails(get_info(&params, CSA, 2).0, UNIKV_BAD_ENUM, "compressor");
    }
    // Without state: nothing reported, and an old caller's struct_size
    // (before the compressor fields) still creates a pool.
    let plain = s.params();
    fails(
        get_info(&plain, CSA, 0).0,
        UNIKV_INVALID_STATE,
        "compressor_state",
    );
    let old = unikv_pool_params {
        struct_size: std::mem::offset_of!(unikv_pool_params, compressor_state),
        compressor_state: 7,
        ..plain
    };
    let ctx = Ctx::cpu(1);
    let mut pool = ptr::null_mut();
    ok(unsafe { unikv_pool_create(ctx.0, &old, &mut pool) });
    let pool = Pool(pool);
    assert_eq!(pool.layer(CSA).state_bytes, 0);
    assert_eq!(pool.info().c4_state_ring, 0);
}

#[test]
fn invalid_state_parameters_are_refused_at_creation() {
    let s = spec();
    let good = state_params(&s, BF16, (8, 128));
    let ctx = Ctx::cpu(1);
    let dense_only = PoolSpec {
        ratios: vec![0, 4],
        ..spec()
    };
    let ratios4 = dense_only.ratios.clone();
    let cases: Vec<(unikv_pool_params, unikv_status, &str)> = vec![
        (
            unikv_pool_params {
                c4_state_ring: 0,
                ..good
            },
            UNIKV_INVALID_ARGUMENT,
            "params.c4_state_ring",
        ),
        (
            unikv_pool_params {
                c4_state_ring: 12,
                ..good
            },
            UNIKV_INVALID_ARGUMENT,
            "params.c4_state_ring",
        ),
        (
            unikv_pool_params {
                c128_state_ring: 0,
                ..good
            },
            UNIKV_INVALID_ARGUMENT,
            "params.c128_state_ring",
        ),
        (
            unikv_pool_params {
                c128_state_ring: 64,
                ..good
            },
            UNIKV_INVALID_ARGUMENT,
            "params.c128_state_ring",
        ),
        (
            unikv_pool_params {
                compress_ratios: ratios4.as_ptr(),
                num_layers: 2,
                c128_state_ring: 100,
                ..good
            },
            UNIKV_INVALID_ARGUMENT,
            "params.c128_state_ring",
        ),
        (
            unikv_pool_params {
                compressor_state: 2,
                ..good
            },
            UNIKV_BAD_ENUM,
            "params.compressor_state",
        ),
        (
            unikv_pool_params {
                reserved: 1,
                ..good
            },
            UNIKV_INVALID_ARGUMENT,
            "params.reserved",
        ),
        (
            unikv_pool_params {
                compressor_state: 0,
                ..good
            },
            UNIKV_INVALID_ARGUMENT,
            "params.c4_state_ring",
        ),
    ];
    for (params, status, arg) in cases {
        let mut pool = ptr::null_mut();
        fails(
            unsafe { unikv_pool_create(ctx.0, &params, &mut pool) },
            status,
            arg,
        );
        assert!(pool.is_null());
        let mut info: unikv_pool_info = unsafe { std::mem::zeroed() };
        info.struct_size = std::mem::size_of_val(&info);
        fails(
            unsafe { unikv_pool_params_get_info(&params, &mut info) },
            status,
            arg,
        );
    }
    // A pool of dense and ratio-4 layers needs no ratio-128 ring.
    let mut pool = ptr::null_mut();
    let p = unikv_pool_params {
        compress_ratios: ratios4.as_ptr(),
        num_layers: 2,
        c128_state_ring: 0,
        ..good
    };
    ok(unsafe { unikv_pool_create(ctx.0, &p, &mut pool) });
    unsafe { unikv_pool_destroy(pool) };

    // Adopted buffers: sized by the query, NULL exactly for the dense layer.
    let sizes: Vec<usize> = (0..3)
        .map(|l| {
            let mut info: unikv_pool_layer_info = unsafe { std::mem::zeroed() };
            info.struct_size = std::mem::size_of_val(&info);
            ok(unsafe { unikv_pool_params_get_layer(&good, l, &mut info) });
            info.state_bytes as usize
        })
        .collect();
    let mut bufs: Vec<Vec<u128>> = sizes.iter().map(|&b| vec![u128::MAX; b / 16]).collect();
    let mut ptrs: Vec<*mut std::ffi::c_void> =
        bufs.iter_mut().map(|b| b.as_mut_ptr().cast()).collect();
    ptrs[0] = ptr::null_mut();
    let misaligned = unsafe { (ptrs[1] as *mut u8).add(4) }.cast();
    let bad: Vec<(Vec<*mut std::ffi::c_void>, unikv_status, &str)> = vec![
        (
            vec![ptrs[1], ptrs[1], ptrs[2]],
            UNIKV_INVALID_ARGUMENT,
            "params.state_buffers[0]",
        ),
        (
            vec![ptr::null_mut(), ptr::null_mut(), ptrs[2]],
            UNIKV_NULL_ARGUMENT,
            "params.state_buffers[1]",
        ),
        (
            vec![ptr::null_mut(), misaligned, ptrs[2]],
            UNIKV_BAD_ALIGNMENT,
            "params.state_buffers[1]",
        ),
    ];
    for (table, status, arg) in bad {
        let p = unikv_pool_params {
            state_buffers: table.as_ptr(),
            ..good
        };
        let mut pool = ptr::null_mut();
        fails(
            unsafe { unikv_pool_create(ctx.0, &p, &mut pool) },
            status,
            arg,
        );
    }
    let p = unikv_pool_params {
        state_buffers: ptrs.as_ptr(),
        ..good
    };
    let mut info: unikv_compressor_info = unsafe { std::mem::zeroed() };
    info.struct_size = std::mem::size_of_val(&info);
    ok(unsafe { unikv_pool_params_get_compressor(&p, CSA, 1, &mut info) });
    assert_eq!(
        info.state as usize,
        ptrs[1] as usize + info.offset_bytes as usize
    );
    let mut pool = ptr::null_mut();
    ok(unsafe { unikv_pool_create(ctx.0, &p, &mut pool) });
    let pool = Pool(pool);
    assert_eq!(pool.info().owns_memory, 1);
    assert_eq!(pool.layer(CSA).state_data, ptrs[1]);
    // Adopted memory is cleared at creation.
    for (l, b) in bufs.iter().enumerate().skip(1) {
        let floats: &[f32] = unsafe { std::slice::from_raw_parts(b.as_ptr().cast(), b.len() * 4) };
        let row = if l == 1 { 2048 } else { 1024 };
        let kv_floats = if l == 1 { 4 * 8 * 2048 } else { floats.len() };
        for (i, x) in floats.iter().enumerate() {
            let (r, off) = if i < kv_floats {
                (row, i)
            } else {
                (512, i - kv_floats)
            };
            let want = if off % r >= r / 2 {
                f32::NEG_INFINITY
            } else {
                0.0
            };
            assert_eq!(*x, want, "layer {l} float {i}");
        }
    }
    drop(pool);
}

/// A valid call that tests then break one argument of.
struct Fixture {
    setup: Setup,
    model: Model,
    toks: Vec<Tok>,
    target: Target,
}

fn fixture(rng: &mut impl Rng, kind: Kind, target: Target) -> Fixture {
    let setup = Setup::bf16();
    let model = Model::random(rng, kind);
    let rows: Vec<_> = (0..2)
        .map(|_| random_rows(rng, kind, 3 * kind.ratio(), false))
        .collect();
    // Request 0: tokens 0..8 (groups 0 and 1 closed by tokens 3 and 7);
    // request 1: tokens 9..12 (group 0 closed by token 12).
    let toks = full_prefill(kind, &rows, &[2 * kind.ratio() + 1, kind.ratio()]);
    Fixture {
        setup,
        model,
        toks,
        target,
    }
}

#[test]
fn bad_input_is_refused_and_writes_nothing() {
    let (mut rng, _) = seeded("bad_input_is_refused_and_writes_nothing");
    type Edit = Box<dyn Fn(&mut Call)>;
    let kind = CSA_KV;
    let cases: Vec<(&str, unikv_status, bool, Edit)> = vec![
        (
            "args.struct_size",
            UNIKV_BAD_STRUCT_SIZE,
            false,
            Box::new(|c| c.args.struct_size = 8),
        ),
        (
            "layer",
            UNIKV_OUT_OF_RANGE,
            false,
            Box::new(|c| c.args.layer = 3),
        ),
        (
            "layer",
            UNIKV_INVALID_ARGUMENT,
            false,
            Box::new(|c| c.args.layer = 0),
        ),
        (
            "compressor",
            UNIKV_BAD_ENUM,
            false,
            Box::new(|c| c.args.compressor = 2),
        ),
        (
            "compressor",
            UNIKV_INVALID_ARGUMENT,
            false,
            Box::new(|c| {
                c.args.layer = HCA;
                c.args.compressor = 1;
            }),
        ),
        (
            "eps",
            UNIKV_INVALID_ARGUMENT,
            false,
            Box::new(|c| c.args.eps = 0.0),
        ),
        (
            "eps",
            UNIKV_INVALID_ARGUMENT,
            false,
            Box::new(|c| c.args.eps = f32::NAN),
        ),
        (
            "kv_score.data",
            UNIKV_NULL_ARGUMENT,
            false,
            Box::new(|c| c.args.kv_score.data = ptr::null_mut()),
        ),
        (
            "kv_score",
            UNIKV_BAD_DTYPE,
            false,
            Box::new(|c| c.args.kv_score.dtype = unikv_dtype::UNIKV_DTYPE_I32 as u32),
        ),
        (
            "kv_score",
            UNIKV_BAD_SHAPE,
            false,
            Box::new(|c| c.args.kv_score.shape[1] = 1024),
        ),
        (
            "kv_score",
            UNIKV_BAD_SHAPE,
            false,
            Box::new(|c| c.args.kv_score.shape[0] -= 1),
        ),
        (
            "kv_score",
            UNIKV_BAD_ALIGNMENT,
            false,
            Box::new(|c| {
                c.args.kv_score.data = unsafe { (c.args.kv_score.data as *mut u8).add(4) }.cast()
            }),
        ),
        (
            "ape",
            UNIKV_BAD_SHAPE,
            false,
            Box::new(|c| c.args.ape.shape[0] = 8),
        ),
        (
            "ape",
            UNIKV_BAD_DTYPE,
            false,
            Box::new(|c| c.args.ape.dtype = unikv_dtype::UNIKV_DTYPE_BF16 as u32),
        ),
        (
            "norm_weight",
            UNIKV_BAD_SHAPE,
            false,
            Box::new(|c| c.args.norm_weight.shape[0] = 128),
        ),
        (
            "norm_weight",
            UNIKV_BAD_DTYPE,
            false,
            Box::new(|c| c.args.norm_weight.dtype = unikv_dtype::UNIKV_DTYPE_I64 as u32),
        ),
        (
            "rope_table",
            UNIKV_BAD_SHAPE,
            false,
            Box::new(|c| c.args.rope_table.shape[1] = 32),
        ),
        (
            "batch_id",
            UNIKV_BAD_DTYPE,
            false,
            Box::new(|c| c.args.batch_id.dtype = unikv_dtype::UNIKV_DTYPE_I64 as u32),
        ),
        (
            "batch_id",
            UNIKV_BAD_SHAPE,
            false,
            Box::new(|c| c.args.batch_id.shape[0] = 1),
        ),
        (
            "req_slots",
            UNIKV_BAD_SHAPE,
            false,
            Box::new(|c| c.args.req_slots.shape[0] = 0),
        ),
        (
            "positions",
            UNIKV_BAD_DTYPE,
            false,
            Box::new(|c| c.args.positions.dtype = unikv_dtype::UNIKV_DTYPE_F32 as u32),
        ),
        (
            "loc.data",
            UNIKV_NULL_ARGUMENT,
            false,
            Box::new(|c| c.args.loc.data = ptr::null_mut()),
        ),
        (
            "page_size",
            UNIKV_INVALID_ARGUMENT,
            false,
            Box::new(|c| c.args.page_size = 64),
        ),
        (
            "cache_dtype",
            UNIKV_BAD_ENUM,
            false,
            Box::new(|c| {
                c.args.cache = c.args.kv_score;
                c.args.cache_dtype = 99;
            }),
        ),
        // Device values.
        (
            "batch_id[0]",
            UNIKV_OUT_OF_RANGE,
            false,
            Box::new(|c| c.batch[0] = 5),
        ),
        (
            "req_slots[1]",
            UNIKV_OUT_OF_RANGE,
            false,
            Box::new(|c| c.req_slots[1] = 4),
        ),
        (
            "req_slots[1]",
            UNIKV_INVALID_ARGUMENT,
            false,
            Box::new(|c| c.req_slots[1] = 1),
        ),
        (
            "positions[3]",
            UNIKV_OUT_OF_RANGE,
            false,
            Box::new(|c| c.positions[3] = -1),
        ),
        (
            "positions[3]",
            UNIKV_INVALID_ARGUMENT,
            false,
            Box::new(|c| c.positions[3] = 4),
        ),
        (
            "batch_id[10]",
            UNIKV_INVALID_ARGUMENT,
            false,
            Box::new(|c| c.batch[10] = 0),
        ),
        (
            "batch_id[1]",
            UNIKV_INVALID_ARGUMENT,
            true,
            Box::new(|_| {}),
        ),
        (
            "positions[7]",
            UNIKV_OUT_OF_RANGE,
            false,
            Box::new(|c| c.args.rope_table.shape[0] = 4),
        ),
        (
            "loc[3]",
            UNIKV_OUT_OF_RANGE,
            false,
            Box::new(|c| c.loc[3] = 320),
        ),
        (
            "loc[12]",
            UNIKV_INVALID_ARGUMENT,
            false,
            Box::new(|c| c.loc[12] = c.loc[3]),
        ),
        // Overlap with the state or the target.
        (
            "the pool's compressor state",
            UNIKV_OVERLAPPING_BUFFERS,
            false,
            Box::new(|c| {
                let state = c.setup.compressor(CSA_KV).state;
                c.args.ape.data = state;
            }),
        ),
        (
            "ape",
            UNIKV_OVERLAPPING_BUFFERS,
            false,
            Box::new(|c| {
                let rows = c.setup.pool.layer(CSA).data;
                c.args.ape.data = rows;
            }),
        ),
    ];
    for (arg, status, decode, edit) in cases {
        let f = fixture(&mut rng, kind, Target::Pool);
        // A first valid call fills part of the state.
        ok(f.setup
            .call(&f.model, false, &f.toks[..2], &SLOTS, &f.target, false));
        let before = f.setup.snapshot(kind, &f.target);
        let mut call = Call::new(&f.setup, &f.model, &f.toks, &SLOTS, &f.target, false);
        edit(&mut call);
        fails(call.run(decode), status, arg);
        assert!(
            f.setup.snapshot(kind, &f.target) == before,
            "{arg}: something was written"
        );
    }
    // The indexer compressor needs a cache; a cache's geometry is checked.
    let f = fixture(&mut rng, CSA_INDEXER, Target::indexer(Fp8Format::E4m3Fn));
    let mut call = Call::new(&f.setup, &f.model, &f.toks, &SLOTS, &Target::Pool, false);
    fails(call.run(false), UNIKV_NULL_ARGUMENT, "cache");
    let mut call = Call::new(&f.setup, &f.model, &f.toks, &SLOTS, &f.target, false);
    call.args.page_size = 32;
    fails(call.run(false), UNIKV_INVALID_ARGUMENT, "page_size");
    let mut call = Call::new(&f.setup, &f.model, &f.toks, &SLOTS, &f.target, false);
    call.args.cache.strides[0] += 16;
    fails(call.run(false), UNIKV_BAD_STRIDE, "cache");
    let mut call = Call::new(&f.setup, &f.model, &f.toks, &SLOTS, &f.target, false);
    call.args.cache_dtype = unikv_dtype::UNIKV_DTYPE_BF16 as u32;
    fails(call.run(false), UNIKV_BAD_DTYPE, "cache_dtype");
    // A pool without compressor state.
    let ctx = Ctx::cpu(1);
    let plain = Pool::new(&ctx, &spec());
    let mut call = Call::new(&f.setup, &f.model, &f.toks, &SLOTS, &f.target, false);
    fails(
        unsafe { unikv_compress_prefill(plain.0, &call.args, ptr::null_mut()) },
        UNIKV_INVALID_STATE,
        "compressor_state",
    );
    fails(
        unsafe { unikv_compress_prefill(f.setup.pool.0, ptr::null(), ptr::null_mut()) },
        UNIKV_NULL_ARGUMENT,
        "args",
    );
    fails(
        unsafe { unikv_compress_decode(ptr::null(), &call.args, ptr::null_mut()) },
        UNIKV_NULL_ARGUMENT,
        "pool",
    );
    ok(call.run(false));
}
