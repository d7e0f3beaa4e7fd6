//! One C-API call under test: its tensor arguments (honest or hostile
//! descriptors over harness-owned buffers in the context's memory), the
//! poisoned outputs, and the invariants checked when it returns.
//!
//! Memory safety of the harness itself: every descriptor handed to the
//! library either addresses only bytes of the allocation behind it, or is one
//! the library must refuse by its own rules (NULL data, unknown dtype, rank
//! outside 1..=4, a negative extent or stride, a span that wraps 64 bits or
//! passes the top of the address space). A mutation that would address past
//! the allocation while looking valid (the caller lying about its buffer) is
//! never made: `safe_or_refused` turns it back into the honest descriptor.

use std::os::raw::c_void;
use std::ptr;

use unikv::ffi::context::*;
use unikv::ffi::status::unikv_status;
use unikv::ffi::types::unikv_tensor;

use super::cursor::Cursor;
use super::Config;

pub const POISON: u8 = 0xA5;
pub const POISON_I32: i32 = i32::from_ne_bytes([POISON; 4]);

pub const BF16: u32 = 1;
pub const F32: u32 = 3;
pub const I32: u32 = 4;
pub const I64: u32 = 5;
pub const U8: u32 = 6;
pub const FP8: u32 = 7;
pub const FP8UZ: u32 = 8;

/// Bytes of one element of a valid dtype value.
pub fn elem_size(dtype: u32) -> Option<usize> {
    match dtype {
        1 | 2 => Some(2),
        3 | 4 => Some(4),
        5 => Some(8),
        6..=8 => Some(1),
        _ => None,
    }
}

/// The harness's side of the context's memory: allocations, copies and
/// reads through the C API, so the same code runs on device memory.
#[derive(Clone, Copy)]
pub struct Mem {
    pub ctx: *mut unikv_context,
}

fn must(status: unikv_status, what: &str) {
    assert_eq!(
        status,
        unikv_status::UNIKV_OK,
        "harness {what}: {}",
        super::last_error()
    );
}

impl Mem {
    pub fn alloc(&self, bytes: usize) -> *mut u8 {
        let mut p = ptr::null_mut();
        must(
            unsafe { unikv_memory_alloc(self.ctx, bytes, &mut p) },
            "alloc",
        );
        p.cast()
    }

    pub fn free(&self, p: *mut u8) {
        must(unsafe { unikv_memory_free(self.ctx, p.cast()) }, "free");
    }

    pub fn upload(&self, p: *mut u8, data: &[u8]) {
        let s = unsafe {
            unikv_memory_copy(
                self.ctx,
                p.cast(),
                data.as_ptr().cast(),
                data.len(),
                0,
                ptr::null_mut(),
            )
        };
        must(s, "upload");
    }

