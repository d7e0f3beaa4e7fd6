//! Validated tensor views.
//!
//! A caller passes a descriptor (pointer, dtype, shape, strides in elements). The
//! operations turn descriptors into the typed views below after checking dtype,
//! rank, extents, strides and alignment; backends only ever see typed views. The
//! pointers may be host or device memory depending on the backend, so nothing here
//! dereferences them.

use std::marker::PhantomData;

use crate::dtype::DType;
use crate::error::{ensure, err, Result};

pub const MAX_DIMS: usize = 4;

/// An unvalidated tensor descriptor, as received from the caller.
#[derive(Debug, Clone, Copy)]
pub struct RawTensor {
    pub data: *mut u8,
    pub dtype: u32,
    pub ndim: u32,
    pub shape: [i64; MAX_DIMS],
    pub strides: [i64; MAX_DIMS],
}

/// Rust element types that may back a tensor argument.
pub trait Elem: Copy + Send + Sync + 'static {
    const DTYPE: DType;
}
impl Elem for half::bf16 {
    const DTYPE: DType = DType::Bf16;
}
impl Elem for f32 {
    const DTYPE: DType = DType::F32;
}
impl Elem for i32 {
    const DTYPE: DType = DType::I32;
}
impl Elem for i64 {
    const DTYPE: DType = DType::I64;
}
impl Elem for u8 {
    const DTYPE: DType = DType::U8;
}

/// Required extent of one axis.
#[derive(Debug, Clone, Copy)]
pub enum Extent {
    Exact(usize),
    AtLeast(usize),
}

/// A checked, typed, row-major view: innermost stride 1, outer strides at least
/// the extent below them so rows never overlap. `N` is the rank.
#[derive(Debug)]
pub struct View<T, const N: usize> {
    ptr: *mut T,
    pub shape: [usize; N],
    /// Strides in elements; `strides[N - 1] == 1`.
    pub strides: [usize; N],
    _elem: PhantomData<T>,
}

impl<T, const N: usize> Clone for View<T, N> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T, const N: usize> Copy for View<T, N> {}

// SAFETY: a view is an address plus extents; the operations that read or write
// through it establish exclusivity themselves (outputs are disjoint per worker).
unsafe impl<T: Send, const N: usize> Send for View<T, N> {}
unsafe impl<T: Sync, const N: usize> Sync for View<T, N> {}

pub type Vector<T> = View<T, 1>;
pub type Matrix<T> = View<T, 2>;
pub type Tensor3<T> = View<T, 3>;

impl<T, const N: usize> View<T, N> {
    /// Builds a view over memory the library owns (pool buffers, workspaces).
    pub fn from_parts(ptr: *mut T, shape: [usize; N]) -> Self {
        let mut strides = [1usize; N];
        for axis in (0..N.saturating_sub(1)).rev() {
            strides[axis] = strides[axis + 1] * shape[axis + 1];
        }
        View {
            ptr,
            shape,
            strides,
            _elem: PhantomData,
        }
    }

    /// The same extents and strides over another base address (a host copy of
    /// the view's span).
    pub fn rebased(&self, ptr: *mut T) -> Self {
        View {
            ptr,
            shape: self.shape,
            strides: self.strides,
            _elem: PhantomData,
        }
    }

    pub fn as_ptr(&self) -> *mut T {
        self.ptr
    }

    /// Element offset of a multi-index (64-bit, never overflows for valid views).
    #[inline]
    pub fn offset(&self, index: [usize; N]) -> usize {
        index
            .iter()
            .zip(self.strides.iter())
            .map(|(i, s)| i * s)
            .sum()
    }

    /// Number of elements from the first to one past the last addressable
    /// element. Validation bounded it (in bytes) by `isize::MAX`, so neither
    /// this nor `offset` of an in-range index can overflow.
    pub fn span_elems(&self) -> usize {
        span_bytes(&self.shape, &self.strides, 1).expect("a validated view's span fits")
    }
}

/// Bytes from the first to one past the last addressable element of a
/// row-major layout of `elem`-byte elements (0 when any extent is 0); None when
/// the span does not fit in 64 bits.
fn span_bytes(shape: &[usize], strides: &[usize], elem: usize) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    let mut last = 0usize;
    for (n, s) in shape.iter().zip(strides) {
        last = last.checked_add((n - 1).checked_mul(*s)?)?;
    }
    last.checked_add(1)?.checked_mul(elem)
}

impl RawTensor {
    /// Validates an optional argument: a NULL data pointer means "absent".
    pub fn optional<T: Elem, const N: usize>(
        &self,
        name: &str,
        extents: [Extent; N],
        align_bytes: usize,
    ) -> Result<Option<View<T, N>>> {
        if self.data.is_null() {
            return Ok(None);
        }
        self.view(name, extents, align_bytes).map(Some)
    }

