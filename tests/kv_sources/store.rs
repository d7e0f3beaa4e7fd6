//! `unikv_store_scaled_fp8` on the CPU backend: the bytes against the test's
//! own model of docs/fp8.md §8 (f64 arithmetic rounded to f32 where the rule
//! rounds, and an encoder that picks the nearest FP8 value from the table of
//! all codes), the rows read back within the format's error, the round trip
//! through attention, and bad input.

use std::ptr;

use half::bf16;
use unikv::ffi::attention::unikv_kv_cache;
use unikv::ffi::attention::unikv_kv_layout;
use unikv::ffi::status::unikv_status::*;
use unikv::ffi::types::unikv_dtype;

use crate::common::scaled_store::*;
use crate::common::*;
use crate::layouts::*;
use crate::run::*;
use crate::D;

fn fmt_of(dtype: unikv_dtype) -> Fmt {
    match dtype {
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ => Fmt::Fnuz,
        _ => Fmt::Fn,
    }
}

/// The FP8 code nearest `x` (an f32 value): the non-NaN code whose value is
/// closest, ties to the even code (the even mantissa), a zero result signed
/// like `x` where the flavour has -0 (fn), beyond the maximum the maximum's
/// code; NaN to the flavour's NaN code.
fn nearest_code(fmt: Fmt, x: f32) -> u8 {
    if x.is_nan() {
        return if fmt == Fmt::Fn { 0x7F } else { 0x80 };
    }
    let x = f64::from(x);
    let mut best: Option<(u8, f64)> = None;
    for c in 0..=255u8 {
        if fmt.is_nan(c) {
            continue;
        }
        let v = fmt.decode(c);
        if v == 0.0 && (c & 0x80 != 0) != x.is_sign_negative() && fmt == Fmt::Fn {
            continue; // the zero of the other sign
        }
        let d = (v - x).abs();
        best = match best {
            Some((b, bd)) if bd < d || (bd == d && b & 1 == 0) => Some((b, bd)),
            _ => Some((c, d)),
        };
    }
    best.unwrap().0
}

/// The model of one row: (codes, scales).
fn model_row(fmt: Fmt, divisor: f32, row: &[bf16]) -> (Vec<u8>, Vec<f32>) {
    let mut codes = Vec::with_capacity(D);
    let mut scales = Vec::with_capacity(8);
    for tile in row.chunks_exact(64) {
        let amax = tile
            .iter()
            .map(|x| x.to_f64().abs())
            .filter(|a| !a.is_nan())
            .fold(0.0f64, f64::max);
        // f32 division and reciprocal, correctly rounded: the f64 quotient of
        // two f32 values rounds to the same f32.
        let scale = (amax.max(f64::from(1e-4f32)) / f64::from(divisor)) as f32;
        let inv = (1.0 / f64::from(scale)) as f32;
        scales.push(scale);
        for x in tile {
            // The f64 product of two f32 values is exact; `as f32` rounds once.
            let y = if x.is_infinite() && inv == 0.0 {
                f32::NAN
            } else {
                (x.to_f64() * f64::from(inv)) as f32
            };
            codes.push(nearest_code(fmt, y));
        }
    }
    (codes, scales)
}

