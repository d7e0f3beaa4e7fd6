//! `unikv_store_flashmla` and `unikv_store_indexer` through the C ABI on the
//! CPU backend (docs/fp8.md §2, §5, §6).
//!
//! * Random rows at random locations (negative ones skipped, first and last
//!   slot of pages), every page size and both FP8 formats, int32 and int64
//!   locations, bf16 and f32 keys, padded row strides: the poisoned cache
//!   equals byte for byte what `unikv::cache_layouts` writes, and
//!   independently each stored token, found at the documented offsets (docs/fp8.md §5, §6), decodes to
//!   its input within half an FP8 step with the documented scale (docs/fp8.md §3).
//! * Bad input fails with its specific status and a message naming the
//!   argument, and leaves every cache byte as it was.
//!
//! Random tests draw fresh inputs each run; the seed is printed. Rerun a
//! failure with `UNIKV_TEST_SEED=<seed>`.

mod common;

use common::cache_store::*;
use common::*;
use half::bf16;
use unikv::ffi::types::unikv_dtype;
use unikv::fp8::{decode, Fp8Format};

/// Runs a case on host buffers and returns the cache.
fn run_case(ctx: &Ctx, case: &Case) -> HostBytes {
    let cache = HostBytes::poisoned(case.cache_bytes());
    let (rows, loc) = (case.row_buffer(), case.loc_buffer());
    ok(case.call(cache.ptr(), rows.ptr(), loc.ptr()).run(ctx));
    cache
}

/// Half the FP8 step at |y| (y = x / scale, |y| <= max): at most |y| / 16 for
/// normal codes (3 mantissa bits), 2^-(bias+3) among the subnormals.
fn half_step(y: f64, fmt: Fp8Format) -> f64 {
    let bias = match fmt {
        Fp8Format::E4m3Fn => 7,
        Fp8Format::E4m3Fnuz => 8,
    };
    (y.abs() / 16.0).max(2f64.powi(-bias - 3))
}

fn fp8_max(fmt: Fp8Format) -> f64 {
    match fmt {
        Fp8Format::E4m3Fn => 448.0,
        Fp8Format::E4m3Fnuz => 240.0,
    }
}

/// docs/fp8.md §5 for each stored token: value slot at `page·bpp + slot·576`,
/// scale slot at `page·bpp + 576·P + slot·8`. Each tile's scale is the
/// smallest power of two not below the fp32 quotient max(amax, 1e-4) / max,
/// each code decodes times it to the input within half a step, and the RoPE
/// dims are the input's bf16 bits.
fn check_flashmla_tokens(case: &Case, cache: &[u8]) {
    let (p, bpp) = (case.page_size, case.bytes_per_page() as u64);
    for (t, &l) in case.locations.iter().enumerate() {
        let Ok(l) = u64::try_from(l) else { continue };
        let row = &case.rows[t * 512..][..512];
        let (page, slot) = (l / p, l % p);
        let value = (page * bpp + slot * 576) as usize;
        let scales = (page * bpp + 576 * p + slot * 8) as usize;
        for k in 0..7 {
            let tile = &row[64 * k..][..64];
            let amax = tile.iter().map(|x| x.abs()).fold(0f32, f32::max);
            let quotient = f64::from((f64::from(amax.max(1e-4)) / fp8_max(case.fmt)) as f32);
            let scale = 2f64.powi(i32::from(cache[scales + k]) - 127);
            assert!(
                scale >= quotient && scale / 2.0 < quotient,
                "token {t} tile {k}: scale {scale} for quotient {quotient}"
            );
            for (i, &x) in tile.iter().enumerate() {
                let got = f64::from(decode(cache[value + 64 * k + i], case.fmt)) * scale;
                let x = f64::from(x);
                assert!(
                    (got - x).abs() <= half_step(x / scale, case.fmt) * scale,
                    "token {t} dim {}: {got} for {x}",
                    64 * k + i
                );
            }
        }
        for (j, &x) in row[448..].iter().enumerate() {
            let at = value + 448 + 2 * j;
            assert_eq!(
                [cache[at], cache[at + 1]],
                bf16::from_f32(x).to_le_bytes(),
                "token {t} rope dim {j}"
            );
        }
    }
}

/// docs/fp8.md §6 for each stored key: codes at `page·132P + slot·128`, the fp32
/// scale at `page·132P + 128·P + slot·4`, equal to the correctly rounded
/// max(amax, 1e-4) / max; each code times it is the input within half a step
/// (plus the fp32 roundings of x·(1/scale) and of the product).
fn check_indexer_tokens(case: &Case, cache: &[u8]) {
    let p = case.page_size;
    for (t, &l) in case.locations.iter().enumerate() {
        let Ok(l) = u64::try_from(l) else { continue };
        let key = &case.rows[t * 128..][..128];
        let (page, slot) = (l / p, l % p);
        let value = (page * 132 * p + slot * 128) as usize;
        let at = (page * 132 * p + 128 * p + slot * 4) as usize;
        let scale = f32::from_le_bytes(cache[at..at + 4].try_into().unwrap());
        let amax = key.iter().map(|x| x.abs()).fold(0f32, f32::max);
        let want = (f64::from(amax.max(1e-4)) / fp8_max(case.fmt)) as f32;
        assert_eq!(scale, want, "key {t}: scale");
        let scale = f64::from(scale);
        for (i, &x) in key.iter().enumerate() {
            let got = f64::from(decode(cache[value + i], case.fmt)) * scale;
            let x = f64::from(x);
            let bound = half_step(x / scale, case.fmt) * scale + x.abs() * 1e-6;
            assert!((got - x).abs() <= bound, "key {t} dim {i}: {got} for {x}");
        }
    }
}

