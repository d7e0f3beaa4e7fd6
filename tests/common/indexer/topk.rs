//! Indexer top-k selection (`unikv_indexer_topk` and `_from_logits`): random
//! cases over paged caches, their argument struct, and the reference checks.

use super::*;

/// Rows of the logits the selection ranks: random scores from a small set
/// (ties everywhere, ±0, NaN and -inf among them), or scores computed by the
/// op itself.
#[derive(Debug, Clone)]
pub struct TopkCase {
    pub tokens: usize,
    pub heads: usize,
    pub fmt: Fp8Format,
    pub topk: usize,
    /// Columns of `topk_indices` (>= topk).
    pub width: usize,
    /// `[requests, max_pages]` page ids, all distinct, below `cache_pages`.
    pub page_table: Vec<i32>,
    pub max_pages: usize,
    pub cache_pages: usize,
    pub batch_id: Vec<i32>,
    pub positions: Vec<i64>,
    pub positions_i64: bool,
    /// `[tokens, logits_width]`.
    pub logits: Vec<f32>,
    pub logits_width: usize,
    /// `[tokens, heads, 128]` codes and `[tokens, heads]` weights.
    pub q: Vec<u8>,
    pub weights: Vec<f32>,
    /// `[cache_pages, 8448]`.
    pub cache: Vec<u8>,
}

/// How `TopkCase::respread` fills a row's logits.
#[derive(Debug, Clone, Copy)]
pub enum Spread {
    Distinct,
    TopOctave,
}

/// Where a top-k call's buffers live.
pub struct TopkPointers {
    pub q: *mut c_void,
    pub weights: *mut c_void,
    pub cache: *mut c_void,
    pub page_table: *mut c_void,
    pub batch_id: *mut c_void,
    pub positions: *mut c_void,
    pub logits: *mut c_void,
    pub topk_indices: *mut c_void,
}

/// A random code that is not NaN in `fmt`.
fn finite_code(rng: &mut StdRng, fmt: Fp8Format) -> u8 {
    loop {
        let c: u8 = rng.random();
        let nan = match fmt {
            Fp8Format::E4m3Fn => c & 0x7F == 0x7F,
            Fp8Format::E4m3Fnuz => c == 0x80,
        };
        if !nan {
            return c;
        }
    }
}

impl TopkCase {
    /// `tokens` tokens over `requests` requests; contexts up to `max_keys`
    /// compressed keys, some shorter than `topk`, one token padding.
    pub fn random(
        rng: &mut StdRng,
        tokens: usize,
        requests: usize,
        max_keys: usize,
        topk: usize,
        heads: usize,
        fmt: Fp8Format,
    ) -> Self {
        let max_pages = max_keys.div_ceil(PAGE);
        let cache_pages = requests * max_pages + 3;
        let mut ids: Vec<i32> = (0..cache_pages as i32).collect();
        use rand::seq::SliceRandom;
        ids.shuffle(rng);
        let page_table = ids[..requests * max_pages].to_vec();
        let batch_id: Vec<i32> = (0..tokens)
            .map(|t| {
                if t == tokens / 2 && tokens > 1 {
                    -1
                } else {
                    rng.random_range(0..requests as i32)
                }
            })
            .collect();
        let positions = (0..tokens)
            .map(|_| match rng.random_range(0..4) {
                0 => rng.random_range(0..(4 * topk.min(max_keys)) as i64),
                _ => rng.random_range(0..(4 * max_keys) as i64),
            })
            .collect();
        let logits_width = max_keys + rng.random_range(0..9);
        let palette = [
            -1.0f32,
            0.0,
            -0.0,
            0.5,
            2.0,
            f32::NAN,
            f32::NEG_INFINITY,
            7.25,
            -3.0,
            1e-30,
        ];
        let logits = (0..tokens * logits_width)
            .map(|_| {
                if rng.random_bool(0.5) {
                    palette[rng.random_range(0..palette.len())]
                } else {
                    rng.random_range(-4.0f32..4.0)
                }
            })
            .collect();
        let mut cache = vec![0u8; cache_pages * PAGE_BYTES];
        for page in 0..cache_pages {
            for slot in 0..PAGE {
                for d in 0..DIM {
                    cache[page * PAGE_BYTES + slot * DIM + d] = finite_code(rng, fmt);
                }
                let scale: f32 = rng.random_range(1e-3f32..2.0);
                let at = page * PAGE_BYTES + PAGE * DIM + slot * 4;
                cache[at..at + 4].copy_from_slice(&scale.to_le_bytes());
            }
        }
        TopkCase {
            tokens,
            heads,
            fmt,
            topk,
            width: topk + rng.random_range(0..5),
            page_table,
            max_pages,
            cache_pages,
            batch_id,
            positions,
            positions_i64: rng.random(),
            logits,
            logits_width,
            q: (0..tokens * heads * DIM)
                .map(|_| finite_code(rng, fmt))
                .collect(),
            weights: (0..tokens * heads)
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect(),
            cache,
        }
    }

