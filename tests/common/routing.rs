//! hash_topk cases shared by tests/routing.rs (CPU backend against a float64
//! reference) and tests/gpu/routing.rs (GPU against CPU): random inputs, the
//! argument struct over buffers in any context's memory, and the reference
//! check.

use std::os::raw::c_void;

use rand::rngs::StdRng;
use rand::Rng;
use unikv::ffi::routing::{unikv_hash_topk, unikv_hash_topk_args};
use unikv::ffi::status::unikv_status;
use unikv::ffi::types::unikv_dtype;

use super::*;

/// Spare output columns past K + S, and spare logit columns past E.
pub const PAD: usize = 3;

/// `ln(1 + e^x)` in float64, written apart from the library's form.
fn softplus_ref(x: f64) -> f64 {
    if x > 30.0 {
        x + (-x).exp()
    } else {
        x.exp().ln_1p()
    }
}

#[derive(Debug, Clone)]
pub struct Case {
    pub tokens: usize,
    pub experts: usize,
    pub routed: usize,
    pub shared: usize,
    pub vocab: usize,
    pub rsf: f32,
    /// `[tokens, experts + PAD]`: rows padded by PAD columns.
    pub logits: Vec<f32>,
    pub ids: Vec<i64>,
    /// `[vocab, routed]`.
    pub table: Vec<i32>,
    /// None: the count is passed on the host; Some(i64?) on the device.
    pub real_on_device: Option<bool>,
    pub real: usize,
    pub ids_i64: bool,
}

/// Where a call's buffers live (host or device pointers of one context).
pub struct Pointers {
    pub logits: *mut c_void,
    pub ids: *mut c_void,
    pub table: *mut c_void,
    pub weights: *mut c_void,
    pub topk_ids: *mut c_void,
    pub real: *mut c_void,
}

impl Case {
    pub fn random(
        rng: &mut StdRng,
        tokens: usize,
        experts: usize,
        routed: usize,
        shared: usize,
    ) -> Self {
        let vocab = rng.random_range(1..500);
        let logits = (0..tokens * (experts + PAD))
            .map(|_| match rng.random_range(0..10) {
                0 => rng.random_range(-120.0f32..120.0),
                _ => rng.random_range(-8.0f32..8.0),
            })
            .collect();
        Case {
            tokens,
            experts,
            routed,
            shared,
            vocab,
            rsf: rng.random_range(0.5f32..3.0),
            logits,
            ids: (0..tokens)
                .map(|_| rng.random_range(0..vocab as i64))
                .collect(),
            table: (0..vocab * routed)
                .map(|_| rng.random_range(0..experts as i32))
                .collect(),
            real_on_device: [None, Some(false), Some(true)][rng.random_range(0..3)],
            real: rng.random_range(0..=tokens),
            ids_i64: rng.random(),
        }
    }

    pub fn slots(&self) -> usize {
        self.routed + self.shared
    }

    /// Row stride of both outputs.
    pub fn out_stride(&self) -> usize {
        self.slots() + PAD
    }

    /// Elements of each output buffer.
    pub fn out_len(&self) -> usize {
        self.tokens * self.out_stride()
    }

    /// The token ids as the call passes them (int32 or int64).
    pub fn id_bytes(&self) -> Vec<u8> {
        if self.ids_i64 {
            bytes_of(&self.ids)
        } else {
            bytes_of(&self.ids.iter().map(|&i| i as i32).collect::<Vec<_>>())
        }
    }

    /// The device count of real rows, when the case passes one.
    pub fn real_bytes(&self) -> Option<Vec<u8>> {
        self.real_on_device.map(|i64| {
            if i64 {
                bytes_of(&[self.real as i64])
            } else {
                bytes_of(&[self.real as i32])
            }
        })
    }