    /// Validates a required argument against dtype, rank, extents, layout and
    /// alignment. `align_bytes` applies to the data pointer and to every outer
    /// stride in bytes (vectorised kernels load whole 16-byte chunks of a row).
    pub fn view<T: Elem, const N: usize>(
        &self,
        name: &str,
        extents: [Extent; N],
        align_bytes: usize,
    ) -> Result<View<T, N>> {
        ensure!(!self.data.is_null(), NullArgument, "{name}.data");
        let dtype = DType::from_raw(name, self.dtype)?;
        ensure!(
            dtype == T::DTYPE,
            BadDtype,
            "{name}: dtype is {}, expected {}",
            dtype.name(),
            T::DTYPE.name()
        );
        ensure!(
            self.ndim as usize == N,
            BadShape,
            "{name}: rank is {}, expected {N}",
            self.ndim
        );
        let mut shape = [0usize; N];
        let mut strides = [0usize; N];
        for axis in 0..N {
            let (n, s) = (self.shape[axis], self.strides[axis]);
            ensure!(n >= 0, BadShape, "{name}: shape[{axis}] = {n} is negative");
            ensure!(
                s >= 0,
                BadStride,
                "{name}: strides[{axis}] = {s} is negative"
            );
            shape[axis] = n as usize;
            strides[axis] = s as usize;
            match extents[axis] {
                Extent::Exact(want) => ensure!(
                    shape[axis] == want,
                    BadShape,
                    "{name}: shape[{axis}] is {n}, expected {want}"
                ),
                Extent::AtLeast(want) => ensure!(
                    shape[axis] >= want,
                    BadShape,
                    "{name}: shape[{axis}] is {n}, expected at least {want}"
                ),
            }
        }
        ensure!(
            N == 0 || strides[N - 1] == 1,
            BadStride,
            "{name}: innermost stride is {}, expected 1",
            strides[N - 1]
        );
        // Every product below is checked: a caller's shape and strides are
        // arbitrary 63-bit values, and a wrapped product would let a view that
        // reaches outside the address space (or before its base) pass.
        for axis in 0..N.saturating_sub(1) {
            let below = shape[axis + 1].checked_mul(strides[axis + 1]);
            ensure!(
                below.is_some_and(|below| strides[axis] >= below),
                BadStride,
                "{name}: strides[{axis}] = {} overlaps the {} x {} elements of the axis below",
                strides[axis],
                shape[axis + 1],
                strides[axis + 1]
            );
        }
        let elem = dtype.size_bytes();
        let align = align_bytes.max(elem);
        ensure!(
            (self.data as usize) % align == 0,
            BadAlignment,
            "{name}.data {:p} is not {align}-byte aligned",
            self.data
        );
        let span = span_bytes(&shape, &strides, elem);
        ensure!(
            span.is_some_and(|bytes| bytes <= isize::MAX as usize
                && (self.data as usize).checked_add(bytes).is_some()),
            BadShape,
            "{name}: shape {:?} with strides {:?} spans more than the address space from {:p}",
            &self.shape[..N],
            &self.strides[..N],
            self.data
        );
        for (axis, stride) in strides.iter().enumerate().take(N.saturating_sub(1)) {
            ensure!(
                stride
                    .checked_mul(elem)
                    .is_some_and(|bytes| bytes % align == 0),
                BadAlignment,
                "{name}: strides[{axis}] = {stride} elements is not a multiple of {align} bytes"
            );
        }
        let view = View {
            ptr: self.data as *mut T,
            shape,
            strides,
            _elem: PhantomData,
        };
        Ok(view)
    }
}

/// A 1-D integer argument the caller may pass as int32 or int64 (cache
/// locations, positions): serving stacks keep such tensors in either width.
#[derive(Debug, Clone, Copy)]
pub enum IndexVector {
    I32(Vector<i32>),
    I64(Vector<i64>),
}

impl IndexVector {
    pub fn is_i64(&self) -> bool {
        matches!(self, IndexVector::I64(_))
    }

    pub fn as_ptr(&self) -> *mut u8 {
        match self {
            IndexVector::I32(v) => v.as_ptr() as *mut u8,
            IndexVector::I64(v) => v.as_ptr() as *mut u8,
        }
    }
}

/// Rows of values the caller may pass as bf16 or f32 (a key an earlier step
/// produced in either precision).
#[derive(Debug, Clone, Copy)]
pub enum FloatRows {
    Bf16(Matrix<half::bf16>),
    F32(Matrix<f32>),
}

impl FloatRows {
    pub fn as_ptr(&self) -> *mut u8 {
        match self {
            FloatRows::Bf16(m) => m.as_ptr() as *mut u8,
            FloatRows::F32(m) => m.as_ptr() as *mut u8,
        }
    }

    /// The row stride in elements.
    pub fn row_stride(&self) -> usize {
        match self {
            FloatRows::Bf16(m) => m.strides[0],
            FloatRows::F32(m) => m.strides[0],
        }
    }

