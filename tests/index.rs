//! Index-stream builders against hand-worked examples (docs/index-streams.md §8 and
//! the ATOM cases of docs/testing.md §1) and against a direct restatement of the formulas.

mod common;

use common::*;
use unikv::ffi::index::*;

/// Outputs of one `unikv_build_decode_streams` call, poisoned beforehand.
struct DecodeStreams {
    swa_indptr: Vec<i32>,
    swa: Vec<i32>,
    hca_indptr: Vec<i32>,
    hca: Vec<i32>,
    csa_indptr: Vec<i32>,
    csa: Vec<i32>,
}

impl DecodeStreams {
    fn poisoned(t: usize, win: usize, c128_width: usize, topk: usize) -> Self {
        DecodeStreams {
            swa_indptr: poisoned(t + 1),
            swa: poisoned(t * win),
            hca_indptr: poisoned(t + 1),
            hca: poisoned(t * (win + c128_width)),
            csa_indptr: poisoned(t + 1),
            csa: poisoned(t * (win + topk)),
        }
    }

    fn slice<'a>(indptr: &[i32], indices: &'a [i32], t: usize) -> &'a [i32] {
        &indices[indptr[t] as usize..indptr[t + 1] as usize]
    }
}

struct DecodeInputs<'a> {
    batch_id: &'a [i32],
    req_slots: &'a [i32],
    positions: &'a [i32],
    c128: Option<(&'a [i32], usize)>,
    topk: u32,
}

fn decode_args(inp: &DecodeInputs, out: &mut DecodeStreams) -> unikv_decode_streams_args {
    let t = inp.batch_id.len();
    unikv_decode_streams_args {
        struct_size: std::mem::size_of::<unikv_decode_streams_args>(),
        batch_id: vec1(inp.batch_id),
        req_slots: vec1(inp.req_slots),
        positions: vec1(inp.positions),
        c128_page_indices: match inp.c128 {
            Some((table, width)) => tensor(table, &[t, width]),
            None => absent(),
        },
        swa_indptr: vec1(&out.swa_indptr),
        swa_indices: vec1(&out.swa),
        hca_indptr: vec1(&out.hca_indptr),
        hca_indices: vec1(&out.hca),
        csa_indptr: vec1(&out.csa_indptr),
        csa_indices: vec1(&out.csa),
        num_tokens: t as u32,
        csa_topk: inp.topk,
    }
}

fn build_decode(pool: &Pool, inp: &DecodeInputs, win: usize) -> DecodeStreams {
    let width = inp.c128.map_or(0, |c| c.1);
    let mut out = DecodeStreams::poisoned(inp.batch_id.len(), win, width, inp.topk as usize);
    let args = decode_args(inp, &mut out);
    ok(unsafe { unikv_build_decode_streams(pool.0, &args, std::ptr::null_mut()) });
    out
}

fn fill_tail(
    pool: &Pool,
    inp: &DecodeInputs,
    table: &[i32],
    width: usize,
    out: &mut DecodeStreams,
) {
    let t = inp.batch_id.len();
    let args = unikv_csa_tail_args {
        struct_size: std::mem::size_of::<unikv_csa_tail_args>(),
        batch_id: vec1(inp.batch_id),
        positions: vec1(inp.positions),
        csa_page_indices: tensor(table, &[t, width]),
        csa_indptr: vec1(&out.csa_indptr),
        csa_indices: vec1(&out.csa),
        num_tokens: t as u32,
        reserved: 0,
    };
    ok(unsafe { unikv_fill_csa_tail(pool.0, &args, std::ptr::null_mut()) });
}

