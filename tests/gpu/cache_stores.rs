//! The FlashMLA and indexer cache stores (unikv_store_flashmla / _indexer) on
//! the GPU against the CPU backend, whole caches byte for byte.

use super::*;

use common::cache_store::{codec_edge_tiles, random_rows, Case, Layout, FORMATS};

/// Runs a cache store on `ctx` with its buffers in that context's memory and
/// returns the cache, poisoned before the call.
fn cache_store_on<'a>(ctx: &'a Ctx, case: &Case) -> Dev<'a> {
    let cache = Dev::zeroed(ctx, case.cache_bytes());
    cache.poison();
    let rows = Dev::upload(ctx, case.row_buffer().bytes());
    let loc = Dev::upload(ctx, case.loc_buffer().bytes());
    ok(case.call(cache.ptr, rows.ptr, loc.ptr).run(ctx));
    cache
}

/// Rows through the codec's edge cases: all-zero tiles and keys, NaN and ±Inf
/// elements, values near the bf16 maximum, bf16 subnormals, and values whose
/// scaled codes are ties between FP8 neighbours (17, 19, 21 at scale 1: round
/// to the even mantissa).
fn special_rows(layout: Layout) -> Vec<f32> {
    let groups = codec_edge_tiles();
    let values: Vec<f32> = groups
        .iter()
        .flatten()
        .map(|&x| bf16::from_f32(x).to_f32())
        .collect();
    // Each row cycles through the groups from its own start, so every group
    // lands in FlashMLA nope tiles, RoPE dims and indexer keys; the last row
    // is all zeros.
    let (dims, len) = (layout.dims(), values.len());
    (0..groups.len())
        .flat_map(|r| (0..dims).map(move |d| (r * 64 + d) % len))
        .map(|i| values[i])
        .chain(std::iter::repeat(0.0).take(dims))
        .collect()
}

#[test]
fn cache_stores_match_cpu_exactly() {
    let Some(s) = setup() else { return };
    let (mut rng, _) = seeded("cache_stores_match_cpu_exactly");
    let max_tokens = if small() { 40 } else { 600 };
    for layout in Layout::ALL {
        for &p in layout.page_sizes() {
            for fmt in FORMATS {
                for loc_i64 in [false, true] {
                    let mut case = Case::random(&mut rng, layout, p, fmt, max_tokens);
                    case.loc_i64 = loc_i64;
                    let specials = special_rows(layout);
                    let n = specials.len().min(case.rows.len());
                    case.rows[..n].copy_from_slice(&specials[..n]);
                    let what = format!("{layout:?} P = {p} {:?} i64 loc {loc_i64}", case.fmt);
                    let want = cache_store_on(&s.cpu, &case).read::<u8>();
                    assert!(
                        want != vec![POISON_BYTE; want.len()],
                        "{what}: nothing stored"
                    );
                    let got = cache_store_on(&s.gpu, &case).read::<u8>();
                    assert!(got == want, "{what}: GPU bytes differ from the CPU's");

                    // On the GPU a location past the cache is skipped, like a
                    // negative one on the CPU.
                    let slots = (case.num_pages as u64 * p) as i64;
                    let mut past = case.clone();
                    let mut skipped = case.clone();
                    for t in (0..case.num_tokens()).step_by(3) {
                        past.locations[t] = slots + t as i64;
                        skipped.locations[t] = -1;
                    }
                    let want = cache_store_on(&s.cpu, &skipped).read::<u8>();
                    let got = cache_store_on(&s.gpu, &past).read::<u8>();
                    assert!(got == want, "{what}: locations past the cache");
                }
            }
        }
    }
}

#[test]
fn cache_store_validate_mode_reports_bad_locations() {
    if gpu().is_none() {
        return;
    }
    let strict = validating_gpu();
    let (mut rng, _) = seeded("cache_store_validate_mode_reports_bad_locations");
    for layout in Layout::ALL {
        let mut case = Case::random(&mut rng, layout, 64, FORMATS[0], 50);
        let bad = case.num_tokens() / 2;
        case.locations[bad] = (case.num_pages * 64) as i64;
        let cache = Dev::zeroed(&strict, case.cache_bytes());
        cache.poison();
        let rows = Dev::upload(&strict, case.row_buffer().bytes());
        let loc = Dev::upload(&strict, case.loc_buffer().bytes());
        let status = case.call(cache.ptr, rows.ptr, loc.ptr).run(&strict);
        fails(status, UNIKV_OUT_OF_RANGE, &format!("loc[{bad}]"));
        assert!(
            cache.read::<u8>().iter().all(|&b| b == POISON_BYTE),
            "{layout:?}: nothing written"
        );
    }
}

