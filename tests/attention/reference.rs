//! The float64 reference (docs/attention.md §1; prefill docs/attention.md §2: both sources share one
//! softmax), and the check of outputs against it.

use super::*;

pub(crate) struct Reference {
    pub(crate) heads: usize,
    /// `[tokens, heads, 512]`.
    pub(crate) out: Vec<f64>,
    /// `[tokens, heads]`.
    pub(crate) lse: Vec<f64>,
    /// Keys of each token.
    pub(crate) keys: Vec<usize>,
}

pub(crate) fn dot64(a: &[f64], b: &[f64]) -> f64 {
    let mut lanes = [0f64; 8];
    for (ca, cb) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for i in 0..8 {
            lanes[i] += ca[i] * cb[i];
        }
    }
    lanes.iter().sum()
}

/// One token: `q` holds its head rows at `head_stride`; returns (out, lse).
pub(crate) fn reference_token(
    q: &[bf16],
    head_stride: usize,
    heads: usize,
    keys: &[&[bf16]],
    sink: Option<&[f32]>,
    scale: f32,
) -> (Vec<f64>, Vec<f64>) {
    let k64: Vec<f64> = keys
        .iter()
        .flat_map(|row| row.iter().map(|x| x.to_f64()))
        .collect();
    let scale = scale as f64;
    let mut out = vec![0f64; heads * D];
    let mut lse = vec![0f64; heads];
    let mut scores = Vec::with_capacity(keys.len());
    for h in 0..heads {
        let qh: Vec<f64> = q[h * head_stride..h * head_stride + D]
            .iter()
            .map(|x| x.to_f64())
            .collect();
        let z = sink.map_or(f64::NEG_INFINITY, |s| s[h] as f64);
        if keys.is_empty() {
            // Zero output; the log-sum-exp is the sink's own logit.
            lse[h] = z;
            continue;
        }
        scores.clear();
        scores.extend(k64.chunks_exact(D).map(|k| scale * dot64(&qh, k)));
        let m = scores.iter().fold(z, |a, &b| a.max(b));
        let mut den = if z == f64::NEG_INFINITY {
            0.0
        } else {
            (z - m).exp()
        };
        let acc = &mut out[h * D..(h + 1) * D];
        for (s, k) in scores.iter().zip(k64.chunks_exact(D)) {
            let w = (s - m).exp();
            den += w;
            for (a, x) in acc.iter_mut().zip(k) {
                *a += w * x;
            }
        }
        for a in acc.iter_mut() {
            *a /= den;
        }
        lse[h] = m + den.ln();
    }
    (out, lse)
}

/// The whole batch, tokens spread over the host's cores.
pub(crate) fn reference(
    q: &[bf16],
    layout: Layout,
    heads: usize,
    keys: &[Vec<&[bf16]>],
    sink: Option<&[f32]>,
    scale: f32,
) -> Reference {
    let tokens = keys.len();
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(tokens.max(1));
    let parts: Vec<(usize, Vec<f64>, Vec<f64>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let t = next.fetch_add(1, Ordering::Relaxed);
                        if t >= tokens {
                            break mine;
                        }
                        let qt = &q[t * layout.token..];
                        let (o, l) = reference_token(qt, layout.head, heads, &keys[t], sink, scale);
                        mine.push((t, o, l));
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let mut r = Reference {
        heads,
        out: vec![0.0; tokens * heads * D],
        lse: vec![0.0; tokens * heads],
        keys: keys.iter().map(|k| k.len()).collect(),
    };
    for (t, o, l) in parts {
        r.out[t * heads * D..(t + 1) * heads * D].copy_from_slice(&o);
        r.lse[t * heads..(t + 1) * heads].copy_from_slice(&l);
    }
    r
}

/// Key rows of decode tokens.
pub(crate) fn decode_keys<'a>(pool: &'a KvPool, lists: &[Vec<i32>]) -> Vec<Vec<&'a [bf16]>> {
    lists
        .iter()
        .map(|l| l.iter().map(|&r| pool.row(r)).collect())
        .collect()
}