    pub fn download(&self, p: *const u8, bytes: usize) -> Vec<u8> {
        let mut out = vec![0u8; bytes];
        let s = unsafe {
            unikv_memory_copy(
                self.ctx,
                out.as_mut_ptr().cast(),
                p.cast(),
                bytes,
                1,
                ptr::null_mut(),
            )
        };
        must(s, "download");
        must(
            unsafe { unikv_stream_synchronize(self.ctx, ptr::null_mut()) },
            "sync",
        );
        out
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    In,
    Out,
    InOut,
}

/// Initial contents of a tensor's buffer.
pub enum Fill {
    /// Every byte POISON (outputs).
    Poison,
    /// Pseudo-random bytes (FP8 codes, caches).
    Bytes,
    /// Small finite values of the tensor's float dtype, a rare NaN or inf.
    Floats,
    /// These integer values in logical (row-major) order; the cursor may
    /// corrupt a few of them (hostile contents).
    Ints(Vec<i64>),
    /// These f32 values in logical order (a RoPE table).
    F32s(Vec<f32>),
}

/// What the library expects of one tensor argument.
pub struct Spec {
    pub name: &'static str,
    /// Accepted dtypes; the first is the honest one.
    pub dtypes: &'static [u32],
    pub shape: Vec<usize>,
    pub role: Role,
    pub fill: Fill,
    /// Outer strides may carry padding (in 16-byte units).
    pub pad: bool,
    /// Alignment in bytes the library requires of data and outer strides.
    pub align: usize,
    /// NULL data means absent.
    pub optional: bool,
    /// The library reads this descriptor (false: documented as ignored).
    pub checked: bool,
}

impl Spec {
    pub fn new(
        name: &'static str,
        dtypes: &'static [u32],
        shape: &[usize],
        role: Role,
        fill: Fill,
    ) -> Self {
        Spec {
            name,
            dtypes,
            shape: shape.to_vec(),
            role,
            fill,
            pad: false,
            align: 4,
            optional: false,
            checked: true,
        }
    }
    pub fn pad(mut self) -> Self {
        self.pad = true;
        self
    }
    pub fn align(mut self, a: usize) -> Self {
        self.align = a;
        self
    }
    pub fn optional(mut self) -> Self {
        self.optional = true;
        self
    }
    pub fn optional_if(mut self, optional: bool) -> Self {
        self.optional |= optional;
        self
    }
    pub fn unchecked(mut self) -> Self {
        self.checked = false;
        self
    }
}

pub struct Arg {
    pub name: &'static str,
    pub role: Role,
    pub base: *mut u8,
    pub bytes: usize,
    /// The buffer's contents before the call.
    pub image: Vec<u8>,
    /// After the call (filled by `Call::finish`).
    pub after: Vec<u8>,
    pub desc: unikv_tensor,
    /// The call reads or writes it (false: a field the operation ignores).
    pub checked: bool,
}

/// A region of library-owned memory (pool rows) that must not change when
/// the call fails.
struct Watched {
    what: String,
    base: *const u8,
    image: Vec<u8>,
}

pub struct Call {
    pub name: &'static str,
    pub mem: Mem,
    pub cfg: Config,
    pub args: Vec<Arg>,
    watched: Vec<Watched>,
    /// A rule the library must enforce was broken on purpose (the reason).
    pub must_fail: Option<String>,
    /// Some integer contents were corrupted.
    pub bad_contents: bool,
    /// An output was placed over another argument's memory.
    pub aliased: bool,
    /// The context validates device values (always true on the CPU).
    pub validates: bool,
    /// The op generated this call to be valid when nothing hostile was
    /// chosen: then it must succeed.
    pub honest_must_pass: bool,
    /// `must_fail` only compares a scalar with the honest extents, and an
    /// accepted hostile descriptor grew an extent (`grown`): then the call
    /// may be valid after all.
    soft: bool,
    grown: bool,
}

/// xorshift64*: bulk contents from a seed the input chooses.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Bytes from the first to one past the last element; None when it wraps.
fn span(shape: &[i64], strides: &[i64], elem: usize) -> Option<u64> {
    if shape.contains(&0) {
        return Some(0);
    }
    let mut last = 0u64;
    for (&n, &s) in shape.iter().zip(strides) {
        last = last.checked_add((n as u64 - 1).checked_mul(s as u64)?)?;
    }
    last.checked_add(1)?.checked_mul(elem as u64)
}

/// Why the library must refuse `d` whatever the rest of the call, if it must.
fn refusal(spec: &Spec, d: &unikv_tensor) -> Option<String> {
    if !spec.checked {
        return None;
    }
    if d.data.is_null() {
        return (!spec.optional).then(|| format!("{}: NULL data", spec.name));
    }
    let Some(elem) = elem_size(d.dtype) else {
        return Some(format!("{}: dtype {}", spec.name, d.dtype));
    };
    if !spec.dtypes.contains(&d.dtype) {
        return Some(format!("{}: wrong dtype {}", spec.name, d.dtype));
    }
    let n = d.ndim as usize;
    if n != spec.shape.len() {
        return Some(format!("{}: rank {}", spec.name, d.ndim));
    }
    let (shape, strides) = (&d.shape[..n], &d.strides[..n]);
    if shape.iter().any(|&s| s < 0) || strides.iter().any(|&s| s < 0) {
        return Some(format!("{}: negative extent or stride", spec.name));
    }
    if strides[n - 1] != 1 {
        return Some(format!(
            "{}: innermost stride {}",
            spec.name,
            strides[n - 1]
        ));
    }
    let align = spec.align.max(elem);
    if d.data as usize % align != 0 {
        return Some(format!("{}: data misaligned", spec.name));
    }
    match span(shape, strides, elem) {
        None => Some(format!("{}: span wraps", spec.name)),
        Some(b) if b > isize::MAX as u64 || (d.data as u64).checked_add(b).is_none() => {
            Some(format!("{}: span past the address space", spec.name))
        }
        _ => None,
    }
}

/// True when the library can only touch bytes of `[base, base + bytes)`
/// through `d`, or must refuse `d` outright.
fn safe_or_refused(d: &unikv_tensor, base: *mut u8, bytes: usize) -> bool {
    if d.data.is_null() {
        return true;
    }
    let Some(elem) = elem_size(d.dtype) else {
        return true;
    };
    let n = d.ndim as usize;
    if !(1..=4).contains(&n) {
        return true;
    }
    let (shape, strides) = (&d.shape[..n], &d.strides[..n]);
    if shape.iter().any(|&s| s < 0) || strides.iter().any(|&s| s < 0) {
        return true;
    }
    let start = d.data as u64;
    match span(shape, strides, elem) {
        None => true,
        Some(b) if b > isize::MAX as u64 || start.checked_add(b).is_none() => true,
        Some(b) => start >= base as u64 && start + b <= base as u64 + bytes as u64,
    }
}

/// Byte offsets of every element of a row-major layout, in logical order.
fn element_offsets(shape: &[usize], strides: &[usize], elem: usize) -> Vec<usize> {
    let n = shape.len();
    let mut out = Vec::new();
    if shape.contains(&0) {
        return out;
    }
    let mut idx = vec![0usize; n];
    loop {
        out.push(idx.iter().zip(strides).map(|(i, s)| i * s).sum::<usize>() * elem);
        let mut axis = n;
        loop {
            if axis == 0 {
                return out;
            }
            axis -= 1;
            idx[axis] += 1;
            if idx[axis] < shape[axis] {
                break;
            }
            idx[axis] = 0;
        }
    }
}

/// The byte ranges a (valid) descriptor addresses inside its allocation:
/// whole innermost rows (an accepted descriptor has unit innermost stride).
/// The `[start, end)` bytes of a non-empty row-major contiguous descriptor;
/// None for anything else (hostile shapes and strides included).
fn contiguous_bytes(d: &unikv_tensor) -> Option<(u128, u128)> {
    let elem = elem_size(d.dtype)? as i128;
    let n = d.ndim as usize;
    if n == 0 || n > 4 {
        return None;
    }
    let mut elems: i128 = 1;
    for axis in (0..n).rev() {
        if d.shape[axis] <= 0 || i128::from(d.strides[axis]) != elems {
            return None;
        }
        elems = elems.checked_mul(i128::from(d.shape[axis]))?;
    }
    let start = d.data as usize as u128;
    Some((
        start,
        start.checked_add(u128::try_from(elems.checked_mul(elem)?).ok()?)?,
    ))
}

fn view_ranges(d: &unikv_tensor, base: *const u8, bytes: usize) -> Vec<(usize, usize)> {
    let elem = elem_size(d.dtype).unwrap_or(1);
    let n = (d.ndim as usize).clamp(1, 4);
    let shape: Vec<usize> = d.shape[..n].iter().map(|&s| s.max(0) as usize).collect();
    let strides: Vec<usize> = d.strides[..n].iter().map(|&s| s.max(0) as usize).collect();
    let start = (d.data as usize).wrapping_sub(base as usize);
    let (row, rest) = if strides[n - 1] == 1 {
        (shape[n - 1], n - 1)
    } else {
        (1, n)
    };
    element_offsets(&shape[..rest], &strides[..rest], elem)
        .into_iter()
        .map(|off| {
            (
                (start + off).min(bytes),
                (start + off + row * elem).min(bytes),
            )
        })
        .collect()
}

impl Call {
    pub fn new(name: &'static str, mem: Mem, cfg: Config, validates: bool) -> Self {
        Call {
            name,
            mem,
            cfg,
            args: Vec::new(),
            watched: Vec::new(),
            must_fail: None,
            bad_contents: false,
            aliased: false,
            validates,
            honest_must_pass: false,
            soft: false,
            grown: false,
        }
    }

