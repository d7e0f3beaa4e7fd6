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

mod arguments;
mod checks;
mod descriptor;

use descriptor::*;

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

    /// The descriptor of argument `i`, now also written by the call (exact
    /// in-place use, which the header allows for some outputs).
    pub fn in_place(&mut self, i: usize) -> unikv_tensor {
        self.args[i].role = Role::InOut;
        self.args[i].desc
    }

    /// Snapshots library-owned memory that a failing call must not change.
    pub fn watch(&mut self, what: String, base: *const u8, bytes: usize) {
        if base.is_null() || bytes == 0 {
            return;
        }
        let image = self.mem.download(base, bytes);
        self.watched.push(Watched { what, base, image });
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
pub fn with_struct<T: unikv::ffi::boundary::Versioned, R>(
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
        // A struct_size from the first released version on is accepted (the
        // fields it lacks read as zero, as this harness sets them).
        let tail_ok = got >= T::MIN_SIZE
            && got <= size + 4096
            && bytes[size.min(got)..got].iter().all(|b| *b == 0);
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
