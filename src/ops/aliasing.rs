//! The overlap rule every operation applies to its validated arguments before
//! calling the backend (issue 21): no output may share a byte with another
//! argument of the call, an input it reads or another output, except a pair
//! the operation lists as exact in-place use (the same data pointer, dtype,
//! shape and strides), which its backends read element by element before
//! overwriting. Anything else would leave the result to the backend's order
//! of reads and writes. The pool layer an operation writes or reads counts as
//! an argument, so a caller tensor pointing into it is refused. Absent
//! optional arguments and empty views touch no memory and are skipped.

use std::fmt;

use crate::args::LayerRows;
use crate::dtype::DType;
use crate::error::{err, Error, Result};
use crate::overlap::Footprint;
use crate::tensor::{Elem, FloatRows, IndexVector, View, MAX_DIMS};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
}

/// An argument's name in messages and in the in-place list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Name {
    Arg(&'static str),
    /// The rows of a pool layer (both buffers of an FP8 layer).
    Pool(u32),
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Name::Arg(name) => f.write_str(name),
            Name::Pool(layer) => write!(f, "the pool's rows of layer {layer}"),
        }
    }
}

/// The descriptor fields exact in-place use must repeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    data: usize,
    dtype: DType,
    rank: usize,
    shape: [usize; MAX_DIMS],
    strides: [usize; MAX_DIMS],
}

/// An argument as the rule sees it: up to two buffers (an FP8 pool layer
/// has a nope and a rope buffer) and, for a caller tensor, its layout.
pub(crate) trait Argument {
    fn footprints(&self) -> [Footprint; 2];
    fn layout(&self) -> Option<Layout>;
}

impl<T: Elem, const N: usize> Argument for View<T, N> {
    fn footprints(&self) -> [Footprint; 2] {
        [Footprint::of(self), Footprint::default()]
    }

    fn layout(&self) -> Option<Layout> {
        let mut layout = Layout {
            data: self.as_ptr() as usize,
            dtype: T::DTYPE,
            rank: N,
            shape: [0; MAX_DIMS],
            strides: [0; MAX_DIMS],
        };
        layout.shape[..N].copy_from_slice(&self.shape);
        layout.strides[..N].copy_from_slice(&self.strides);
        Some(layout)
    }
}

impl Argument for IndexVector {
    fn footprints(&self) -> [Footprint; 2] {
        match self {
            IndexVector::I32(v) => v.footprints(),
            IndexVector::I64(v) => v.footprints(),
        }
    }

    fn layout(&self) -> Option<Layout> {
        match self {
            IndexVector::I32(v) => v.layout(),
            IndexVector::I64(v) => v.layout(),
        }
    }
}

impl Argument for FloatRows {
    fn footprints(&self) -> [Footprint; 2] {
        match self {
            FloatRows::Bf16(m) => m.footprints(),
            FloatRows::F32(m) => m.footprints(),
        }
    }

    fn layout(&self) -> Option<Layout> {
        match self {
            FloatRows::Bf16(m) => m.layout(),
            FloatRows::F32(m) => m.layout(),
        }
    }
}

/// Key rows (a pool layer, or prefill's extend rows) are read only, never an
/// in-place partner, so they have no layout.
impl Argument for LayerRows {
    fn footprints(&self) -> [Footprint; 2] {
        match self {
            LayerRows::Bf16(m) => [Footprint::of(m), Footprint::default()],
            LayerRows::Fp8 { nope, rope, .. } => [Footprint::of(nope), Footprint::of(rope)],
        }
    }

    fn layout(&self) -> Option<Layout> {
        None
    }
}

/// An absent optional argument occupies nothing.
impl<A: Argument> Argument for Option<A> {
    fn footprints(&self) -> [Footprint; 2] {
        self.as_ref().map_or_else(Default::default, A::footprints)
    }

    fn layout(&self) -> Option<Layout> {
        self.as_ref().and_then(A::layout)
    }
}

