//! Building one tensor argument: buffer, contents, honest descriptor, and the
//! hostile edits of either.

use super::*;

impl Call {
    /// Builds one tensor argument: buffer, contents, honest descriptor, then
    /// (rarely) a hostile edit of the descriptor or of the integer contents.
    pub fn tensor(&mut self, c: &mut Cursor, spec: Spec) -> unikv_tensor {
        let dtype = spec.dtypes[0];
        let elem = elem_size(dtype).unwrap();
        let n = spec.shape.len();
        let mut strides = vec![1usize; n];
        for axis in (0..n.saturating_sub(1)).rev() {
            let mut s = spec.shape[axis + 1] * strides[axis + 1];
            if spec.pad && c.chance(40) {
                s += c.range(1, 2) * 16 / elem;
            }
            strides[axis] = s;
        }
        let span_bytes = if spec.shape.contains(&0) {
            0
        } else {
            (spec
                .shape
                .iter()
                .zip(&strides)
                .map(|(s, st)| (s - 1) * st)
                .sum::<usize>()
                + 1)
                * elem
        };
        // Room for a descriptor of a wider dtype or a misaligned pointer.
        let bytes = if span_bytes <= 4096 {
            span_bytes * 8 / elem + 64
        } else {
            span_bytes + 64
        };
        let base = self.mem.alloc(bytes);
        let mut image = vec![POISON; bytes];
        let mut rng = Rng::new(c.u32() as u64 ^ 0x9E37_79B9_7F4A_7C15);
        // Logical element offsets, for the fills that place values.
        let logical = matches!(spec.fill, Fill::Ints(_) | Fill::F32s(_));
        let offsets = if logical {
            element_offsets(&spec.shape, &strides, elem)
        } else {
            Vec::new()
        };
        match &spec.fill {
            Fill::Poison => {}
            Fill::Bytes => {
                for chunk in image[..span_bytes].chunks_mut(8) {
                    let r = rng.next().to_ne_bytes();
                    chunk.copy_from_slice(&r[..chunk.len()]);
                }
            }
            Fill::Floats => {
                // The whole span, padding included: 16 random bits per
                // value give sign, mantissa and an exponent of 2^-7..2^2.
                let mut bits = 0u64;
                for (k, o) in (0..span_bytes).step_by(elem).enumerate() {
                    if k % 4 == 0 {
                        bits = rng.next();
                    }
                    let p = (bits >> (16 * (k % 4))) as u16;
                    let b = (p & 0x807F) | ((120 + (p >> 7) % 10) << 7);
                    if dtype == F32 {
                        image[o..o + 4].copy_from_slice(&((b as u32) << 16).to_ne_bytes());
                    } else {
                        image[o..o + 2].copy_from_slice(&b.to_ne_bytes());
                    }
                }
                if span_bytes > 0 && c.chance(8) {
                    let o = c.below(span_bytes / elem) * elem;
                    let v = c.pick(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e38, -0.0]);
                    if dtype == F32 {
                        image[o..o + 4].copy_from_slice(&v.to_ne_bytes());
                    } else {
                        image[o..o + 2]
                            .copy_from_slice(&((v.to_bits() >> 16) as u16).to_ne_bytes());
                    }
                }
            }
            Fill::Ints(values) => {
                let mut values = values.clone();
                values.resize(offsets.len(), 0);
                if !values.is_empty() && c.chance(24) {
                    self.bad_contents = true;
                    for _ in 0..c.range(1, 2) {
                        let i = c.below(values.len());
                        let max = values.iter().copied().max().unwrap_or(0);
                        values[i] = c.pick(&[
                            -1,
                            -2,
                            max.wrapping_add(1),
                            i32::MAX as i64,
                            i32::MIN as i64,
                            1 << 20,
                            values[i].wrapping_add(1),
                            values[i].wrapping_sub(1),
                            i64::MAX,
                            1 << 40,
                        ]);
                    }
                }
                for (&o, &v) in offsets.iter().zip(&values) {
                    if dtype == F32 {
                        image[o..o + 4].copy_from_slice(&(v as f32).to_ne_bytes());
                    } else if elem == 8 {
                        image[o..o + 8].copy_from_slice(&v.to_ne_bytes());
                    } else {
                        image[o..o + 4].copy_from_slice(&(v as i32).to_ne_bytes());
                    }
                }
            }
            Fill::F32s(values) => {
                for (&o, v) in offsets.iter().zip(values) {
                    image[o..o + 4].copy_from_slice(&v.to_ne_bytes());
                }
            }
        }
        self.mem.upload(base, &image);
        let mut desc = unikv_tensor {
            data: base.cast(),
            dtype,
            ndim: n as u32,
            shape: [0; 4],
            strides: [0; 4],
        };
        for (axis, (&extent, &stride)) in spec.shape.iter().zip(&strides).enumerate() {
            desc.shape[axis] = extent as i64;
            desc.strides[axis] = stride as i64;
        }
        if c.chance(14) {
            let hostile = self.hostile(c, &desc, &spec);
            if safe_or_refused(&hostile, base, bytes) {
                self.grown |= (0..n).any(|a| hostile.shape[a] > desc.shape[a]);
                desc = hostile;
                // An accepted edit (a shifted pointer, a longer shape) can
                // change the values the call reads.
                self.bad_contents = true;
            }
        }
        if spec.role != Role::In && self.cfg.aliasing && !self.args.is_empty() && c.chance(20) {
            let t = c.below(self.args.len());
            let target = &self.args[t];
            let mut d = desc;
            d.data = unsafe { target.base.add(c.below(8) * 16) }.cast();
            if safe_or_refused(&d, target.base, target.bytes) {
                // Only an output laid exactly over an input (same pointer,
                // dtype, shape and strides) can be a documented in-place use.
                let exact = d.data == target.desc.data
                    && d.dtype == target.desc.dtype
                    && d.ndim == target.desc.ndim
                    && d.shape == target.desc.shape
                    && d.strides == target.desc.strides;
                // The output lands in the target's buffer; it overlaps the
                // target only where their views share a byte (the buffer may
                // hold slack past the target's view). Judged for contiguous
                // views only: a refusal is owed where that is certain.
                let shared = match (contiguous_bytes(&d), contiguous_bytes(&target.desc)) {
                    (Some((a0, a1)), Some((b0, b1))) => a0 < b1 && b0 < a1,
                    _ => false,
                };
                if self.cfg.aliasing_strict && !exact && shared && target.checked {
                    self.fail_because(format!("{} partially overlaps {}", spec.name, target.name));
                }
                desc = d;
                self.aliased = true;
            }
        }
        if let Some(why) = refusal(&spec, &desc) {
            self.fail_because(why);
        }
        self.args.push(Arg {
            name: spec.name,
            role: spec.role,
            base,
            bytes,
            image,
            after: Vec::new(),
            desc,
            checked: spec.checked,
        });
        desc
    }

    fn hostile(&mut self, c: &mut Cursor, honest: &unikv_tensor, spec: &Spec) -> unikv_tensor {
        let mut d = *honest;
        let n = spec.shape.len();
        let axis = c.below(n);
        match c.below(9) {
            0 => d.data = ptr::null_mut(),
            1 => d.data = unsafe { honest.data.cast::<u8>().add(c.range(1, 15)) }.cast(),
            2 => d.dtype = c.pick(&[0, 9, 77, u32::MAX]),
            3 => d.dtype = c.range(1, 8) as u32,
            4 => d.ndim = c.pick(&[0, 5, u32::MAX, n as u32 + 1, n as u32 - 1]),
            5 => {
                d.shape[axis] = c.pick(&[
                    -1,
                    0,
                    i64::MIN,
                    i64::MAX,
                    1 << 62,
                    1 << 40,
                    honest.shape[axis] - 1,
                    honest.shape[axis] + 1,
                ])
            }
            6 => {
                d.strides[axis] = c.pick(&[
                    -1,
                    0,
                    i64::MIN,
                    i64::MAX,
                    1 << 62,
                    honest.strides[axis] + 1,
                    honest.strides[axis] * 2,
                    -honest.strides[axis],
                ])
            }
            7 => {
                // Products that wrap 64 bits to a small span.
                d.shape[0] = (1 << 33) + 1;
                d.strides[0] = 1 << 31;
                if n > 1 {
                    d.strides[0] = c.pick(&[1 << 31, 1 << 62, (1 << 61) + 8]);
                }
            }
            _ => {
                // Outer strides smaller than the rows below (overlapping rows).
                if n > 1 {
                    d.strides[0] = honest.strides[1];
                } else {
                    d.shape[0] = i64::MAX;
                }
            }
        }
        d
    }
}