    pub fn args(&self, p: &Pointers) -> unikv_hash_topk_args {
        let n = self.tokens;
        let desc = |data: *mut c_void, dtype: unikv_dtype, shape: &[usize], stride: usize| {
            let mut t = absent();
            t.data = data;
            t.dtype = dtype as u32;
            t.ndim = shape.len() as u32;
            for (axis, &e) in shape.iter().enumerate() {
                t.shape[axis] = e as i64;
            }
            t.strides[shape.len() - 1] = 1;
            if shape.len() == 2 {
                t.strides[0] = stride as i64;
            }
            t
        };
        let index = if self.ids_i64 {
            unikv_dtype::UNIKV_DTYPE_I64
        } else {
            unikv_dtype::UNIKV_DTYPE_I32
        };
        let real_dtype = if self.real_on_device == Some(true) {
            unikv_dtype::UNIKV_DTYPE_I64
        } else {
            unikv_dtype::UNIKV_DTYPE_I32
        };
        unikv_hash_topk_args {
            struct_size: std::mem::size_of::<unikv_hash_topk_args>(),
            router_logits: desc(
                p.logits,
                unikv_dtype::UNIKV_DTYPE_F32,
                &[n, self.experts],
                self.experts + PAD,
            ),
            input_ids: desc(p.ids, index, &[n], 1),
            tid2eid: desc(
                p.table,
                unikv_dtype::UNIKV_DTYPE_I32,
                &[self.vocab, self.routed],
                self.routed,
            ),
            topk_weights: desc(
                p.weights,
                unikv_dtype::UNIKV_DTYPE_F32,
                &[n, self.slots()],
                self.out_stride(),
            ),
            topk_ids: desc(
                p.topk_ids,
                unikv_dtype::UNIKV_DTYPE_I32,
                &[n, self.slots()],
                self.out_stride(),
            ),
            num_real_tokens: match self.real_on_device {
                None => absent(),
                Some(_) => desc(p.real, real_dtype, &[1], 1),
            },
            num_real_tokens_host: if self.real_on_device.is_none() {
                self.real as u32
            } else {
                0
            },
            num_tokens: n as u32,
            num_shared: self.shared as u32,
            routed_scaling_factor: self.rsf,
        }
    }

    /// Runs the op on host buffers (CPU backend), after `edit` of the
    /// arguments; returns the status and the poisoned-then-written outputs.
    pub fn run_host(
        &self,
        ctx: &Ctx,
        edit: impl FnOnce(&mut unikv_hash_topk_args),
    ) -> (unikv_status, Vec<f32>, Vec<i32>) {
        let weights: Vec<f32> = poisoned(self.out_len());
        let topk_ids: Vec<i32> = poisoned(self.out_len());
        let (ids, real) = (self.id_bytes(), self.real_bytes().unwrap_or_default());
        let mut args = self.args(&Pointers {
            logits: self.logits.as_ptr() as *mut c_void,
            ids: ids.as_ptr() as *mut c_void,
            table: self.table.as_ptr() as *mut c_void,
            weights: weights.as_ptr() as *mut c_void,
            topk_ids: topk_ids.as_ptr() as *mut c_void,
            real: real.as_ptr() as *mut c_void,
        });
        edit(&mut args);
        let status = unsafe { unikv_hash_topk(ctx.0, &args, std::ptr::null_mut()) };
        (status, weights, topk_ids)
    }

    /// Every row against the float64 reference (weights within 1e-6
    /// relative), padded rows (-1, 0), spare columns still poisoned.
    pub fn check(&self, weights: &[f32], ids: &[i32]) {
        let poison_f = f32::from_ne_bytes([POISON_BYTE; 4]);
        let poison_i = i32::from_ne_bytes([POISON_BYTE; 4]);
        for n in 0..self.tokens {
            let (w, id) = (
                &weights[n * self.out_stride()..],
                &ids[n * self.out_stride()..],
            );
            for j in self.slots()..self.out_stride() {
                assert_eq!(
                    w[j].to_bits(),
                    poison_f.to_bits(),
                    "row {n}: spare column {j} written"
                );
                assert_eq!(id[j], poison_i, "row {n}: spare column {j} written");
            }
            if n >= self.real {
                for j in 0..self.slots() {
                    assert_eq!((id[j], w[j]), (-1, 0.0), "padded row {n} slot {j}");
                }
                continue;
            }
            let table = &self.table[self.ids[n] as usize * self.routed..][..self.routed];
            let logits = &self.logits[n * (self.experts + PAD)..];
            let raw: Vec<f64> = table
                .iter()
                .map(|&e| softplus_ref(f64::from(logits[e as usize])).sqrt())
                .collect();
            let sum: f64 = raw.iter().sum();
            for j in 0..self.routed {
                assert_eq!(id[j], table[j], "row {n} slot {j}: expert");
                let (got, want) = (f64::from(w[j]), raw[j] / sum);
                assert!(
                    (got - want).abs() <= 1e-6 * want,
                    "row {n} slot {j}: weight {got}, want {want}"
                );
            }
            for s in 0..self.shared {
                let j = self.routed + s;
                assert_eq!(id[j], (self.experts + s) as i32, "row {n} shared slot {s}");
                let want = 1.0 / f64::from(self.rsf);
                assert!(
                    (f64::from(w[j]) - want).abs() <= 1e-6 * want,
                    "row {n} shared slot {s}: weight {}, want {want}",
                    w[j]
                );
            }
        }
    }
}