    pub fn is_f32(&self) -> bool {
        matches!(self, FloatRows::F32(_))
    }
}

impl RawTensor {
    /// Validates a 1-D int32 or int64 argument (see `view` for the checks).
    pub fn index_vector(&self, name: &str, extent: Extent) -> Result<IndexVector> {
        match self.either_dtype(name, DType::I32, DType::I64)? {
            DType::I32 => self.view(name, [extent], 4).map(IndexVector::I32),
            _ => self.view(name, [extent], 8).map(IndexVector::I64),
        }
    }

    /// `index_vector` for an optional argument: a NULL data pointer means absent.
    pub fn optional_index_vector(&self, name: &str, extent: Extent) -> Result<Option<IndexVector>> {
        if self.data.is_null() {
            return Ok(None);
        }
        self.index_vector(name, extent).map(Some)
    }

    /// Validates a 2-D bf16 or f32 argument (see `view` for the checks).
    pub fn float_rows(
        &self,
        name: &str,
        extents: [Extent; 2],
        align_bytes: usize,
    ) -> Result<FloatRows> {
        match self.either_dtype(name, DType::Bf16, DType::F32)? {
            DType::Bf16 => self.view(name, extents, align_bytes).map(FloatRows::Bf16),
            _ => self.view(name, extents, align_bytes).map(FloatRows::F32),
        }
    }

    /// The descriptor's dtype when it is `a` or `b`; `view` checks the rest.
    fn either_dtype(&self, name: &str, a: DType, b: DType) -> Result<DType> {
        ensure!(!self.data.is_null(), NullArgument, "{name}.data");
        let dtype = DType::from_raw(name, self.dtype)?;
        ensure!(
            dtype == a || dtype == b,
            BadDtype,
            "{name}: dtype is {}, expected {} or {}",
            dtype.name(),
            a.name(),
            b.name()
        );
        Ok(dtype)
    }
}

/// The alignment required for bf16 latent rows: kernels move 16-byte vectors.
pub const ROW_ALIGN: usize = 16;

/// Fails with `BadShape` when a 64-bit product overflows (used for sizes).
pub fn checked_mul(name: &str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| err!(BadShape, "{name}: {a} x {b} overflows"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    fn raw(data: usize, shape: &[i64], strides: &[i64]) -> RawTensor {
        let mut t = RawTensor {
            data: data as *mut u8,
            dtype: DType::I32.to_raw(),
            ndim: shape.len() as u32,
            shape: [0; MAX_DIMS],
            strides: [0; MAX_DIMS],
        };
        t.shape[..shape.len()].copy_from_slice(shape);
        t.strides[..strides.len()].copy_from_slice(strides);
        t
    }

    fn view2(t: &RawTensor) -> Result<Matrix<i32>> {
        t.view("t", [Extent::AtLeast(0), Extent::AtLeast(0)], 4)
    }

    #[test]
    fn strides_whose_products_wrap_are_rejected() {
        let base = 0x1000_0000;
        // strides[0] = i64::MAX over 3 rows: row 2 would wrap to base - 8.
        let e = view2(&raw(base, &[3, 2], &[i64::MAX, 1])).unwrap_err();
        assert!(matches!(e, Error::BadShape(_)), "{e}");
        // (2^33 + 1) rows of stride 2^31 wrap to a small span; 2^33 rows do
        // not. Both span more than the address space.
        for rows in [1i64 << 33, (1 << 33) + 1] {
            let e = view2(&raw(base, &[rows, 512], &[1 << 31, 1])).unwrap_err();
            assert!(matches!(e, Error::BadShape(_)), "{rows} rows: {e}");
        }
        // shape * stride of the axis below wraps: [2, 2^62, 4] with strides
        // [8, 4, 1] claims rows of 2^64 elements.
        let e = raw(base, &[2, 1 << 62, 4], &[8, 4, 1])
            .view::<i32, 3>("t", [Extent::AtLeast(0); 3], 4)
            .unwrap_err();
        assert!(matches!(e, Error::BadStride(_)), "{e}");
    }

    #[test]
    fn a_span_past_the_top_of_the_address_space_is_rejected() {
        let top = usize::MAX - 4095;
        let e = view2(&raw(top, &[2, 1024], &[1024, 1])).unwrap_err();
        assert!(matches!(e, Error::BadShape(_)), "{e}");
        assert!(view2(&raw(top, &[1, 1023], &[1023, 1])).is_ok());
    }

    #[test]
    fn in_range_views_keep_their_span() {
        let v = view2(&raw(0x1000, &[3, 5], &[8, 1])).unwrap();
        assert_eq!(v.span_elems(), 2 * 8 + 5);
        assert_eq!(v.offset([2, 4]), 20);
        let empty = view2(&raw(0x1000, &[0, 5], &[1 << 60, 1])).unwrap();
        assert_eq!(empty.span_elems(), 0);
    }
}
