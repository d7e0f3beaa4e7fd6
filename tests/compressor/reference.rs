//! An independent float64 reference of one compressed group, written from
//! docs/compressor.md §2 (spec store_fused.md §6.2), sharing no code with the
//! library: the gated pooling with an exact softmax per channel, RMSNorm,
//! GPT-J RoPE of the last 64 dims at the group's first position and, for the
//! indexer compressor, the Walsh-Hadamard transform by its definition.

/// The group's compressed vector before any rounding or quantization.
///
/// `rows[q]` is the raw `kv_score` row of absolute position q (as f32 values;
/// bf16 inputs widened), laid out `| a | b | sa | sb |` (ratio 4) or `| kv |
/// score |` (ratio 128); `ape` is `[ratio, values]` row-major; `table_row`
/// holds the 32 (cos, sin) pairs of position `ratio * n`.
#[allow(clippy::too_many_arguments)]
pub fn group(
    ratio: usize,
    dim: usize,
    n: usize,
    rows: &[Vec<f32>],
    ape: &[f32],
    norm: &[f32],
    eps: f32,
    table_row: &[f32],
    hadamard: bool,
) -> Vec<f64> {
    let mut x = vec![0f64; dim];
    for (d, xd) in x.iter_mut().enumerate() {
        // (logit, value) of every unmasked candidate.
        let mut cands: Vec<(f64, f64)> = Vec::new();
        if ratio == 4 {
            let values = 2 * dim;
            if n > 0 {
                for j in 0..4 {
                    let r = &rows[4 * n - 4 + j];
                    let logit = r[values + d] as f64 + ape[j * values + d] as f64;
                    cands.push((logit, r[d] as f64));
                }
            }
            for j in 0..4 {
                let r = &rows[4 * n + j];
                let logit = r[values + dim + d] as f64 + ape[j * values + dim + d] as f64;
                cands.push((logit, r[dim + d] as f64));
            }
        } else {
            for j in 0..ratio {
                let r = &rows[ratio * n + j];
                let logit = r[dim + d] as f64 + ape[j * dim + d] as f64;
                cands.push((logit, r[d] as f64));
            }
        }
        let m = cands.iter().map(|c| c.0).fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = cands.iter().map(|c| (c.0 - m).exp()).sum();
        *xd = cands.iter().map(|c| (c.0 - m).exp() / z * c.1).sum();
    }
    let mean = x.iter().map(|v| v * v).sum::<f64>() / dim as f64;
    let f = 1.0 / (mean + eps as f64).sqrt();
    for (v, w) in x.iter_mut().zip(norm) {
        *v *= f * *w as f64;
    }
    let tail = dim - 64;
    for i in 0..32 {
        let (c, s) = (table_row[2 * i] as f64, table_row[2 * i + 1] as f64);
        let (re, im) = (x[tail + 2 * i], x[tail + 2 * i + 1]);
        x[tail + 2 * i] = re * c - im * s;
        x[tail + 2 * i + 1] = re * s + im * c;
    }
    if hadamard {
        let scale = 1.0 / (dim as f64).sqrt();
        x = (0..dim)
            .map(|i| {
                (0..dim)
                    .map(|j| {
                        let sign = if (i & j).count_ones() % 2 == 0 {
                            1.0
                        } else {
                            -1.0
                        };
                        sign * x[j]
                    })
                    .sum::<f64>()
                    * scale
            })
            .collect();
    }
    x
}

/// ‖got − want‖ / ‖want‖.
pub fn relative_error(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).powi(2))
        .sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den).sqrt()
}
