//! Where a descriptor reaches: its byte span and element offsets, whether the
//! library must refuse it, and the honest fallback for one it could not.

use super::*;

/// Bytes from the first to one past the last element; None when it wraps.
pub(super) fn span(shape: &[i64], strides: &[i64], elem: usize) -> Option<u64> {
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
pub(super) fn refusal(spec: &Spec, d: &unikv_tensor) -> Option<String> {
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
pub(super) fn safe_or_refused(d: &unikv_tensor, base: *mut u8, bytes: usize) -> bool {
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
pub(super) fn element_offsets(shape: &[usize], strides: &[usize], elem: usize) -> Vec<usize> {
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
pub(super) fn contiguous_bytes(d: &unikv_tensor) -> Option<(u128, u128)> {
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

pub(super) fn view_ranges(d: &unikv_tensor, base: *const u8, bytes: usize) -> Vec<(usize, usize)> {
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
