//! Host access to validated views: on the CPU backend every view points at host
//! memory whose extents the operations already checked.

use crate::tensor::{Matrix, Vector};

/// The first `len` elements of a vector view.
///
/// # Safety
/// The view is host memory valid for reads and `len <= shape[0]`.
pub unsafe fn slice<'a, T>(v: &Vector<T>, len: usize) -> &'a [T] {
    debug_assert!(len <= v.shape[0]);
    if len == 0 {
        return &[];
    }
    std::slice::from_raw_parts(v.as_ptr(), len)
}

/// One row of a matrix view.
///
/// # Safety
/// The view is host memory valid for reads and `r < shape[0]`.
pub unsafe fn row<'a, T>(m: &Matrix<T>, r: usize) -> &'a [T] {
    debug_assert!(r < m.shape[0]);
    std::slice::from_raw_parts(m.as_ptr().add(m.offset([r, 0])), m.shape[1])
}

/// Writes one element of a vector view.
///
/// # Safety
/// The view is host memory valid for writes and `i < shape[0]`.
pub unsafe fn put<T>(v: &Vector<T>, i: usize, value: T) {
    debug_assert!(i < v.shape[0]);
    v.as_ptr().add(i).write(value);
}

/// Copies `src` into row `r` of a matrix view.
///
/// # Safety
/// The view is host memory valid for writes, `r < shape[0]`, and `src` has
/// `shape[1]` elements.
pub unsafe fn put_row<T: Copy>(m: &Matrix<T>, r: usize, src: &[T]) {
    debug_assert!(r < m.shape[0] && src.len() == m.shape[1]);
    std::ptr::copy(src.as_ptr(), m.as_ptr().add(m.offset([r, 0])), src.len());
}

/// Every element of a matrix whose rows are contiguous, as one slice.
///
/// # Safety
/// The view is host memory valid for writes, not otherwise borrowed, and
/// `strides[0] == shape[1]`.
pub unsafe fn contiguous_mut<'a, T>(m: &Matrix<T>) -> &'a mut [T] {
    debug_assert_eq!(m.strides[0], m.shape[1]);
    std::slice::from_raw_parts_mut(m.as_ptr(), m.shape[0] * m.shape[1])
}
