//! The element types ferrofeed hands out.

use std::fmt;
use std::str::FromStr;

use super::ffi::{DLDataType, DLDataTypeCode};
use super::DlpackError;

/// An element type of a [`crate::staging::Tensor`].
///
/// These are the types a data loader produces: `uint8` images, `float32`,
/// `float16` and `bfloat16` normalized batches, `int32` and `int64` labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// 8-bit unsigned integer.
    U8,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// IEEE 754 half precision.
    F16,
    /// bfloat16 (`kDLBfloat`, 16 bits).
    BF16,
    /// IEEE 754 single precision.
    F32,
}

impl DType {
    /// Every supported type, in a stable order.
    pub const ALL: [DType; 6] = [
        DType::U8,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
    ];

    /// Size of one element in bytes.
    pub const fn itemsize(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 => 8,
        }
    }

    /// The name used by `NumPy`, PyTorch and JAX (`"uint8"`, `"bfloat16"`...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::U8 => "uint8",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
        }
    }

    /// The `DLPack` encoding (one lane).
    pub const fn to_dlpack(self) -> DLDataType {
        let (code, bits) = match self {
            DType::U8 => (DLDataTypeCode::UINT, 8),
            DType::I32 => (DLDataTypeCode::INT, 32),
            DType::I64 => (DLDataTypeCode::INT, 64),
            DType::F16 => (DLDataTypeCode::FLOAT, 16),
            DType::BF16 => (DLDataTypeCode::BFLOAT, 16),
            DType::F32 => (DLDataTypeCode::FLOAT, 32),
        };
        DLDataType {
            code,
            bits,
            lanes: 1,
        }
    }

    /// The type a `DLPack` encoding stands for, if ferrofeed supports it.
    pub fn from_dlpack(dt: DLDataType) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.to_dlpack() == dt)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = DlpackError;

    /// Parses a name as [`DType::name`] gives it (also `"u8"`, `"f32"`, ...,
    /// and `"bf16"`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "uint8" | "u8" => DType::U8,
            "int32" | "i32" => DType::I32,
            "int64" | "i64" => DType::I64,
            "float16" | "f16" | "half" => DType::F16,
            "bfloat16" | "bf16" => DType::BF16,
            "float32" | "f32" | "float" => DType::F32,
            _ => return Err(DlpackError::UnsupportedDType(s.to_owned())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
            assert_eq!(DType::from_dlpack(d.to_dlpack()), Some(d));
            assert_eq!(usize::from(d.to_dlpack().bits), d.itemsize() * 8);
        }
        assert!("complex64".parse::<DType>().is_err());
    }

    #[test]
    fn bfloat16_has_its_own_code() {
        assert_eq!(DType::BF16.to_dlpack().code, DLDataTypeCode::BFLOAT);
        assert_ne!(DType::BF16.to_dlpack(), DType::F16.to_dlpack());
    }
}