#[test]
fn stored_bytes_match_the_model() {
    let (mut rng, seed) = seeded("stored_bytes_match_the_model");
    let ctx = Ctx::cpu(2);
    for (dtype, divisor) in FLAVOURS {
        let case = ScaledCase::random(&mut rng, dtype, divisor, 40).with_specials();
        let (codes, scales) = case.outputs(&ctx);
        ok(case.run(&ctx, &codes, &scales));
        let (codes, scales) = (codes.read::<u8>(), scales.read::<f32>());
        let fmt = fmt_of(dtype);
        let div = match (divisor, fmt) {
            (0, Fmt::Fn) => 448.0,
            (0, Fmt::Fnuz) => 240.0,
            (d, _) => d as f32,
        };
        let mut written = vec![false; case.num_rows];
        for (t, &l) in case.locations.iter().enumerate() {
            if l < 0 {
                continue;
            }
            let l = l as usize;
            written[l] = true;
            let (want_codes, want_scales) = model_row(fmt, div, &case.rows[t * D..(t + 1) * D]);
            let what = format!("seed {seed} {dtype:?} divisor {divisor} token {t} row {l}");
            for (k, (g, w)) in scales[l * 8..(l + 1) * 8]
                .iter()
                .zip(&want_scales)
                .enumerate()
            {
                assert_eq!(g.to_bits(), w.to_bits(), "{what}: scale {k}: {g} vs {w}");
            }
            for (d, (g, w)) in codes[l * D..(l + 1) * D]
                .iter()
                .zip(&want_codes)
                .enumerate()
            {
                assert_eq!(g, w, "{what}: code {d} (x = {})", case.rows[t * D + d]);
            }
        }
        for (l, w) in written.iter().enumerate() {
            if !w {
                assert!(
                    codes[l * D..(l + 1) * D].iter().all(|&b| b == POISON_BYTE)
                        && scales[l * 8..(l + 1) * 8]
                            .iter()
                            .all(|s| s.to_bits() == u32::from_ne_bytes([POISON_BYTE; 4])),
                    "seed {seed} {dtype:?}: row {l} written though no token was stored there"
                );
            }
        }
    }
}

/// The rows a store wrote, read back as attention reads them, are within the
/// format's error of the latents, and attention over them is attention over
/// a bf16 pool holding those values (the round trip through the source).
#[test]
fn stored_rows_round_trip_through_attention() {
    let (mut rng, seed) = seeded("stored_rows_round_trip_through_attention");
    let ctx = Ctx::cpu(2);
    for (dtype, divisor) in FLAVOURS {
        let mut case = ScaledCase::random(&mut rng, dtype, divisor, 300);
        case.num_rows = case.tokens();
        case.locations = (0..case.tokens() as i64).collect();
        let (codes, scales) = case.outputs(&ctx);
        ok(case.run(&ctx, &codes, &scales));
        let fmt = fmt_of(dtype);
        let (code_bytes, scale_values) = (codes.read::<u8>(), scales.read::<f32>());
        let values: Vec<f64> = (0..case.num_rows * D)
            .map(|i| scaled_value(fmt, code_bytes[i], scale_values[i / 64]))
            .collect();
        for (i, (&v, x)) in values.iter().zip(&case.rows).enumerate() {
            // Codes keep 4 significant bits (relative error <= 2^-4); the
            // subnormal codes' step is scale * 2^-9 (fn) or 2^-10 (fnuz); the
            // read rounds to bf16 (2^-8).
            let (x, scale) = (x.to_f64(), f64::from(scale_values[i / 64]));
            let bound = x.abs() * (2f64.powi(-4) + 2f64.powi(-7)) + scale * 2f64.powi(-9);
            assert!(
                (v - x).abs() <= bound,
                "seed {seed} {dtype:?}/{divisor}: dim {i}: {v} vs {x}"
            );
        }
        let cache = Cache {
            layout: unikv_kv_layout::UNIKV_KV_LAYOUT_SCALED_FP8,
            fmt,
            page_size: 0,
            rows: case.num_rows,
            data: codes,
            scales: Some(scales),
            values,
        };
        let (tokens, heads) = (4, 6);
        let lists = random_lists(&mut rng, tokens, cache.rows, &[0, 3, 100]);
        let batch = Batch::new(&ctx, &mut rng, tokens, heads);
        let plan = Plan::for_cache(&ctx, false, tokens, heads, Some(&cache));
        let source = Stream {
            kv: cache.desc(),
            lists: lists.clone(),
        };
        ok(batch.decode(&plan, ptr::null(), 0, &source, None, &|_| {}));
        let got = batch.outputs();
        let pool = bf16_pool(&ctx, &mut rng, &[(&cache, 0)]);
        let plan = Plan::for_cache(&ctx, false, tokens, heads, None);
        batch.poison();
        let source = Stream {
            kv: unikv_kv_cache::default(),
            lists,
        };
        ok(batch.decode(&plan, pool.0, 1, &source, None, &|_| {}));
        assert_same_bits(
            &format!("seed {seed} {dtype:?}/{divisor}"),
            &got,
            &batch.outputs(),
        );
    }
}