    /// Replaces the logits of every token's visible keys: all distinct (the
    /// radix select usually settles T in its third pass), or with `spread` =
    /// `TopOctave` exactly `topk` keys an octave above the rest (the first
    /// pass settles it). Columns past a row's keys keep their values.
    pub fn respread(&mut self, rng: &mut StdRng, spread: Spread) {
        use rand::seq::SliceRandom;
        for t in 0..self.tokens {
            let n = self.keys(t).unwrap_or(0).min(self.logits_width);
            let row = &mut self.logits[t * self.logits_width..][..n];
            match spread {
                Spread::Distinct => row
                    .iter_mut()
                    .for_each(|x| *x = rng.random_range(-1e3f32..1e3)),
                Spread::TopOctave => {
                    row.iter_mut()
                        .for_each(|x| *x = rng.random_range(0.0f32..1.0));
                    let mut order: Vec<usize> = (0..n).collect();
                    order.shuffle(rng);
                    for &i in order.iter().take(self.topk) {
                        row[i] = rng.random_range(1024.0f32..2048.0);
                    }
                }
            }
        }
    }

    pub fn requests(&self) -> usize {
        self.page_table.len() / self.max_pages
    }
    pub fn positions_bytes(&self) -> Vec<u8> {
        index_bytes(&self.positions, self.positions_i64)
    }
    /// Keys token t sees (None: padding).
    pub fn keys(&self, t: usize) -> Option<usize> {
        (self.batch_id[t] >= 0).then(|| (self.positions[t] as usize + 1) / 4)
    }
    fn page_index(&self, t: usize, i: usize) -> i32 {
        let b = self.batch_id[t] as usize;
        self.page_table[b * self.max_pages + i / PAGE] * PAGE as i32 + (i % PAGE) as i32
    }

    pub fn args(&self, p: &TopkPointers) -> unikv::ffi::indexer::unikv_indexer_topk_args {
        use unikv::ffi::indexer::unikv_indexer_topk_args;
        let (t, h) = (self.tokens, self.heads);
        unikv_indexer_topk_args {
            struct_size: std::mem::size_of::<unikv_indexer_topk_args>(),
            q_fp8: desc(
                p.q,
                unikv_dtype::UNIKV_DTYPE_U8,
                &[t, h, DIM],
                &[h * DIM, DIM, 1],
            ),
            weights: desc(p.weights, unikv_dtype::UNIKV_DTYPE_F32, &[t, h], &[h, 1]),
            cache: desc(
                p.cache,
                unikv_dtype::UNIKV_DTYPE_U8,
                &[self.cache_pages, PAGE_BYTES],
                &[PAGE_BYTES, 1],
            ),
            page_table: desc(
                p.page_table,
                unikv_dtype::UNIKV_DTYPE_I32,
                &[self.requests(), self.max_pages],
                &[self.max_pages, 1],
            ),
            batch_id: desc(p.batch_id, unikv_dtype::UNIKV_DTYPE_I32, &[t], &[1]),
            positions: desc(p.positions, index_dtype(self.positions_i64), &[t], &[1]),
            logits: desc(
                p.logits,
                unikv_dtype::UNIKV_DTYPE_F32,
                &[t, self.logits_width],
                &[self.logits_width, 1],
            ),
            topk_indices: desc(
                p.topk_indices,
                unikv_dtype::UNIKV_DTYPE_I32,
                &[t, self.width],
                &[self.width, 1],
            ),
            cache_dtype: dtype_of(self.fmt) as u32,
            num_tokens: t as u32,
            num_heads: h as u32,
            topk: self.topk as u32,
        }
    }

    /// Runs the fused op (`score`) or the selection from `self.logits` on
    /// host buffers; returns the status, the logits and the index table.
    pub fn run_host(
        &self,
        ctx: &Ctx,
        score: bool,
        edit: impl FnOnce(&mut unikv::ffi::indexer::unikv_indexer_topk_args),
    ) -> (unikv::ffi::status::unikv_status, Vec<f32>, Vec<i32>) {
        let (q, w, cache, pt, b, pos) = (
            aligned(&self.q),
            aligned(&self.weights),
            aligned(&self.cache),
            aligned(&self.page_table),
            aligned(&self.batch_id),
            aligned(&self.positions_bytes()),
        );
        let logits = if score {
            cache_store::HostBytes::poisoned(self.logits.len() * 4)
        } else {
            aligned(&self.logits)
        };
        let out = cache_store::HostBytes::poisoned(self.tokens * self.width * 4);
        let mut args = self.args(&TopkPointers {
            q: q.ptr() as *mut c_void,
            weights: w.ptr() as *mut c_void,
            cache: cache.ptr() as *mut c_void,
            page_table: pt.ptr() as *mut c_void,
            batch_id: b.ptr() as *mut c_void,
            positions: pos.ptr() as *mut c_void,
            logits: logits.ptr() as *mut c_void,
            topk_indices: out.ptr() as *mut c_void,
        });
        edit(&mut args);
        let status = unsafe {
            if score {
                unikv::ffi::indexer::unikv_indexer_topk(ctx.0, &args, std::ptr::null_mut())
            } else {
                unikv::ffi::indexer::unikv_indexer_topk_from_logits(
                    ctx.0,
                    &args,
                    std::ptr::null_mut(),
                )
            }
        };
        let floats = |b: &cache_store::HostBytes| -> Vec<f32> {
            b.bytes()
                .chunks_exact(4)
                .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
                .collect()
        };
        let ints: Vec<i32> = out
            .bytes()
            .chunks_exact(4)
            .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        (status, floats(&logits), ints)
    }