/// One argument of a call, as `check` takes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Operand {
    name: Name,
    access: Access,
    footprints: [Footprint; 2],
    layout: Option<Layout>,
}

impl Operand {
    fn new(name: Name, access: Access, arg: &impl Argument) -> Self {
        Operand {
            name,
            access,
            footprints: arg.footprints(),
            layout: arg.layout(),
        }
    }

    fn meets(&self, other: &Operand) -> bool {
        self.footprints
            .iter()
            .any(|a| other.footprints.iter().any(|b| a.overlaps(b)))
    }
}

/// An argument the operation reads.
pub(crate) fn input(name: &'static str, arg: &impl Argument) -> Operand {
    Operand::new(Name::Arg(name), Access::Read, arg)
}

/// An argument the operation writes (or reads and writes).
pub(crate) fn output(name: &'static str, arg: &impl Argument) -> Operand {
    Operand::new(Name::Arg(name), Access::Write, arg)
}

/// The rows of pool layer `layer`, read by the operation.
pub(crate) fn pool_input(layer: u32, rows: &LayerRows) -> Operand {
    Operand::new(Name::Pool(layer), Access::Read, rows)
}

/// The rows of pool layer `layer` when the operation writes them (`None`: it
/// does not).
pub(crate) fn pool_output(layer: u32, rows: Option<LayerRows>) -> Operand {
    Operand::new(Name::Pool(layer), Access::Write, &rows)
}

/// Scratch memory the operation writes: `bytes` from `ptr`.
pub(crate) fn scratch(name: &'static str, ptr: *const u8, bytes: usize) -> Operand {
    Operand {
        name: Name::Arg(name),
        access: Access::Write,
        footprints: [Footprint::bytes(ptr, bytes), Footprint::default()],
        layout: None,
    }
}

/// Fails with `Overlap` when an output shares a byte with another operand,
/// unless the two are one of `in_place`'s (output, input) pairs and have the
/// same layout. Bounding intervals settle the pairs of separate allocations,
/// so this costs a few comparisons per pair.
pub(crate) fn check(operands: &[Operand], in_place: &[(&'static str, &'static str)]) -> Result<()> {
    for (i, a) in operands.iter().enumerate() {
        for b in &operands[i + 1..] {
            let (out, other) = match (a.access, b.access) {
                (Access::Read, Access::Read) => continue,
                (Access::Write, _) => (a, b),
                (Access::Read, Access::Write) => (b, a),
            };
            if !out.meets(other) {
                continue;
            }
            let allowed = in_place
                .iter()
                .any(|&(o, r)| out.name == Name::Arg(o) && other.name == Name::Arg(r));
            let exact = out.layout.is_some() && out.layout == other.layout;
            if !(allowed && exact) {
                return Err(conflict(out, other, allowed, exact));
            }
        }
    }
    Ok(())
}

/// The message names both arguments, the caller's tensor first: the pool's
/// memory is not the caller's to move.
fn conflict(out: &Operand, other: &Operand, allowed: bool, exact: bool) -> Error {
    let (lead, rest) = match (out.name, other.name) {
        (Name::Pool(_), Name::Arg(_)) => (other, out),
        _ => (out, other),
    };
    if let Name::Pool(_) = rest.name {
        let verb = match rest.access {
            Access::Read => "reads",
            Access::Write => "writes",
        };
        return err!(
            Overlap,
            "{}: overlaps {}, which this operation {verb}",
            lead.name,
            rest.name
        );
    }
    let detail = match (exact, allowed) {
        (true, _) => "exactly; in-place use is not supported by this operation",
        (false, true) => {
            "partially; in-place use must be exact: the same data, dtype, shape and strides"
        }
        (false, false) => "partially; exact in-place use is not supported by this operation",
    };
    err!(Overlap, "{}: overlaps {} ({detail})", lead.name, rest.name)
}
