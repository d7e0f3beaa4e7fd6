//! Indexer key preparation (`unikv_indexer_prepare_k`): random cases, their
//! argument struct, and the reference check (docs/indexer.md §2).

use super::*;

#[derive(Debug, Clone)]
pub struct KeyCase {
    pub fmt: Fp8Format,
    pub pages: usize,
    /// `[tokens, 128]` values (bf16-representable when `key_f32` is false).
    pub keys: Vec<f32>,
    pub key_f32: bool,
    pub norm_weight: Vec<bf16>,
    pub table: Vec<f32>,
    pub max_pos: usize,
    pub positions: Vec<i64>,
    pub locations: Vec<i64>,
    pub index_i64: bool,
    pub eps: f32,
}

/// Where a key call's buffers live.
pub struct KeyPointers {
    pub cache: *mut c_void,
    pub key: *mut c_void,
    pub norm_weight: *mut c_void,
    pub table: *mut c_void,
    pub positions: *mut c_void,
    pub loc: *mut c_void,
}

impl KeyCase {
    pub fn random(rng: &mut StdRng, tokens: usize, fmt: Fp8Format) -> Self {
        let pages = rng.random_range(1..4);
        let key_f32: bool = rng.random();
        let magnitudes = [1e-3f32, 1.0, 50.0];
        let keys = (0..tokens)
            .flat_map(|_| {
                let m = magnitudes[rng.random_range(0..magnitudes.len())];
                (0..DIM)
                    .map(|_| {
                        let v = rng.random_range(-m..m);
                        if key_f32 {
                            v
                        } else {
                            bf16::from_f32(v).to_f32()
                        }
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        let max_pos = rng.random_range(1..300);
        KeyCase {
            fmt,
            pages,
            keys,
            key_f32,
            norm_weight: (0..DIM)
                .map(|_| bf16::from_f32(rng.random_range(0.2f32..2.0)))
                .collect(),
            table: random_table(rng, max_pos),
            max_pos,
            positions: (0..tokens)
                .map(|_| rng.random_range(0..max_pos as i64))
                .collect(),
            locations: random_locations(rng, (pages * PAGE) as u64, PAGE as u64, tokens),
            index_i64: rng.random(),
            eps: 1e-6,
        }
    }

    pub fn tokens(&self) -> usize {
        self.locations.len()
    }
    pub fn cache_bytes(&self) -> usize {
        self.pages * PAGE_BYTES
    }
    pub fn key_bytes(&self) -> Vec<u8> {
        if self.key_f32 {
            bytes_of(&self.keys)
        } else {
            bytes_of(
                &self
                    .keys
                    .iter()
                    .map(|&v| bf16::from_f32(v))
                    .collect::<Vec<_>>(),
            )
        }
    }
    pub fn positions_bytes(&self) -> Vec<u8> {
        index_bytes(&self.positions, self.index_i64)
    }
    pub fn loc_bytes(&self) -> Vec<u8> {
        index_bytes(&self.locations, self.index_i64)
    }

    pub fn args(&self, p: &KeyPointers) -> unikv_indexer_prepare_k_args {
        let n = self.tokens();
        let key_dtype = if self.key_f32 {
            unikv_dtype::UNIKV_DTYPE_F32
        } else {
            unikv_dtype::UNIKV_DTYPE_BF16
        };
        unikv_indexer_prepare_k_args {
            struct_size: std::mem::size_of::<unikv_indexer_prepare_k_args>(),
            cache: desc(
                p.cache,
                unikv_dtype::UNIKV_DTYPE_U8,
                &[self.pages, PAGE_BYTES],
                &[PAGE_BYTES, 1],
            ),
            key: desc(p.key, key_dtype, &[n, DIM], &[DIM, 1]),
            norm_weight: desc(p.norm_weight, unikv_dtype::UNIKV_DTYPE_BF16, &[DIM], &[1]),
            rope_table: desc(
                p.table,
                unikv_dtype::UNIKV_DTYPE_F32,
                &[self.max_pos, 64],
                &[64, 1],
            ),
            positions: desc(p.positions, index_dtype(self.index_i64), &[n], &[1]),
            loc: desc(p.loc, index_dtype(self.index_i64), &[n], &[1]),
            page_size: PAGE as u32,
            cache_dtype: dtype_of(self.fmt) as u32,
            num_tokens: n as u32,
            eps: self.eps,
            reserved: 0,
        }
    }

    /// Runs on host buffers (CPU backend) after `edit`; returns the status and
    /// the poisoned-then-written cache.
    pub fn run_host(
        &self,
        ctx: &Ctx,
        edit: impl FnOnce(&mut unikv_indexer_prepare_k_args),
    ) -> (unikv::ffi::status::unikv_status, Vec<u8>) {
        let cache = cache_store::HostBytes::poisoned(self.cache_bytes());
        let (key, weight, table, pos, loc) = (
            aligned(&self.key_bytes()),
            aligned(&self.norm_weight),
            aligned(&self.table),
            aligned(&self.positions_bytes()),
            aligned(&self.loc_bytes()),
        );
        let mut args = self.args(&KeyPointers {
            cache: cache.ptr() as *mut c_void,
            key: key.ptr() as *mut c_void,
            norm_weight: weight.ptr() as *mut c_void,
            table: table.ptr() as *mut c_void,
            positions: pos.ptr() as *mut c_void,
            loc: loc.ptr() as *mut c_void,
        });
        edit(&mut args);
        let status = unsafe {
            unikv::ffi::indexer::unikv_indexer_prepare_k(ctx.0, &args, std::ptr::null_mut())
        };
        (status, cache.bytes().to_vec())
    }

    /// Every stored key against the float64 reference (RMSNorm, RoPE,
    /// explicit Hadamard, quantization); every other byte still poisoned.
    pub fn check(&self, cache: &[u8]) {
        let mut touched = vec![false; cache.len()];
        for (t, &l) in self.locations.iter().enumerate() {
            let Ok(l) = usize::try_from(l) else { continue };
            let (page, slot) = (l / PAGE, l % PAGE);
            let value = page * PAGE_BYTES + slot * DIM;
            let scale_at = page * PAGE_BYTES + DIM * PAGE + slot * 4;
            touched[value..value + DIM].fill(true);
            touched[scale_at..scale_at + 4].fill(true);
            let x = &self.keys[t * DIM..][..DIM];
            let mean = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / DIM as f64;
            let f = 1.0 / (mean + f64::from(self.eps)).sqrt();
            let mut y: Vec<f64> = x
                .iter()
                .zip(&self.norm_weight)
                .map(|(&v, w)| f64::from(v) * f * f64::from(w.to_f32()))
                .collect();
            rope_ref(&mut y, &self.table[self.positions[t] as usize * 64..][..64]);
            let y = hadamard_ref(&y);
            let what = format!("key {t} at {l} ({:?})", self.fmt);
            let scale = f32::from_le_bytes(cache[scale_at..scale_at + 4].try_into().unwrap());
            close(
                f64::from(scale),
                ref_scale(&y, self.fmt),
                &format!("{what}: scale"),
            );
            check_codes(
                &cache[value..value + DIM],
                f64::from(scale),
                &y,
                self.fmt,
                &what,
            );
        }
        for (i, (&b, &t)) in cache.iter().zip(&touched).enumerate() {
            assert!(
                t || b == POISON_BYTE,
                "cache byte {i} written but no key stored there"
            );
        }
    }
}