/// ATOM `test_decode_indices_paged`: WIN=8, ring 11, positions [5,20,13,7],
/// batch ids [0,1,2,-1], slots [3,0,4].
#[test]
fn decode_swa_matches_atom_case() {
    let ctx = Ctx::cpu(1);
    let spec = PoolSpec {
        ratios: vec![0],
        max_requests: 4,
        window: 8,
        spec_extra: 3,
        c128_blocks: 1,
    };
    let pool = Pool::new(&ctx, &spec);
    let inp = DecodeInputs {
        batch_id: &[0, 1, 2, -1],
        req_slots: &[3, 0, 4],
        positions: &[5, 20, 13, 7],
        c128: None,
        topk: 4,
    };
    let out = build_decode(&pool, &inp, 8);
    let want: [&[i32]; 4] = [
        &[33, 34, 35, 36, 37, 38],
        &[2, 3, 4, 5, 6, 7, 8, 9],
        &[50, 51, 52, 53, 54, 44, 45, 46],
        &[],
    ];
    assert_eq!(out.swa_indptr, [0, 6, 14, 22, 22]);
    for (t, w) in want.iter().enumerate() {
        assert_eq!(
            DecodeStreams::slice(&out.swa_indptr, &out.swa, t),
            *w,
            "token {t}"
        );
    }
    // Without a c128 table HCA slices are the SWA window; CSA adds (pos+1)/4 slots.
    assert_eq!(out.hca_indptr, out.swa_indptr);
    assert_eq!(out.csa_indptr, [0, 6 + 1, 7 + 8 + 4, 19 + 8 + 3, 30]);
    // The tail of every buffer past indptr[T] is untouched.
    assert!(out.swa[22..]
        .iter()
        .all(|&v| v == i32::from_ne_bytes([POISON_BYTE; 4])));
}

/// docs/index-streams.md §8: win=128, ring=128, topk=1024, positions [4, 5000], slots [3, 7].
#[test]
fn decode_streams_match_spec_worked_example() {
    let ctx = Ctx::cpu(1);
    let spec = PoolSpec {
        ratios: vec![4, 128],
        max_requests: 8,
        window: 128,
        spec_extra: 0,
        c128_blocks: 64,
    };
    let pool = Pool::new(&ctx, &spec);
    let p = pool.info().swa_rows as i32;
    assert_eq!(p, 9 * 128);
    // Page tables of the two requests (distinct 256-token pages).
    let pages: [Vec<i32>; 2] = [vec![5], (0..20).map(|i| 31 - i).collect()];
    let width = 40;
    let mut c128 = vec![-1i32; 2 * width];
    for i in 0..39 {
        c128[width + i] = pages[1][i / 2] * 2 + (i % 2) as i32;
    }
    let inp = DecodeInputs {
        batch_id: &[0, 1],
        req_slots: &[3, 7],
        positions: &[4, 5000],
        c128: Some((&c128, width)),
        topk: 1024,
    };
    let mut out = build_decode(&pool, &inp, 128);
    assert_eq!(out.hca_indptr, [0, 5, 172]);
    assert_eq!(out.csa_indptr, [0, 6, 1158]);
    assert_eq!(out.swa_indptr, [0, 5, 133]);
    let token0: Vec<i32> = (0..5).map(|i| 3 * 128 + i).collect();
    let token1_swa: Vec<i32> = (4873..=5000).map(|pos| 7 * 128 + pos % 128).collect();
    let token1_hca: Vec<i32> = token1_swa
        .iter()
        .copied()
        .chain((0..39).map(|j| p + c128[width + j]))
        .collect();
    assert_eq!(DecodeStreams::slice(&out.hca_indptr, &out.hca, 0), token0);
    assert_eq!(
        DecodeStreams::slice(&out.hca_indptr, &out.hca, 1),
        token1_hca
    );
    assert_eq!(&out.csa[0..5], &token0[..]);
    assert_eq!(&out.csa[6..6 + 128], &token1_swa[..]);

    // The layer's top-k: token 0 sees one group, token 1 the full 1024.
    let topk_width = 1024;
    let mut topk = vec![-1i32; 2 * topk_width];
    topk[0] = 5 * 64;
    for j in 0..1024 {
        topk[topk_width + j] = pages[1][j / 64] * 64 + (j % 64) as i32;
    }
    fill_tail(&pool, &inp, &topk, topk_width, &mut out);
    assert_eq!(out.csa[5], p + 5 * 64);
    let tail: Vec<i32> = (0..1024).map(|j| p + topk[topk_width + j]).collect();
    assert_eq!(&out.csa[6 + 128..1158], &tail[..]);
    assert_eq!(
        &out.csa[0..5],
        &token0[..],
        "SWA part unchanged by the tail fill"
    );
}

