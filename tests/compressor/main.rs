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

mod bad_input;
#[path = "../common/mod.rs"]
mod common;
mod creation;
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
