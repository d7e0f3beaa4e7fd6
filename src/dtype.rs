//! Element types of tensor arguments.

use crate::error::{err, Error};
use crate::fp8::Fp8Format;

/// Element type of a tensor argument. Values are part of the C ABI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    Bf16,
    F16,
    F32,
    I32,
    I64,
    U8,
    /// FP8 codes (one byte each); the variant names the flavour.
    Fp8E4m3fn,
    Fp8E4m3fnuz,
}

impl DType {
    pub const ALL: [DType; 8] = [
        DType::Bf16,
        DType::F16,
        DType::F32,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::Fp8E4m3fn,
        DType::Fp8E4m3fnuz,
    ];

    pub fn size_bytes(self) -> usize {
        match self {
            DType::Bf16 | DType::F16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::I64 => 8,
            DType::U8 | DType::Fp8E4m3fn | DType::Fp8E4m3fnuz => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::Fp8E4m3fn => "fp8_e4m3fn",
            DType::Fp8E4m3fnuz => "fp8_e4m3fnuz",
        }
    }

    /// The FP8 flavour of an FP8 dtype, None for every other dtype.
    pub fn fp8_format(self) -> Option<Fp8Format> {
        match self {
            DType::Fp8E4m3fn => Some(Fp8Format::E4m3Fn),
            DType::Fp8E4m3fnuz => Some(Fp8Format::E4m3Fnuz),
            _ => None,
        }
    }

    /// The C ABI value (`UNIKV_DTYPE_*`).
    pub const fn to_raw(self) -> u32 {
        self as u32 + 1
    }

    /// Checked conversion from the C ABI value; 0 is deliberately not a dtype so a
    /// zero-initialised descriptor is rejected.
    pub fn from_raw(arg: &str, raw: u32) -> Result<Self, Error> {
        DType::ALL
            .iter()
            .copied()
            .find(|d| d.to_raw() == raw)
            .ok_or_else(|| err!(BadEnum, "{arg}.dtype: unknown dtype value {raw}"))
    }
}
