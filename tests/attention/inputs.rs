//! Random inputs, and the host buffers (aligned, strided, poisoned) that carry
//! them.

use super::*;

/// `n` distinct rows below `rows`, in random order.
pub(crate) fn unique_rows(rng: &mut StdRng, rows: usize, n: usize) -> Vec<i32> {
    rand::seq::index::sample(rng, rows, n)
        .into_iter()
        .map(|r| r as i32)
        .collect()
}

/// Inserts `count` -1 entries at random positions (front and back included).
pub(crate) fn sprinkle(rng: &mut StdRng, mut list: Vec<i32>, count: usize) -> Vec<i32> {
    for _ in 0..count {
        let at = rng.random_range(0..=list.len());
        list.insert(at, -1);
    }
    list
}

/// `n` ragged lengths: always 0, 1 and 2300, the rest drawn from `LENGTHS`,
/// shuffled.
pub(crate) fn ragged_lengths(rng: &mut StdRng, n: usize) -> Vec<usize> {
    assert!(n >= 3);
    let mut lens = vec![0, 1, 2300];
    while lens.len() < n {
        lens.push(LENGTHS[rng.random_range(0..LENGTHS.len())]);
    }
    lens.shuffle(rng);
    lens
}

/// Per-head sink logits around the typical log-sum-exp of the scores, so the
/// sink really moves the result.
pub(crate) fn random_sink(rng: &mut StdRng, heads: usize) -> Vec<f32> {
    (0..heads).map(|_| rng.random_range(-3.0f32..8.0)).collect()
}

// ---------------------------------------------------------------------------
// Buffers and descriptors

#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Block(pub(crate) [u8; 64]);

/// A 64-byte aligned host buffer of `len` elements (bf16 rows must be 16-byte
/// aligned; a plain `Vec<bf16>` only guarantees 2).
pub(crate) struct Buf<T> {
    pub(crate) blocks: Vec<Block>,
    pub(crate) len: usize,
    pub(crate) _elem: PhantomData<T>,
}

impl<T: Copy> Buf<T> {
    /// Every byte set to `POISON_BYTE` (through `common::poisoned`).
    pub(crate) fn poisoned(len: usize) -> Self {
        let bytes = len * std::mem::size_of::<T>();
        Buf {
            blocks: poisoned::<Block>(bytes.div_ceil(64) + 1),
            len,
            _elem: PhantomData,
        }
    }

    pub(crate) fn from_slice(data: &[T]) -> Self {
        let mut b = Self::poisoned(data.len());
        b.as_mut_slice().copy_from_slice(data);
        b
    }

    pub(crate) fn as_slice(&self) -> &[T] {
        unsafe { std::slice::from_raw_parts(self.blocks.as_ptr() as *const T, self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        unsafe { std::slice::from_raw_parts_mut(self.blocks.as_mut_ptr() as *mut T, self.len) }
    }
}

/// A descriptor with explicit strides (elements); checks the span fits `data`.
pub(crate) fn strided<T: Dt>(data: &[T], shape: &[usize], strides: &[usize]) -> unikv_tensor {
    assert_eq!(shape.len(), strides.len());
    let span = 1 + shape
        .iter()
        .zip(strides)
        .map(|(n, s)| (n - 1) * s)
        .sum::<usize>();
    assert!(span <= data.len(), "descriptor spans past its buffer");
    let mut t = tensor(data, shape);
    for (axis, &s) in strides.iter().enumerate() {
        t.strides[axis] = s as i64;
    }
    t
}

/// Element strides of a `[tokens, heads, 512]` tensor.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub(crate) token: usize,
    pub(crate) head: usize,
}

impl Layout {
    pub(crate) fn dense(heads: usize) -> Self {
        Layout {
            token: heads * D,
            head: D,
        }
    }

    pub(crate) fn at(&self, t: usize, h: usize) -> usize {
        t * self.token + h * self.head
    }

    /// Elements needed for `tokens` token rows.
    pub(crate) fn len(&self, tokens: usize, heads: usize) -> usize {
        (tokens - 1) * self.token + (heads - 1) * self.head + D
    }

    pub(crate) fn descriptor(&self, data: &[bf16], tokens: usize, heads: usize) -> unikv_tensor {
        strided(data, &[tokens, heads, D], &[self.token, self.head, 1])
    }
}

/// Puts `lead` garbage entries before the slices (indptr[0] > 0).
pub(crate) fn with_leading(lead: &[i32], indices: &mut Vec<i32>, indptr: &mut [i32]) {
    indices.splice(0..0, lead.iter().copied());
    for p in indptr.iter_mut() {
        *p += lead.len() as i32;
    }
}

/// Concatenates per-token lists into (indices, indptr).
pub(crate) fn csr(lists: &[Vec<i32>]) -> (Vec<i32>, Vec<i32>) {
    let mut indices = Vec::new();
    let mut indptr = vec![0i32];
    for list in lists {
        indices.extend_from_slice(list);
        indptr.push(indices.len() as i32);
    }
    (indices, indptr)
}
