//! Inverse RoPE on the host (see `ops::rope`): every position is checked before
//! any head is rotated, so a rejected call writes nothing.
//!
//! Rounding: the bf16 inputs widen to f32 exactly, `rope::inverse_rope_row`
//! rotates them in fp32 with separate (never fused) multiplies and adds, and each
//! result is rounded once, to nearest even, to bf16. kernels/rope.cu evaluates the
//! same expressions with explicitly unfused operations, so the backends agree bit
//! for bit.

use half::bf16;
use rayon::prelude::*;

use crate::args::rope::InverseRopeArgs;
use crate::backend::host::row;
use crate::backend::rules::rope::checked_positions;
use crate::error::Result;
use crate::geometry::HEAD_DIM;
use crate::rope::{inverse_rope_row, ROPE_DIM};

pub fn inverse_rope(threads: &rayon::ThreadPool, a: &InverseRopeArgs) -> Result<()> {
    // SAFETY: host view with extent checked by `ops::rope`.
    let positions = unsafe { checked_positions(&a.positions, a.num_tokens, a.table.shape[0])? };
    threads.install(|| {
        positions.par_iter().enumerate().for_each(|(t, &p)| {
            // SAFETY: `p` was checked against the table's rows above.
            let cs = unsafe { row(&a.table, p as usize) };
            for h in 0..a.num_heads {
                // SAFETY: extents checked by `ops::rope`; token t's heads are this
                // worker's alone (rows of a view never overlap).
                unsafe { rotate_head(a, t, h, cs) };
            }
        })
    });
    Ok(())
}

/// # Safety
/// `a.x` is host memory checked by `ops::rope`, `t < num_tokens`, `h < num_heads`,
/// and no other thread touches head (t, h).
unsafe fn rotate_head(a: &InverseRopeArgs, t: usize, h: usize, table_row: &[f32]) {
    let x = a.x.as_ptr().add(a.x.offset([t, h, HEAD_DIM - ROPE_DIM]));
    let mut v = [0f32; ROPE_DIM];
    for (d, value) in v.iter_mut().enumerate() {
        *value = (*x.add(d)).to_f32();
    }
    inverse_rope_row(&mut v, table_row);
    for (d, value) in v.iter().enumerate() {
        x.add(d).write(bf16::from_f32(*value));
    }
}