    /// Nothing hostile was chosen (no refusal expected, contents as
    /// generated, no overlap).
    pub fn honest(&self) -> bool {
        self.must_fail.is_none() && !self.bad_contents && !self.aliased
    }

    pub fn fail_because(&mut self, why: impl Into<String>) {
        if self.must_fail.is_none() || self.soft {
            self.must_fail = Some(why.into());
            self.soft = false;
        }
    }

    /// A refusal that rests on the honest extents of the buffers (a count or
    /// width one past them), void when a hostile edit grew an extent.
    pub fn fail_unless_grown(&mut self, why: impl Into<String>) {
        if self.must_fail.is_none() {
            self.must_fail = Some(why.into());
            self.soft = true;
        }
    }

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

    /// The descriptor of argument `i`, now also written by the call (exact
    /// in-place use, which the header allows for some outputs).
    pub fn in_place(&mut self, i: usize) -> unikv_tensor {
        self.args[i].role = Role::InOut;
        self.args[i].desc
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

    /// Snapshots library-owned memory that a failing call must not change.
    pub fn watch(&mut self, what: String, base: *const u8, bytes: usize) {
        if base.is_null() || bytes == 0 {
            return;
        }
        let image = self.mem.download(base, bytes);
        self.watched.push(Watched { what, base, image });
    }

    /// Checks the invariants of any call; returns true on success.
    pub fn finish(&mut self, status: unikv_status) -> bool {
        let name = self.name;
        let code = status as u32;
        super::record(name, code);
        let msg = super::last_error();
        if super::tracing() {
            eprintln!("  {name} -> {status:?} {msg:?}");
        }
        assert!(code <= 17, "{name}: status {code} is not a unikv_status");
        assert_ne!(
            status,
            unikv_status::UNIKV_INTERNAL,
            "{name}: INTERNAL: {msg}"
        );
        for a in self.args.iter_mut() {
            a.after = self.mem.download(a.base, a.bytes);
        }
        if code != 0 && self.honest_must_pass && self.honest() {
            panic!("{name}: refused an honest call with {status:?}: {msg}");
        }
        if code != 0 {
            assert!(!msg.is_empty(), "{name}: status {code} without a message");
            for a in &self.args {
                if a.after != a.image {
                    panic!(
                        "{name}: failed with {status:?} ({msg}) but wrote {}",
                        a.name
                    );
                }
            }
            for w in &self.watched {
                let after = self.mem.download(w.base, w.image.len());
                assert!(
                    after == w.image,
                    "{name}: failed with {status:?} ({msg}) but wrote {}",
                    w.what
                );
            }
            return false;
        }
        if let Some(why) = &self.must_fail {
            if !(self.soft && self.grown) {
                panic!("{name}: accepted a call it must refuse: {why}");
            }
        }
        if self.aliased {
            return true;
        }
        for a in &self.args {
            match a.role {
                Role::In => assert!(
                    a.after == a.image,
                    "{name}: succeeded but wrote its input {}",
                    a.name
                ),
                Role::Out | Role::InOut => {
                    // The bytes after the call with the view's put back
                    // must be the bytes before it.
                    let mut outside = a.after.clone();
                    for (s, e) in view_ranges(&a.desc, a.base, a.bytes) {
                        outside[s..e].copy_from_slice(&a.image[s..e]);
                    }
                    if outside != a.image {
                        let i = (0..a.bytes).find(|&i| outside[i] != a.image[i]).unwrap();
                        panic!(
                            "{name}: wrote byte {i} of {}'s buffer outside its view {:?}",
                            a.name, a.desc
                        );
                    }
                }
            }
        }
        true
    }

    /// Prints the call (UNIKV_FUZZ_TRACE=1): its status, what made it
    /// hostile, and every tensor argument with small integer contents.
    pub fn trace(&self) {
        eprintln!("{}", self.name);
        if let Some(why) = &self.must_fail {
            eprintln!("    must fail: {why}");
        }
        if self.bad_contents || self.aliased {
            eprintln!(
                "    bad contents: {}, aliased: {}",
                self.bad_contents, self.aliased
            );
        }
        for (i, a) in self.args.iter().enumerate() {
            let d = &a.desc;
            let n = (d.ndim as usize).min(4);
            let honest_layout = d.data as usize >= a.base as usize
                && (d.data as usize) < a.base as usize + a.bytes
                && matches!(d.dtype, 4 | 5)
                && (1..=4).contains(&d.ndim)
                && d.shape[..n].iter().all(|&s| (0..=64).contains(&s))
                && d.strides[..n].iter().all(|&s| (0..=4096).contains(&s))
                && safe_or_refused(d, a.base, a.bytes);
            let values = if honest_layout && (d.data as usize - a.base as usize) % 4 == 0 {
                format!(" = {:?}", self.ints_before(i))
            } else {
                String::new()
            };
            eprintln!(
                "    {} {:?} dtype {} shape {:?} strides {:?} data {}{}",
                a.name,
                a.role,
                d.dtype,
                &d.shape[..n],
                &d.strides[..n],
                if d.data.is_null() {
                    "NULL".to_string()
                } else {
                    format!("+{}", d.data as isize - a.base as isize)
                },
                values
            );
        }
    }

    /// Elements of argument `i` after the call, read through its descriptor
    /// (which the call accepted) in logical order, as i64.
    pub fn ints_after(&self, i: usize) -> Vec<i64> {
        self.ints(i, true)
    }

    /// Elements of argument `i` as they were before the call.
    pub fn ints_before(&self, i: usize) -> Vec<i64> {
        self.ints(i, false)
    }

    fn ints(&self, i: usize, after: bool) -> Vec<i64> {
        let a = &self.args[i];
        let bytes = if after { &a.after } else { &a.image };
        let d = &a.desc;
        let elem = elem_size(d.dtype).unwrap_or(4);
        let n = d.ndim as usize;
        let mut out = Vec::new();
        if d.shape[..n].contains(&0) {
            return out;
        }
        let start = d.data as usize - a.base as usize;
        let mut idx = vec![0i64; n];
        loop {
            let off: i64 = idx.iter().zip(&d.strides[..n]).map(|(i, s)| i * s).sum();
            let at = start + off as usize * elem;
            let v = if elem == 8 {
                i64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap())
            } else {
                i32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap()) as i64
            };
            out.push(v);
            let mut axis = n;
            loop {
                if axis == 0 {
                    return out;
                }
                axis -= 1;
                idx[axis] += 1;
                if idx[axis] < d.shape[axis] {
                    break;
                }
                idx[axis] = 0;
            }
        }
    }

