//! The pool stores against the CPU backend, byte for byte.

use super::*;

/// Byte for byte, bf16 and both FP8 pools (every byte poisoned first, so an
/// unwritten FP8 pad byte fails too).
#[test]
fn stores_match_cpu_exactly() {
    let Some(s) = setup() else { return };
    for dtype in [
        unikv_dtype::UNIKV_DTYPE_BF16,
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ,
    ] {
        check_stores(&s, dtype);
    }
}

fn check_stores(s: &Setup, dtype: unikv_dtype) {
    let mut rng = rand::rng();
    let (pc, pg, spec) = index_pools_of(s, dtype);
    poison_layer(&s.cpu, &pc, 1, 0xA5);
    poison_layer(&s.gpu, &pg, 1, 0xA5);
    let t = 300;
    // Tiles of different magnitudes exercise many scale bytes.
    let kv: Vec<bf16> = random_bf16(&mut rng, t * 512)
        .chunks(64)
        .flat_map(|tile| {
            let f = 2f32.powi(rng.random_range(-12..12));
            tile.iter()
                .map(move |x| bf16::from_f32(x.to_f32() * f))
                .collect::<Vec<_>>()
        })
        .collect();
    // Request 0 is a 200-token chunk (longer than the ring), then 99 decode-like rows and a pad.
    let batch: Vec<i32> = (0..t)
        .map(|i| {
            if i < 200 {
                0
            } else if i < 299 {
                1 + (i as i32 % 4)
            } else {
                -1
            }
        })
        .collect();
    let slots = [1, 2, 3, 4, 5];
    let pos: Vec<i32> = (0..t)
        .map(|i| {
            if i < 200 {
                1000 + i as i32
            } else {
                7 + i as i32
            }
        })
        .collect();
    let final_pos: Vec<i32> = (0..5)
        .map(|b| {
            batch
                .iter()
                .zip(&pos)
                .filter(|(x, _)| **x == b)
                .map(|(_, p)| *p)
                .max()
                .unwrap_or(0)
        })
        .collect();
    // Each of requests 1..4 writes ~25 consecutive positions: fewer than the ring.
    let loc: Vec<i32> = (0..t)
        .map(|i| {
            if i % 3 == 0 {
                -1
            } else {
                rng.random_range(0..spec.c128_blocks as i32 * 32 + 64)
            }
        })
        .collect();
    let mut seen = std::collections::HashSet::new();
    let loc: Vec<i32> = loc
        .into_iter()
        .map(|l| if l >= 0 && !seen.insert(l) { -1 } else { l })
        .collect();
    for (ctx, pool) in [(&s.cpu, &pc), (&s.gpu, &pg)] {
        let (k, b, sl, p, f, l) = (
            Dev::upload(ctx, &kv),
            Dev::upload(ctx, &batch),
            Dev::upload(ctx, &slots),
            Dev::upload(ctx, &pos),
            Dev::upload(ctx, &final_pos),
            Dev::upload(ctx, &loc),
        );
        let args = unikv_store_swa_args {
            struct_size: std::mem::size_of::<unikv_store_swa_args>(),
            kv: k.t::<bf16>(&[t, 512]),
            batch_id: b.t::<i32>(&[t]),
            req_slots: sl.t::<i32>(&[5]),
            positions: p.t::<i32>(&[t]),
            final_pos: f.t::<i32>(&[5]),
            layer: 1,
            num_tokens: t as u32,
        };
        ok(unsafe { unikv_store_swa(pool.0, &args, ptr::null_mut()) });
        let cargs = unikv_store_compressed_args {
            struct_size: std::mem::size_of::<unikv_store_compressed_args>(),
            kv: k.t::<bf16>(&[t, 512]),
            loc: l.t::<i32>(&[t]),
            layer: 1,
            num_rows: t as u32,
        };
        ok(unsafe { unikv_store_compressed(pool.0, &cargs, ptr::null_mut()) });
    }
    assert!(
        read_layer(&s.gpu, &pg, 1) == read_layer(&s.cpu, &pc, 1),
        "{dtype:?}: GPU pool bytes differ from the CPU's"
    );
}
