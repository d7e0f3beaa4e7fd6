//! The poisoned arena a case carves its tensors from, tensor descriptors over
//! it, the refusal checks, and dense pools.

use super::*;

/// A descriptor of `T` at `data` with explicit strides (in elements).
pub(crate) fn desc<T: Dt>(data: *mut c_void, shape: &[usize], strides: &[usize]) -> unikv_tensor {
    let mut t = absent();
    t.data = data;
    t.dtype = T::DTYPE as u32;
    t.ndim = shape.len() as u32;
    for (axis, (&n, &s)) in shape.iter().zip(strides).enumerate() {
        t.shape[axis] = n as i64;
        t.strides[axis] = s as i64;
    }
    t
}

pub(crate) fn row_major(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for axis in (0..shape.len().saturating_sub(1)).rev() {
        strides[axis] = strides[axis + 1] * shape[axis + 1];
    }
    strides
}

/// Hands out 16-byte aligned regions of an arena, one after another.
#[derive(Default)]
pub(crate) struct Regions(pub(crate) usize);

impl Regions {
    pub(crate) fn take(&mut self, bytes: usize) -> usize {
        let at = self.0;
        self.0 += bytes.div_ceil(16) * 16;
        at
    }
}

/// A poisoned, 16-byte aligned host buffer (the library writes through the
/// descriptors into it, as into device memory).
pub(crate) struct Arena(pub(crate) Vec<u128>);

impl Arena {
    pub(crate) fn new(regions: &Regions) -> Self {
        Arena(poisoned(regions.0.div_ceil(16)))
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len() * 16
    }

    pub(crate) fn ptr(&self, byte: usize) -> *mut c_void {
        assert!(byte <= self.len());
        unsafe { (self.0.as_ptr() as *mut u8).add(byte).cast() }
    }

    pub(crate) fn strided<T: Dt>(
        &self,
        byte: usize,
        shape: &[usize],
        strides: &[usize],
    ) -> unikv_tensor {
        let span = 1 + shape
            .iter()
            .zip(strides)
            .map(|(n, s)| (n - 1) * s)
            .sum::<usize>();
        assert!(byte + span * size_of::<T>() <= self.len(), "past the arena");
        desc::<T>(self.ptr(byte), shape, strides)
    }

    /// A row-major descriptor.
    pub(crate) fn t<T: Dt>(&self, byte: usize, shape: &[usize]) -> unikv_tensor {
        self.strided::<T>(byte, shape, &row_major(shape))
    }

    pub(crate) fn write<T: Copy>(&mut self, byte: usize, values: &[T]) {
        let n = std::mem::size_of_val(values);
        assert!(byte + n <= self.len());
        unsafe { ptr::copy_nonoverlapping(values.as_ptr().cast::<u8>(), self.ptr(byte).cast(), n) };
    }

    /// `rows` rows of `len` values from `values`, `stride` elements apart.
    pub(crate) fn write_rows<T: Copy>(
        &mut self,
        byte: usize,
        stride: usize,
        len: usize,
        values: &[T],
    ) {
        for (r, row) in values.chunks(len).enumerate() {
            self.write(byte + r * stride * size_of::<T>(), row);
        }
    }

    pub(crate) fn bytes(&self) -> Vec<u8> {
        bytes_of(&self.0)
    }

    pub(crate) fn region(&self, byte: usize, len: usize) -> Vec<u8> {
        self.bytes()[byte..byte + len].to_vec()
    }
}

/// Asserts UNIKV_OVERLAPPING_BUFFERS with a message that starts with `lead`
/// and names `other`.
#[track_caller]
pub(crate) fn refused(status: unikv_status, lead: &str, other: &str) {
    check(status, UNIKV_OVERLAPPING_BUFFERS);
    let msg = last_error();
    assert!(
        msg.starts_with(&format!("{lead}: overlaps ")) && msg.contains(other),
        "message {msg:?} should start with {lead:?} and name {other:?}"
    );
}

/// Runs a call that must be refused, and checks that it wrote nothing to
/// the arena or to the pool rows.
#[track_caller]
pub(crate) fn refused_unchanged(
    arena: &Arena,
    pool: Option<(&Pool, u32)>,
    call: impl FnOnce() -> unikv_status,
    lead: &str,
    other: &str,
) {
    let pool_bytes = || pool.map(|(p, layer)| layer_bytes(p, layer));
    let before = (arena.bytes(), pool_bytes());
    refused(call(), lead, other);
    assert!(
        before == (arena.bytes(), pool_bytes()),
        "{lead}: a refused call wrote"
    );
}

/// A pool layer's bytes, an FP8 layer's rope rows included.
pub(crate) fn layer_bytes(pool: &Pool, layer: u32) -> Vec<u8> {
    let info = pool.layer(layer);
    let mut out = bytes_of(unsafe {
        std::slice::from_raw_parts(info.data as *const u8, info.bytes as usize)
    });
    if info.rope_bytes > 0 {
        let rope = info.rope_data as *const u8;
        out.extend(unsafe { std::slice::from_raw_parts(rope, info.rope_bytes as usize) });
    }
    out
}

pub(crate) fn dense_pool(ctx: &Ctx, dtype: unikv_dtype) -> Pool {
    let spec = PoolSpec {
        ratios: vec![0, 4],
        max_requests: 2,
        window: 4,
        spec_extra: 0,
        c128_blocks: 1,
    };
    Pool::of(ctx, &spec, dtype)
}