/// Key rows of prefill tokens: valid prefix rows of the pool, then valid rows
/// of the extend tensor (`extend` is `[rows, stride]`, row r at `r * stride`).
pub(crate) fn prefill_keys<'a>(
    pool: &'a KvPool,
    prefix: &[Vec<i32>],
    extend: &'a [bf16],
    extend_stride: usize,
    ext: &[Vec<i32>],
) -> Vec<Vec<&'a [bf16]>> {
    prefix
        .iter()
        .zip(ext)
        .map(|(p, e)| {
            let mut keys: Vec<&[bf16]> = p
                .iter()
                .filter(|&&r| r != -1)
                .map(|&r| pool.row(r))
                .collect();
            keys.extend(e.iter().filter(|&&r| r != -1).map(|&r| {
                let r = r as usize;
                &extend[r * extend_stride..r * extend_stride + D]
            }));
            keys
        })
        .collect()
}

/// Checks `out` (at `layout`) and `lse` (`[tokens, heads]` at row stride
/// `lse.1`) against the reference: empty key sets give exact zeros, otherwise
/// relative L2 error < 1e-2 per (token, head); lse absolute error
/// < 1e-3 * max(1, |ref|), -inf exactly where the reference is -inf.
pub(crate) fn check(
    tag: &str,
    r: &Reference,
    out: &[bf16],
    layout: Layout,
    lse: Option<(&[f32], usize)>,
) {
    let heads = r.heads;
    for (t, &nkeys) in r.keys.iter().enumerate() {
        for h in 0..heads {
            let at = layout.at(t, h);
            let got = &out[at..at + D];
            let want = &r.out[(t * heads + h) * D..(t * heads + h + 1) * D];
            let id = format!("{tag}: token {t} head {h} ({nkeys} keys)");
            // The poison pattern is a valid bf16 (about -2.9e-16), so a tiny
            // true output may round to it: flag it only where the reference
            // is not that value.
            let poison = bf16::from_bits(POISON_BF16).to_f64();
            for (d, (g, w)) in got.iter().zip(want).enumerate() {
                assert!(
                    g.to_bits() != POISON_BF16 || (w - poison).abs() <= 1e-2 * poison.abs(),
                    "{id}: output element {d} not written (poison left, reference {w:e})"
                );
            }
            if nkeys == 0 {
                assert!(
                    got.iter().all(|x| x.to_f32() == 0.0),
                    "{id}: empty key set must give exact zeros, got {:?}",
                    &got[..8]
                );
            } else {
                let want_norm = want.iter().map(|x| x * x).sum::<f64>().sqrt();
                let err = got
                    .iter()
                    .zip(want)
                    .map(|(g, w)| (g.to_f64() - w).powi(2))
                    .sum::<f64>()
                    .sqrt();
                assert!(got.iter().all(|x| x.is_finite()), "{id}: non-finite output");
                if want_norm < 1e-30 {
                    // Underflow (a huge sink): the true output is below what f32
                    // arithmetic represents, so it must be ~0.
                    let max = got.iter().map(|x| x.to_f64().abs()).fold(0.0, f64::max);
                    assert!(max < 1e-3, "{id}: output should be ~0, max |out| = {max}");
                } else {
                    let rel = err / want_norm;
                    assert!(
                        rel < 1e-2,
                        "{id}: relative L2 error {rel:.3e} (|ref| = {want_norm:.4e}); \
                         got[..4] = {:?}, ref[..4] = {:?}",
                        &got[..4],
                        &want[..4]
                    );
                }
            }
            if let Some((lse, stride)) = lse {
                let got = lse[t * stride + h];
                let want = r.lse[t * heads + h];
                let poison = f32::from_bits(POISON_F32) as f64;
                assert!(
                    got.to_bits() != POISON_F32 || (want - poison).abs() <= 1e-3 * poison.abs(),
                    "{id}: lse not written (poison left, reference {want:e})"
                );
                if want == f64::NEG_INFINITY {
                    assert_eq!(got, f32::NEG_INFINITY, "{id}: lse must be -inf");
                } else {
                    let tol = 1e-3 * want.abs().max(1.0);
                    assert!(
                        (got as f64 - want).abs() < tol,
                        "{id}: lse {got} vs reference {want}"
                    );
                }
            }
        }
    }
}
