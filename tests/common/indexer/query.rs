//! Indexer query preparation (`unikv_indexer_prepare_q`): random cases, their
//! argument struct, and the reference check (docs/indexer.md §1).

use super::*;

#[derive(Debug, Clone)]
pub struct QueryCase {
    pub tokens: usize,
    pub heads: usize,
    pub fmt: Fp8Format,
    /// `[tokens, heads, q_head_stride]` bf16, the first 128 of each head used.
    pub q: Vec<bf16>,
    pub q_head_stride: usize,
    /// `[tokens, weights_stride]` bf16, the first `heads` used.
    pub weights: Vec<bf16>,
    pub weights_stride: usize,
    pub table: Vec<f32>,
    pub max_pos: usize,
    pub positions: Vec<i64>,
    pub positions_i64: bool,
    pub weight_scale: f32,
}

/// Where a query call's buffers live.
pub struct QueryPointers {
    pub q: *mut c_void,
    pub weights: *mut c_void,
    pub table: *mut c_void,
    pub positions: *mut c_void,
    pub q_fp8: *mut c_void,
    pub weights_out: *mut c_void,
}

impl QueryCase {
    pub fn random(rng: &mut StdRng, tokens: usize, heads: usize, fmt: Fp8Format) -> Self {
        let q_head_stride = [DIM, DIM + 8, DIM + 64][rng.random_range(0..3)];
        let weights_stride = heads + rng.random_range(0..5);
        let max_pos = rng.random_range(1..300);
        // Heads at magnitudes from below the 1e-4 amax floor to thousands.
        let magnitudes = [1e-7f32, 1e-2, 1.0, 30.0, 3000.0];
        let q = (0..tokens * heads)
            .flat_map(|_| {
                let m = magnitudes[rng.random_range(0..magnitudes.len())];
                (0..q_head_stride)
                    .map(|_| bf16::from_f32(rng.random_range(-m..m)))
                    .collect::<Vec<_>>()
            })
            .collect();
        QueryCase {
            tokens,
            heads,
            fmt,
            q,
            q_head_stride,
            weights: (0..tokens * weights_stride)
                .map(|_| bf16::from_f32(rng.random_range(-2.0f32..2.0)))
                .collect(),
            weights_stride,
            table: random_table(rng, max_pos),
            max_pos,
            positions: (0..tokens)
                .map(|_| rng.random_range(0..max_pos as i64))
                .collect(),
            positions_i64: rng.random(),
            weight_scale: 1.0 / (128.0f32 * heads as f32).sqrt(),
        }
    }

    pub fn out_head_stride(&self) -> usize {
        DIM + OUT_PAD
    }
    pub fn q_fp8_len(&self) -> usize {
        self.tokens * self.heads * self.out_head_stride()
    }
    pub fn weights_out_len(&self) -> usize {
        self.tokens * (self.heads + OUT_PAD)
    }
    pub fn positions_bytes(&self) -> Vec<u8> {
        index_bytes(&self.positions, self.positions_i64)
    }

    pub fn args(&self, p: &QueryPointers) -> unikv_indexer_prepare_q_args {
        let (t, h) = (self.tokens, self.heads);
        let bf = unikv_dtype::UNIKV_DTYPE_BF16;
        unikv_indexer_prepare_q_args {
            struct_size: std::mem::size_of::<unikv_indexer_prepare_q_args>(),
            q: desc(
                p.q,
                bf,
                &[t, h, DIM],
                &[h * self.q_head_stride, self.q_head_stride, 1],
            ),
            weights: desc(p.weights, bf, &[t, h], &[self.weights_stride, 1]),
            rope_table: desc(
                p.table,
                unikv_dtype::UNIKV_DTYPE_F32,
                &[self.max_pos, 64],
                &[64, 1],
            ),
            positions: desc(p.positions, index_dtype(self.positions_i64), &[t], &[1]),
            q_fp8: desc(
                p.q_fp8,
                unikv_dtype::UNIKV_DTYPE_U8,
                &[t, h, DIM],
                &[h * self.out_head_stride(), self.out_head_stride(), 1],
            ),
            weights_out: desc(
                p.weights_out,
                unikv_dtype::UNIKV_DTYPE_F32,
                &[t, h],
                &[h + OUT_PAD, 1],
            ),
            q_dtype: dtype_of(self.fmt) as u32,
            num_tokens: t as u32,
            num_heads: h as u32,
            weight_scale: self.weight_scale,
        }
    }

    /// Runs on host buffers (CPU backend) after `edit`; returns the status and
    /// the poisoned-then-written outputs.
    pub fn run_host(
        &self,
        ctx: &Ctx,
        edit: impl FnOnce(&mut unikv_indexer_prepare_q_args),
    ) -> (unikv::ffi::status::unikv_status, Vec<u8>, Vec<f32>) {
        let (q, w, table, pos) = (
            aligned(&self.q),
            aligned(&self.weights),
            aligned(&self.table),
            aligned(&self.positions_bytes()),
        );
        let q_fp8 = cache_store::HostBytes::poisoned(self.q_fp8_len());
        let weights_out = cache_store::HostBytes::poisoned(self.weights_out_len() * 4);
        let mut args = self.args(&QueryPointers {
            q: q.ptr() as *mut c_void,
            weights: w.ptr() as *mut c_void,
            table: table.ptr() as *mut c_void,
            positions: pos.ptr() as *mut c_void,
            q_fp8: q_fp8.ptr() as *mut c_void,
            weights_out: weights_out.ptr() as *mut c_void,
        });
        edit(&mut args);
        let status = unsafe {
            unikv::ffi::indexer::unikv_indexer_prepare_q(ctx.0, &args, std::ptr::null_mut())
        };
        let out: Vec<f32> = weights_out
            .bytes()
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        (status, q_fp8.bytes().to_vec(), out)
    }

    /// Every head against the float64 reference; the padding stays poisoned.
    pub fn check(&self, q_fp8: &[u8], weights_out: &[f32]) {
        let poison = f32::from_ne_bytes([POISON_BYTE; 4]);
        for t in 0..self.tokens {
            let row = &self.table[self.positions[t] as usize * 64..][..64];
            for h in 0..self.heads {
                let what = format!("token {t} head {h} ({:?})", self.fmt);
                let base = (t * self.heads + h) * self.q_head_stride;
                let mut x: Vec<f64> = self.q[base..base + DIM]
                    .iter()
                    .map(|v| f64::from(v.to_f32()))
                    .collect();
                rope_ref(&mut x, row);
                let y = hadamard_ref(&x);
                let out = (t * self.heads + h) * self.out_head_stride();
                let scale = ref_scale(&y, self.fmt);
                check_codes(&q_fp8[out..out + DIM], scale, &y, self.fmt, &what);
                let w = f64::from(self.weights[t * self.weights_stride + h].to_f32());
                close(
                    f64::from(weights_out[t * (self.heads + OUT_PAD) + h]),
                    w * f64::from(self.weight_scale) * scale,
                    &format!("{what}: weights_out"),
                );
                assert!(
                    q_fp8[out + DIM..out + self.out_head_stride()]
                        .iter()
                        .all(|&b| b == POISON_BYTE),
                    "{what}: padding written"
                );
            }
            for j in self.heads..self.heads + OUT_PAD {
                assert_eq!(
                    weights_out[t * (self.heads + OUT_PAD) + j].to_bits(),
                    poison.to_bits(),
                    "token {t}: weights_out padding {j} written"
                );
            }
        }
    }
}