/// `bytes` of device memory at `offset` bytes into `buf`.
fn read_range(buf: &Dev, offset: usize, bytes: usize) -> Vec<u8> {
    assert!(offset + bytes <= buf.bytes);
    let mut out = vec![0u8; bytes];
    ok(unsafe {
        unikv_memory_copy(
            buf.ctx.0,
            out.as_mut_ptr().cast(),
            buf.ptr.cast::<u8>().add(offset).cast(),
            bytes,
            1,
            ptr::null_mut(),
        )
    });
    ok(unsafe { unikv_stream_synchronize(buf.ctx.0, ptr::null_mut()) });
    out
}

/// Stores every slot of `pages` (in random order, with skipped tokens mixed
/// in) into a GPU cache of `total_pages` pages, more than 4 GiB, and compares
/// those pages with the CPU store of the same tokens into a cache of just
/// those pages; `guards` are pages nothing is stored to, which must stay
/// poisoned.
fn check_cache_past_4gib(
    s: &Setup,
    rng: &mut impl Rng,
    (layout, page_size, loc_i64): (Layout, u64, bool),
    total_pages: usize,
    pages: &[usize],
    guards: &[usize],
) {
    let bpp = layout.bytes_per_page(page_size) as usize;
    assert!(total_pages * bpp > 1 << 32);
    let mut small_loc = vec![];
    let mut big_loc = vec![];
    for (j, &page) in pages.iter().enumerate() {
        for slot in 0..page_size {
            small_loc.push((j as u64 * page_size + slot) as i64);
            big_loc.push((page as u64 * page_size + slot) as i64);
        }
    }
    for _ in 0..small_loc.len() / 8 {
        small_loc.push(-1);
        big_loc.push(-1);
    }
    let mut order: Vec<usize> = (0..small_loc.len()).collect();
    order.shuffle(rng);
    let n = order.len();
    let small = Case {
        layout,
        page_size,
        fmt: FORMATS[0].0,
        cache_dtype: FORMATS[0].1,
        num_pages: pages.len(),
        rows: random_rows(rng, layout, n, true),
        locations: order.iter().map(|&i| small_loc[i]).collect(),
        f32_rows: false,
        loc_i64,
    };
    let big = Case {
        num_pages: total_pages,
        locations: order.iter().map(|&i| big_loc[i]).collect(),
        ..small.clone()
    };
    let want = cache_store_on(&s.cpu, &small).read::<u8>();
    let got = cache_store_on(&s.gpu, &big);
    for (j, &page) in pages.iter().enumerate() {
        assert!(
            read_range(&got, page * bpp, bpp) == want[j * bpp..][..bpp],
            "{layout:?}: page {page} (bytes {} ..) differs from the CPU's",
            page * bpp
        );
    }
    for &page in guards {
        assert!(
            read_range(&got, page * bpp, bpp)
                .iter()
                .all(|&b| b == POISON_BYTE),
            "{layout:?}: page {page} was written"
        );
    }
}

/// Byte offsets past 2^31 and 2^32 (docs/fp8.md §5: 32-bit offsets
/// faulted once a per-layer cache passed 2 GiB). Skipped under
/// UNIKV_GPU_TEST_SMALL (two caches of 4.3 GB).
#[test]
fn cache_stores_past_4gib_match_cpu() {
    if small() {
        eprintln!("UNIKV_GPU_TEST_SMALL: skipped");
        return;
    }
    let Some(s) = setup() else { return };
    let (mut rng, _) = seeded("cache_stores_past_4gib_match_cpu");
    // FlashMLA, pages of 149 760 bytes: page 14 339 straddles 2^31, page
    // 28 679 straddles 2^32. int32 locations: only the offsets are 64-bit.
    check_cache_past_4gib(
        &s,
        &mut rng,
        (Layout::FlashMla, 256, false),
        28_700,
        &[0, 14_339, 14_340, 28_679, 28_699],
        &[14_338, 28_678],
    );
    // Indexer, pages of 8 448 bytes: page 254 200 straddles 2^31, page
    // 508 400 straddles 2^32.
    check_cache_past_4gib(
        &s,
        &mut rng,
        (Layout::Indexer, 64, true),
        508_500,
        &[0, 254_200, 508_400, 508_499],
        &[254_199, 508_401],
    );
}