/// MTP verify: each of a request's 1+k tokens gets its own full slice.
#[test]
fn mtp_verify_tokens_get_their_own_slices() {
    let ctx = Ctx::cpu(1);
    let spec = PoolSpec {
        ratios: vec![0],
        max_requests: 2,
        window: 4,
        spec_extra: 3,
        c128_blocks: 1,
    };
    let pool = Pool::new(&ctx, &spec);
    let inp = DecodeInputs {
        batch_id: &[0, 0, 0, 0],
        req_slots: &[2],
        positions: &[10, 11, 12, 13],
        c128: None,
        topk: 0,
    };
    let out = build_decode(&pool, &inp, 4);
    let ring = 7;
    for (t, pos) in (10..=13).enumerate() {
        let want: Vec<i32> = (pos - 3..=pos).map(|q| 2 * ring + q % ring).collect();
        assert_eq!(DecodeStreams::slice(&out.swa_indptr, &out.swa, t), want);
    }
    assert_eq!(
        out.csa_indptr, out.swa_indptr,
        "topk 0 gives no CSA entries"
    );
}

/// HCA length is the count of leading valid entries within min((pos+1)/128, width).
#[test]
fn hca_length_stops_at_first_invalid_entry_and_table_width() {
    let ctx = Ctx::cpu(1);
    let spec = PoolSpec {
        ratios: vec![128],
        max_requests: 3,
        window: 2,
        spec_extra: 0,
        c128_blocks: 16,
    };
    let pool = Pool::new(&ctx, &spec);
    let p = pool.info().swa_rows as i32;
    let width = 4;
    // Token 0: pos 1000 -> 7 visible groups, width 4 caps at 4.
    // Token 1: pos 1000 but a -1 at entry 2 -> 2.
    // Token 2: pos 200 -> 1 visible group.
    let table = [1, 2, 3, 4, 5, 6, -1, 7, 8, 9, 10, 11];
    let inp = DecodeInputs {
        batch_id: &[0, 1, 2],
        req_slots: &[1, 2, 3],
        positions: &[1000, 1000, 200],
        c128: Some((&table, width)),
        topk: 0,
    };
    let out = build_decode(&pool, &inp, 2);
    assert_eq!(out.hca_indptr, [0, 6, 10, 13]);
    assert_eq!(&out.hca[2..6], &[p + 1, p + 2, p + 3, p + 4]);
    assert_eq!(&out.hca[8..10], &[p + 5, p + 6]);
    assert_eq!(&out.hca[12..13], &[p + 8]);
}

struct PrefillOut {
    prefix_indptr: Vec<i32>,
    prefix: Vec<i32>,
    extend_indptr: Vec<i32>,
    extend: Vec<i32>,
}

struct PrefillInputs<'a> {
    batch_id: &'a [i32],
    req_slots: &'a [i32],
    positions: &'a [i32],
    chunk_start: &'a [i32],
    extend_start: &'a [i32],
    table: Option<(&'a [i32], usize)>,
    ratio: u32,
}

fn prefill_args(inp: &PrefillInputs, out: &PrefillOut) -> unikv_prefill_streams_args {
    let t = inp.batch_id.len();
    unikv_prefill_streams_args {
        struct_size: std::mem::size_of::<unikv_prefill_streams_args>(),
        batch_id: vec1(inp.batch_id),
        req_slots: vec1(inp.req_slots),
        positions: vec1(inp.positions),
        chunk_start: vec1(inp.chunk_start),
        extend_start: vec1(inp.extend_start),
        page_indices: match inp.table {
            Some((table, width)) => tensor(table, &[t, width]),
            None => absent(),
        },
        prefix_indptr: vec1(&out.prefix_indptr),
        prefix_indices: vec1(&out.prefix),
        extend_indptr: vec1(&out.extend_indptr),
        extend_indices: vec1(&out.extend),
        num_tokens: t as u32,
        compress_ratio: inp.ratio,
    }
}

