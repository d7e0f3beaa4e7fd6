//! Host access to validated views whose extents the operations already
//! checked: the CPU backend's views point at host memory, and `Validating`
//! rebases a device backend's views onto host copies before the rules read them.

use half::bf16;

use crate::args::attention::KeyRows;
use crate::args::LayerRows;
use crate::cache_layouts::unified::{self, NOPE_ROW_BYTES, ROPE_DIMS};
use crate::cache_layouts::{flashmla, scaled};
use crate::geometry::HEAD_DIM;
use crate::tensor::{IndexVector, Matrix, Tensor3, Vector};

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

/// The first `len` values of an i32 or i64 vector view, widened to i64.
///
/// # Safety
/// The view is host memory valid for reads and `len <= shape[0]`.
pub unsafe fn int_values(v: &IndexVector, len: usize) -> Vec<i64> {
    match v {
        IndexVector::I32(v) => slice(v, len).iter().map(|&x| i64::from(x)).collect(),
        IndexVector::I64(v) => slice(v, len).to_vec(),
    }
}

/// Row `(t, h)` of a 3-D view.
///
/// # Safety
/// The view is host memory valid for reads, `t < shape[0]`, `h < shape[1]`.
pub unsafe fn row3<'a, T>(m: &Tensor3<T>, t: usize, h: usize) -> &'a [T] {
    debug_assert!(t < m.shape[0] && h < m.shape[1]);
    std::slice::from_raw_parts(m.as_ptr().add(m.offset([t, h, 0])), m.shape[2])
}

/// Copies `src` into row `(t, h)` of a 3-D view.
///
/// # Safety
/// The view is host memory valid for writes, `t < shape[0]`, `h < shape[1]`,
/// and `src` has `shape[2]` elements.
pub unsafe fn put_row3<T: Copy>(m: &Tensor3<T>, t: usize, h: usize, src: &[T]) {
    debug_assert!(t < m.shape[0] && h < m.shape[1] && src.len() == m.shape[2]);
    std::ptr::copy(src.as_ptr(), m.as_ptr().add(m.offset([t, h, 0])), src.len());
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

/// Stores a 512-value latent row at row `r` of a pool layer, quantizing it for
/// FP8 pools.
///
/// # Safety
/// The layer is host memory valid for writes, `r < rows`, `src` has 512 values.
pub unsafe fn put_layer_row(layer: &LayerRows, r: usize, src: &[bf16]) {
    match layer {
        LayerRows::Bf16(m) => put_row(m, r, src),
        LayerRows::Fp8 { nope, rope, format } => {
            let mut n = [0u8; NOPE_ROW_BYTES];
            let mut q = [bf16::ZERO; ROPE_DIMS];
            unified::quantize_row(src, *format, &mut n, &mut q);
            put_row(nope, r, &n);
            put_row(rope, r, &q);
        }
    }
}

/// Appends row `r` of a key source as 512 f32 values (FP8 rows dequantized).
///
/// # Safety
/// The layer is host memory valid for reads and `r < rows`.
pub unsafe fn extend_with_row(layer: &LayerRows, r: usize, out: &mut Vec<f32>) {
    match layer {
        LayerRows::Bf16(m) => out.extend(row(m, r).iter().map(|x| x.to_f32())),
        LayerRows::Fp8 { nope, rope, format } => {
            let start = out.len();
            out.resize(start + HEAD_DIM, 0.0);
            unified::dequantize_row(row(nope, r), row(rope, r), *format, &mut out[start..]);
        }
    }
}

/// Appends key `r` of a key source as 512 f32 values: a layer's row
/// (`extend_with_row`), a FlashMLA cache's token `r` (`flashmla::dequantize_at`)
/// or a scaled FP8 row (`scaled::dequantize_row`).
///
/// # Safety
/// The source is host memory valid for reads and `r < kv.rows()`.
pub unsafe fn extend_with_key(kv: &KeyRows, r: usize, out: &mut Vec<f32>) {
    let start = out.len();
    match kv {
        KeyRows::Layer(layer) => extend_with_row(layer, r, out),
        KeyRows::FlashMla { cache, geometry } => {
            out.resize(start + HEAD_DIM, 0.0);
            flashmla::dequantize_at(contiguous(cache), geometry, r as u64, &mut out[start..]);
        }
        KeyRows::ScaledFp8 {
            codes,
            scales,
            format,
        } => {
            out.resize(start + HEAD_DIM, 0.0);
            scaled::dequantize_row(row(codes, r), row(scales, r), *format, &mut out[start..]);
        }
    }
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

/// A matrix view whose rows are contiguous, read as one slice.
///
/// # Safety
/// The view is host memory valid for reads, not written meanwhile, and
/// `strides[0] == shape[1]`.
pub unsafe fn contiguous<'a, T>(m: &Matrix<T>) -> &'a [T] {
    debug_assert_eq!(m.strides[0], m.shape[1]);
    std::slice::from_raw_parts_mut(m.as_ptr(), m.shape[0] * m.shape[1])
}