    /// Key i's score for token t in float64 from the codes (docs/indexer.md §3).
    pub fn score_ref(&self, t: usize, i: usize) -> RefScore {
        let loc = self.page_index(t, i) as usize;
        let (page, slot) = (loc / PAGE, loc % PAGE);
        let key = &self.cache[page * PAGE_BYTES + slot * DIM..][..DIM];
        let at = page * PAGE_BYTES + PAGE * DIM + slot * 4;
        let scale = f64::from(f32::from_le_bytes(
            self.cache[at..at + 4].try_into().unwrap(),
        ));
        let q = &self.q[t * self.heads * DIM..][..self.heads * DIM];
        let w = &self.weights[t * self.heads..][..self.heads];
        score_of(q, w, key, scale, self.fmt)
    }

    /// The fused op's logits against `score_ref` within `tol`; returns the
    /// largest error seen, relative to the scores' terms (the quantity
    /// FP8_TENSOR_CORE_EPS bounds).
    pub fn check_logits(&self, logits: &[f32], tol: ScoreTol) -> f64 {
        let mut worst = 0f64;
        for t in 0..self.tokens {
            let row = &logits[t * self.logits_width..][..self.logits_width];
            let keys = self.keys(t).unwrap_or(0);
            for (i, &g) in row.iter().enumerate() {
                if i < keys {
                    let want = self.score_ref(t, i);
                    let err = (f64::from(g) - want.value).abs();
                    if want.terms > 0.0 {
                        worst = worst.max(err / want.terms);
                    }
                    assert!(
                        err <= want.tolerance(tol),
                        "token {t} key {i}: score {g}, want {want:?} ({tol:?})"
                    );
                } else {
                    assert_eq!(
                        g.to_bits(),
                        u32::from_ne_bytes([POISON_BYTE; 4]),
                        "token {t}: column {i} written"
                    );
                }
            }
        }
        worst
    }

    /// The index table is a top-k of `logits` by (score, lower index first):
    /// as many entries as min(keys, topk), ascending keys, page indices
    /// through the page table, -1 after; every kept key ranks above every
    /// dropped one.
    pub fn check_selection(&self, logits: &[f32], table: &[i32]) {
        for t in 0..self.tokens {
            let out = &table[t * self.width..][..self.width];
            let Some(keys) = self.keys(t) else {
                assert!(out.iter().all(|&v| v == -1), "padding token {t}: {out:?}");
                continue;
            };
            let count = keys.min(self.topk);
            assert!(
                out[count..].iter().all(|&v| v == -1),
                "token {t}: tail not -1"
            );
            // Invert the page-index translation.
            let pages =
                &self.page_table[self.batch_id[t] as usize * self.max_pages..][..self.max_pages];
            let kept: Vec<usize> = out[..count]
                .iter()
                .map(|&v| {
                    let (page, slot) = (
                        v.div_euclid(PAGE as i32),
                        v.rem_euclid(PAGE as i32) as usize,
                    );
                    let j = pages.iter().position(|&id| id == page);
                    j.map(|j| j * PAGE + slot)
                        .filter(|&i| i < keys)
                        .unwrap_or_else(|| panic!("token {t}: {v} is no visible key's page index"))
                })
                .collect();
            assert!(
                kept.windows(2).all(|w| w[0] < w[1]),
                "token {t}: not ascending distinct keys"
            );
            let row = &logits[t * self.logits_width..][..keys];
            // (score rank, index) with -0 = +0 and NaN lowest.
            let rank = |i: usize| {
                let x = row[i];
                let v = if x.is_nan() {
                    f64::NEG_INFINITY
                } else {
                    f64::from(x)
                };
                (v, x.is_nan(), i)
            };
            let better = |a: usize, b: usize| {
                let (va, na, ia) = rank(a);
                let (vb, nb, ib) = rank(b);
                match (na, nb) {
                    (false, true) => true,
                    (true, false) => false,
                    _ if va != vb => va > vb,
                    _ => ia < ib,
                }
            };
            let mut is_kept = vec![false; keys];
            kept.iter().for_each(|&i| is_kept[i] = true);
            let worst_kept = kept
                .iter()
                .copied()
                .reduce(|a, b| if better(a, b) { b } else { a });
            if let Some(w) = worst_kept {
                for i in (0..keys).filter(|&i| !is_kept[i]) {
                    assert!(
                        better(w, i),
                        "token {t}: dropped key {i} ranks above kept key {w}"
                    );
                }
            }
        }
    }
}