#[test]
fn bad_scaled_stores_write_nothing() {
    let (mut rng, _seed) = seeded("bad_scaled_stores_write_nothing");
    let ctx = Ctx::cpu(2);
    let fnuz = unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ;
    let case = ScaledCase::random(&mut rng, unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN, 0, 20);
    let first = case.locations.iter().position(|&l| l >= 0).unwrap();
    let mut past = case.clone();
    past.locations[first] = case.num_rows as i64;
    let mut twice = case.clone();
    let second = case.locations.iter().rposition(|&l| l >= 0).unwrap();
    twice.locations[second] = case.locations[first];
    let mut fnuz448 = case.clone();
    (fnuz448.dtype, fnuz448.divisor) = (fnuz, 448);
    let mut odd = case.clone();
    odd.divisor = 100;
    type Edit = Box<dyn Fn(&mut unikv::ffi::cache_store::unikv_store_scaled_fp8_args)>;
    let none: Edit = Box::new(|_| {});
    let cases: Vec<(&str, &ScaledCase, Edit, _, &str)> = vec![
        (
            "row past the end",
            &past,
            Box::new(|_| {}),
            UNIKV_OUT_OF_RANGE,
            "loc[",
        ),
        (
            "two tokens, one row",
            &twice,
            Box::new(|_| {}),
            UNIKV_INVALID_ARGUMENT,
            "loc[",
        ),
        (
            "divisor 448 for fnuz",
            &fnuz448,
            Box::new(|_| {}),
            UNIKV_INVALID_ARGUMENT,
            "scale_divisor",
        ),
        (
            "divisor 100",
            &odd,
            Box::new(|_| {}),
            UNIKV_INVALID_ARGUMENT,
            "scale_divisor",
        ),
        (
            "bf16 codes",
            &case,
            Box::new(|a| a.cache_dtype = 1),
            UNIKV_BAD_DTYPE,
            "cache_dtype",
        ),
        (
            "unknown dtype",
            &case,
            Box::new(|a| a.cache_dtype = 77),
            UNIKV_BAD_ENUM,
            "cache_dtype",
        ),
        (
            "448 codes per row",
            &case,
            Box::new(|a| a.codes.shape[1] = 448),
            UNIKV_BAD_SHAPE,
            "codes",
        ),
        (
            "scale rows",
            &case,
            Box::new(|a| a.scales.shape[0] -= 1),
            UNIKV_BAD_SHAPE,
            "scales",
        ),
        (
            "no scales",
            &case,
            Box::new(|a| a.scales = absent()),
            UNIKV_NULL_ARGUMENT,
            "scales",
        ),
        (
            "f32 codes",
            &case,
            Box::new(|a| a.codes.dtype = 3),
            UNIKV_BAD_DTYPE,
            "codes",
        ),
        (
            "short kv",
            &case,
            Box::new(|a| a.kv.shape[0] -= 1),
            UNIKV_BAD_SHAPE,
            "kv",
        ),
        (
            "reserved",
            &case,
            Box::new(|a| a.reserved = 1),
            UNIKV_INVALID_ARGUMENT,
            "reserved",
        ),
        (
            "scales over the codes",
            &case,
            Box::new(|a| a.scales.data = a.codes.data),
            UNIKV_OVERLAPPING_BUFFERS,
            "scales",
        ),
        ("unchanged", &case, none, UNIKV_OK, ""),
    ];
    for (what, c, edit, status, name) in cases {
        let (codes, scales) = c.outputs(&ctx);
        let got = c.run_with(&ctx, &codes, &scales, edit.as_ref());
        assert_eq!(got, status, "{what}: {}", last_error());
        if status == UNIKV_OK {
            continue;
        }
        assert!(
            last_error().contains(name),
            "{what}: message {:?}",
            last_error()
        );
        assert!(
            codes.read::<u8>().iter().all(|&b| b == POISON_BYTE),
            "{what}: codes written"
        );
        assert!(
            scales.read::<u8>().iter().all(|&b| b == POISON_BYTE),
            "{what}: scales written"
        );
    }
}