    /// Content checks on success apply when the backend validated the values
    /// or none was corrupted.
    pub fn contents_trusted(&self) -> bool {
        self.validates || !self.bad_contents
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        for a in &self.args {
            self.mem.free(a.base);
        }
    }
}

/// Places a versioned argument struct at the start of a buffer 4096 bytes
/// longer than it (how far the library may read), with a hostile
/// `struct_size` or trailing bytes now and then; runs `f` on its address
/// (NULL now and then). Returns f's result.
pub fn with_struct<T: Copy, R>(
    c: &mut Cursor,
    call: &mut Call,
    value: T,
    f: impl FnOnce(*const T) -> R,
) -> R {
    let size = std::mem::size_of::<T>();
    let mut words = vec![0u64; (size + 4096).div_ceil(8)];
    unsafe {
        ptr::copy_nonoverlapping(
            &value as *const T as *const u8,
            words.as_mut_ptr().cast(),
            size,
        )
    };
    let bytes: &mut [u8] =
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), size + 4096) };
    let mut null = false;
    if c.chance(10) {
        let set = |b: &mut [u8], v: usize| b[..8].copy_from_slice(&v.to_ne_bytes());
        match c.below(8) {
            0 => null = true,
            1 => set(bytes, c.pick(&[0, 7, 8, size - 8, size - 1])),
            2 => set(bytes, size + 4097),
            3 => set(bytes, usize::MAX),
            4 => set(bytes, size + 4096),
            5 => set(bytes, size + 8),
            _ => {
                let extra = c.range(1, 64);
                set(bytes, size + extra);
                bytes[size + c.below(extra)] = c.u8() | 1;
            }
        }
        let got = usize::from_ne_bytes(bytes[..8].try_into().unwrap());
        let tail_ok = got >= size && got <= size + 4096 && bytes[size..got].iter().all(|b| *b == 0);
        if null {
            call.fail_because("args struct NULL");
        } else if !tail_ok {
            call.fail_because(format!("struct_size {got} (ours {size})"));
        }
    }
    let p: *const T = if null {
        ptr::null()
    } else {
        words.as_ptr().cast()
    };
    if super::tracing() {
        call.trace();
        let got = usize::from_ne_bytes(bytes[..8].try_into().unwrap());
        eprintln!(
            "    args struct_size {got} (sizeof {size}){}",
            if null { ", args NULL" } else { "" }
        );
    }
    f(p)
}

/// A pointer that is no unikv handle of any kind.
pub fn garbage_handle(c: &mut Cursor, scratch: &[u64; 8]) -> *mut c_void {
    match c.below(4) {
        0 => 0x10 as *mut c_void,
        1 => scratch.as_ptr() as *mut c_void,
        2 => (usize::MAX & !7) as *mut c_void,
        _ => 0xdead_bee0 as *mut c_void,
    }
}