#[test]
fn random_stores_match_layouts_and_input() {
    let (mut rng, _) = seeded("random_stores_match_layouts_and_input");
    let ctx = Ctx::cpu(2);
    let mut cases = 0;
    for layout in Layout::ALL {
        for &p in layout.page_sizes() {
            for fmt in FORMATS {
                for _ in 0..4 {
                    let case = Case::random(&mut rng, layout, p, fmt, 300);
                    let cache = run_case(&ctx, &case);
                    assert!(
                        cache.bytes() == case.expected().as_slice(),
                        "{layout:?} P = {p} {:?}: bytes differ from cache_layouts",
                        case.fmt
                    );
                    match layout {
                        Layout::FlashMla => check_flashmla_tokens(&case, cache.bytes()),
                        Layout::Indexer => check_indexer_tokens(&case, cache.bytes()),
                    }
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(cases, 32);
}

#[test]
fn skipped_and_empty_stores_write_nothing() {
    let (mut rng, _) = seeded("skipped_and_empty_stores_write_nothing");
    let ctx = Ctx::cpu(1);
    for layout in Layout::ALL {
        let mut case = Case::random(&mut rng, layout, 64, FORMATS[0], 40);
        case.locations.iter_mut().for_each(|l| *l = -1);
        let cache = run_case(&ctx, &case);
        assert!(
            cache.bytes().iter().all(|&b| b == POISON_BYTE),
            "{layout:?}"
        );
        // num_tokens = 0 reads no location (the spare ones point past the cache).
        let (rows, loc) = (case.row_buffer(), case.loc_buffer());
        let mut call = case.call(cache.ptr(), rows.ptr(), loc.ptr());
        call.num_tokens = 0;
        ok(call.run(&ctx));
        assert!(
            cache.bytes().iter().all(|&b| b == POISON_BYTE),
            "{layout:?}"
        );
    }
}

/// A valid call of each layout and a way to break it, with the status and the
/// argument the message must name.
type Breakage = (
    &'static str,
    unikv::ffi::status::unikv_status,
    &'static str,
    fn(&mut StoreCall),
);

fn breakages() -> Vec<Breakage> {
    vec![
        ("unknown cache_dtype", UNIKV_BAD_ENUM, "cache_dtype", |c| {
            c.cache_dtype = 99
        }),
        ("zero cache_dtype", UNIKV_BAD_ENUM, "cache_dtype", |c| {
            c.cache_dtype = 0
        }),
        ("bf16 cache_dtype", UNIKV_BAD_DTYPE, "cache_dtype", |c| {
            c.cache_dtype = unikv_dtype::UNIKV_DTYPE_BF16 as u32
        }),
        ("u8 cache_dtype", UNIKV_BAD_DTYPE, "cache_dtype", |c| {
            c.cache_dtype = unikv_dtype::UNIKV_DTYPE_U8 as u32
        }),
        ("page size 128", UNIKV_INVALID_ARGUMENT, "page_size", |c| {
            c.page_size = 128
        }),
        ("page size 0", UNIKV_INVALID_ARGUMENT, "page_size", |c| {
            c.page_size = 0
        }),
        ("cache not u8", UNIKV_BAD_DTYPE, "cache", |c| {
            c.cache.dtype = unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN as u32
        }),
        ("cache rank 1", UNIKV_BAD_SHAPE, "cache", |c| {
            c.cache.ndim = 1
        }),
        ("cache row short", UNIKV_BAD_SHAPE, "cache", |c| {
            c.cache.shape[1] -= 16;
            c.cache.strides[0] -= 16;
        }),
        ("cache without pages", UNIKV_BAD_SHAPE, "cache", |c| {
            c.cache.shape[0] = 0
        }),
        ("cache row stride padded", UNIKV_BAD_STRIDE, "cache", |c| {
            c.cache.shape[0] -= 1;
            c.cache.strides[0] += 16;
        }),
        ("cache misaligned", UNIKV_BAD_ALIGNMENT, "cache", |c| {
            c.cache.data = c.cache.data.wrapping_byte_add(8)
        }),
        ("cache NULL", UNIKV_NULL_ARGUMENT, "cache", |c| {
            c.cache.data = std::ptr::null_mut()
        }),
        ("rows wrong width", UNIKV_BAD_SHAPE, "", |c| {
            c.rows.shape[1] -= 8
        }),
        ("fewer rows than tokens", UNIKV_BAD_SHAPE, "", |c| {
            c.rows.shape[0] = i64::from(c.num_tokens) - 1
        }),
        ("rows f16", UNIKV_BAD_DTYPE, "", |c| {
            c.rows.dtype = unikv_dtype::UNIKV_DTYPE_F16 as u32
        }),
        ("loc f32", UNIKV_BAD_DTYPE, "loc", |c| {
            c.loc.dtype = unikv_dtype::UNIKV_DTYPE_F32 as u32
        }),
        ("loc unknown dtype", UNIKV_BAD_ENUM, "loc", |c| {
            c.loc.dtype = 42
        }),
        ("loc short", UNIKV_BAD_SHAPE, "loc", |c| {
            c.loc.shape[0] = i64::from(c.num_tokens) - 1
        }),
        ("reserved set", UNIKV_INVALID_ARGUMENT, "reserved", |c| {
            c.reserved = 1
        }),
    ]
}

#[test]
fn bad_arguments_fail_and_write_nothing() {
    let (mut rng, _) = seeded("bad_arguments_fail_and_write_nothing");
    let ctx = Ctx::cpu(1);
    for layout in Layout::ALL {
        let rows_name = match layout {
            Layout::FlashMla => "kv",
            Layout::Indexer => "key",
        };
        let case = Case::random(&mut rng, layout, 64, FORMATS[1], 20);
        let (rows, loc) = (case.row_buffer(), case.loc_buffer());
        // One page more than the call names, so a wrongly accepted stride or
        // offset still stays inside the buffer.
        let cache = HostBytes::poisoned(case.cache_bytes() + case.bytes_per_page());
        for (what, status, arg, breakage) in breakages() {
            let mut call = case.call(cache.ptr(), rows.ptr(), loc.ptr());
            breakage(&mut call);
            let arg = if arg.is_empty() { rows_name } else { arg };
            fails(call.run(&ctx), status, arg);
            assert!(
                cache.bytes().iter().all(|&b| b == POISON_BYTE),
                "{layout:?}, {what}: cache written"
            );
        }
        ok(case.call(cache.ptr(), rows.ptr(), loc.ptr()).run(&ctx));
    }
}

#[test]
fn bad_locations_fail_and_write_nothing() {
    let (mut rng, _) = seeded("bad_locations_fail_and_write_nothing");
    let ctx = Ctx::cpu(1);
    for layout in Layout::ALL {
        for loc_i64 in [false, true] {
            let mut case = Case::random(&mut rng, layout, 64, FORMATS[0], 64);
            case.loc_i64 = loc_i64;
            let n = case.num_tokens();
            // Valid tokens before and after the bad one: none may be written.
            let slots = (case.num_pages as u64 * case.page_size) as i64;
            let (bad, last) = (n / 2, n - 1);
            let mut past = case.clone();
            past.locations[bad] = slots;
            let mut far = case.clone();
            far.locations[bad] = slots + 1000;
            let mut breakages = vec![
                (past, UNIKV_OUT_OF_RANGE, format!("loc[{bad}]")),
                (far, UNIKV_OUT_OF_RANGE, format!("loc[{bad}]")),
            ];
            // Two tokens aimed at one location (a race on a GPU).
            if let Some(first) = (0..last).find(|&t| case.locations[t] >= 0) {
                let mut twice = case.clone();
                twice.locations[last] = case.locations[first];
                breakages.push((twice, UNIKV_INVALID_ARGUMENT, format!("loc[{last}]")));
            }
            for (broken, status, arg) in breakages {
                let cache = HostBytes::poisoned(case.cache_bytes());
                let (rows, loc) = (broken.row_buffer(), broken.loc_buffer());
                let call = broken.call(cache.ptr(), rows.ptr(), loc.ptr());
                fails(call.run(&ctx), status, &arg);
                assert!(
                    cache.bytes().iter().all(|&b| b == POISON_BYTE),
                    "{layout:?}, {arg}: cache written"
                );
            }
        }
    }
}

#[test]
fn int64_locations_past_i32() {
    // A location past 2^31 is checked as a 64-bit value, not truncated to a
    // valid one (2^32 + 5 would be 5 as int32).
    let (mut rng, _) = seeded("int64_locations_past_i32");
    let ctx = Ctx::cpu(1);
    let mut case = Case::random(&mut rng, Layout::FlashMla, 2, FORMATS[0], 4);
    case.loc_i64 = true;
    case.locations = vec![0, (1i64 << 32) + 1];
    case.rows = random_rows(&mut rng, Layout::FlashMla, 2, true);
    let cache = HostBytes::poisoned(case.cache_bytes());
    let (rows, loc) = (case.row_buffer(), case.loc_buffer());
    let call = case.call(cache.ptr(), rows.ptr(), loc.ptr());
    fails(call.run(&ctx), UNIKV_OUT_OF_RANGE, "loc[1]");
    assert!(cache.bytes().iter().all(|&b| b == POISON_BYTE));
}