fn build_prefill(pool: &Pool, inp: &PrefillInputs, win: usize) -> PrefillOut {
    let t = inp.batch_id.len();
    let width = inp.table.map_or(0, |x| x.1);
    let out = PrefillOut {
        prefix_indptr: poisoned(t + 1),
        prefix: poisoned(t * (win + width)),
        extend_indptr: poisoned(t + 1),
        extend: poisoned(t * win),
    };
    let args = prefill_args(inp, &out);
    ok(unsafe { unikv_build_prefill_streams(pool.0, &args, std::ptr::null_mut()) });
    out
}

/// ATOM `test_prefill_indices_paged`: WIN=8, ring 11; request 0 a fresh chunk at
/// positions 0..4; request 1 a prefix hit with chunk_start 16, positions 16..19.
#[test]
fn prefill_streams_match_atom_case() {
    let ctx = Ctx::cpu(1);
    let spec = PoolSpec {
        ratios: vec![0],
        max_requests: 3,
        window: 8,
        spec_extra: 3,
        c128_blocks: 1,
    };
    let pool = Pool::new(&ctx, &spec);
    let (s0, s1) = (1, 2);
    let inp = PrefillInputs {
        batch_id: &[0, 0, 0, 0, 0, 1, 1, 1, 1, -1],
        req_slots: &[s0, s1],
        positions: &[0, 1, 2, 3, 4, 16, 17, 18, 19, 0],
        chunk_start: &[0, 16],
        extend_start: &[0, 5],
        table: None,
        ratio: 0,
    };
    let out = build_prefill(&pool, &inp, 8);
    let ring = 11;
    for t in 0..5 {
        let ext = &out.extend[out.extend_indptr[t] as usize..out.extend_indptr[t + 1] as usize];
        assert_eq!(ext, (0..=t as i32).collect::<Vec<_>>(), "token {t}");
        assert_eq!(
            out.prefix_indptr[t + 1],
            out.prefix_indptr[t],
            "fresh chunk has no prefix"
        );
    }
    for (k, pos) in (16..20).enumerate() {
        let t = 5 + k;
        let swa_low = pos - 7;
        let prefix_want: Vec<i32> = (swa_low..16).map(|q| s1 * ring + q % ring).collect();
        let ext_want: Vec<i32> = (5..=5 + k as i32).collect();
        let prefix = &out.prefix[out.prefix_indptr[t] as usize..out.prefix_indptr[t + 1] as usize];
        let ext = &out.extend[out.extend_indptr[t] as usize..out.extend_indptr[t + 1] as usize];
        assert_eq!(prefix, prefix_want, "token {t}");
        assert_eq!(ext, ext_want, "token {t}");
        assert_eq!(
            prefix.len() + ext.len(),
            8,
            "prefix + extend = min(pos + 1, win)"
        );
    }
    assert_eq!(out.prefix_indptr[10], out.prefix_indptr[9], "padding token");
    assert_eq!(out.extend_indptr[10], out.extend_indptr[9], "padding token");
}

/// Compressed prefix entries: leading valid entries within the visible groups.
#[test]
fn prefill_compressed_prefix_follows_visibility() {
    let ctx = Ctx::cpu(1);
    let spec = PoolSpec {
        ratios: vec![4],
        max_requests: 1,
        window: 4,
        spec_extra: 0,
        c128_blocks: 2,
    };
    let pool = Pool::new(&ctx, &spec);
    let p = pool.info().swa_rows as i32;
    // Chunk of positions 8..11 with chunk_start 8; visible groups (pos+1)/4.
    let width = 3;
    let table = [10, 11, 12, 10, 11, 12, 10, 11, 12, 10, -1, 12];
    let inp = PrefillInputs {
        batch_id: &[0, 0, 0, 0],
        req_slots: &[1],
        positions: &[8, 9, 10, 11],
        chunk_start: &[8],
        extend_start: &[0],
        table: Some((&table, width)),
        ratio: 4,
    };
    let out = build_prefill(&pool, &inp, 4);
    let ring = 4;
    let expect: [Vec<i32>; 4] = [
        // pos 8: window 5..8 -> prior part 5,6,7; 2 visible groups.
        vec![ring + 5 % 4, ring + 6 % 4, ring + 7 % 4, p + 10, p + 11],
        vec![ring + 6 % 4, ring + 7 % 4, p + 10, p + 11],
        vec![ring + 7 % 4, p + 10, p + 11],
        // pos 11: 3 visible, but entry 1 is -1 -> only the first.
        vec![p + 10],
    ];
    for (t, want) in expect.iter().enumerate() {
        let got = &out.prefix[out.prefix_indptr[t] as usize..out.prefix_indptr[t + 1] as usize];
        assert_eq!(got, &want[..], "token {t}");
    }
}

/// Random batches against a direct restatement of docs/index-streams.md §3, §4 in this test.
#[test]
fn decode_streams_match_formulas_on_random_batches() {
    use rand::Rng;
    let mut rng = rand::rng();
    let ctx = Ctx::cpu(2);
    for _ in 0..20 {
        let win = rng.random_range(1..40usize);
        let spec = PoolSpec {
            ratios: vec![0, 4, 128],
            max_requests: 6,
            window: win as u32,
            spec_extra: rng.random_range(0..4),
            c128_blocks: 32,
        };
        let pool = Pool::new(&ctx, &spec);
        let info = pool.info();
        let (ring, p) = (info.ring as i32, info.swa_rows as i32);
        let t = rng.random_range(1..24usize);
        let reqs = 6;
        let req_slots: Vec<i32> = (0..reqs).map(|_| rng.random_range(0..7)).collect();
        let batch_id: Vec<i32> = (0..t).map(|_| rng.random_range(-1..reqs)).collect();
        let positions: Vec<i32> = (0..t).map(|_| rng.random_range(0..9000)).collect();
        let width = rng.random_range(1..80usize);
        let c128: Vec<i32> = (0..t * width)
            .map(|_| {
                if rng.random_bool(0.97) {
                    rng.random_range(0..34)
                } else {
                    -1
                }
            })
            .collect();
        let topk = rng.random_range(0..64u32);
        let inp = DecodeInputs {
            batch_id: &batch_id,
            req_slots: &req_slots,
            positions: &positions,
            c128: Some((&c128, width)),
            topk,
        };
        let mut out = build_decode(&pool, &inp, win);
        let csa_table: Vec<i32> = (0..t * topk as usize)
            .map(|_| rng.random_range(0..32 * 32 + 64))
            .collect();
        if topk > 0 {
            fill_tail(&pool, &inp, &csa_table, topk as usize, &mut out);
        }
        for i in 0..t {
            let (mut swa, mut hca, mut csa) = (vec![], vec![], vec![]);
            if batch_id[i] >= 0 {
                let slot = req_slots[batch_id[i] as usize];
                let pos = positions[i];
                let n = (pos + 1).min(win as i32);
                swa = (pos - n + 1..=pos)
                    .map(|q| slot * ring + q % ring)
                    .collect();
                hca = swa.clone();
                let visible = ((pos + 1) / 128) as usize;
                for j in 0..visible.min(width) {
                    let pi = c128[i * width + j];
                    if pi < 0 {
                        break;
                    }
                    hca.push(p + pi);
                }
                csa = swa.clone();
                let k = (((pos + 1) / 4) as usize).min(topk as usize);
                csa.extend((0..k).map(|j| p + csa_table[i * topk as usize + j]));
            }
            assert_eq!(DecodeStreams::slice(&out.swa_indptr, &out.swa, i), swa);
            assert_eq!(DecodeStreams::slice(&out.hca_indptr, &out.hca, i), hca);
            assert_eq!(DecodeStreams::slice(&out.csa_indptr, &out.csa, i), csa);
        }
    }
}
