//! Element types and their names in Rust, numpy and torch.

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

use crate::{Result, TensorError};

/// The element type of a tensor. Every store keeps values little-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "&'static str", try_from = "String")]
pub enum DType {
    /// `bool`, one byte holding 0 or 1.
    Bool,
    /// `u8`.
    U8,
    /// `i8`.
    I8,
    /// `u16`.
    U16,
    /// `i16`.
    I16,
    /// `u32`.
    U32,
    /// `i32`.
    I32,
    /// `u64`.
    U64,
    /// `i64`.
    I64,
    /// IEEE half precision (`half::f16`).
    F16,
    /// bfloat16 (`half::bf16`); numpy has no equivalent.
    BF16,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
}

/// One row per dtype: (dtype, size, name, numpy string, torch name).
const TABLE: [(DType, usize, &str, Option<&str>, &str); 13] = [
    (DType::Bool, 1, "bool", Some("|b1"), "torch.bool"),
    (DType::U8, 1, "uint8", Some("|u1"), "torch.uint8"),
    (DType::I8, 1, "int8", Some("|i1"), "torch.int8"),
    (DType::U16, 2, "uint16", Some("<u2"), "torch.uint16"),
    (DType::I16, 2, "int16", Some("<i2"), "torch.int16"),
    (DType::U32, 4, "uint32", Some("<u4"), "torch.uint32"),
    (DType::I32, 4, "int32", Some("<i4"), "torch.int32"),
    (DType::U64, 8, "uint64", Some("<u8"), "torch.uint64"),
    (DType::I64, 8, "int64", Some("<i8"), "torch.int64"),
    (DType::F16, 2, "float16", Some("<f2"), "torch.float16"),
    (DType::BF16, 2, "bfloat16", None, "torch.bfloat16"),
    (DType::F32, 4, "float32", Some("<f4"), "torch.float32"),
    (DType::F64, 8, "float64", Some("<f8"), "torch.float64"),
];

impl DType {
    /// Every dtype, in a fixed order.
    pub const ALL: [DType; 13] = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::U32,
        DType::I32,
        DType::U64,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];

    fn row(
        self,
    ) -> &'static (
        DType,
        usize,
        &'static str,
        Option<&'static str>,
        &'static str,
    ) {
        // TABLE is in declaration order, so the discriminant indexes it.
        &TABLE[self as usize]
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        self.row().1
    }

    /// Alignment typed access needs (equal to the size for every dtype).
    pub fn align(self) -> usize {
        self.size()
    }

    /// The canonical name: `"float32"`, `"bfloat16"`, `"bool"`, ...
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// The numpy dtype string (`"<f4"`, `"<i2"`, `"|b1"`), or an error for
    /// bfloat16, which numpy lacks.
    pub fn numpy_str(self) -> Result<&'static str> {
        self.row().3.ok_or(TensorError::NoNumpyDType(self))
    }

    /// The torch name, e.g. `"torch.float32"`.
    pub fn torch_name(self) -> &'static str {
        self.row().4
    }

    /// Whether the dtype is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// Parses a canonical name (`"float32"`) or a short alias (`"f32"`, `"half"`).
    pub fn from_name(name: &str) -> Result<DType> {
        let found = TABLE.iter().find(|row| row.2 == name).map(|row| row.0);
        found
            .or(match name {
                "f16" | "half" | "halffloat" => Some(DType::F16),
                "bf16" => Some(DType::BF16),
                "f32" | "float" => Some(DType::F32),
                "f64" | "double" => Some(DType::F64),
                "u8" => Some(DType::U8),
                "i8" => Some(DType::I8),
                "u16" => Some(DType::U16),
                "i16" => Some(DType::I16),
                "u32" => Some(DType::U32),
                "i32" => Some(DType::I32),
                "u64" => Some(DType::U64),
                "i64" => Some(DType::I64),
                _ => None,
            })
            .ok_or_else(|| TensorError::UnknownDType(name.to_owned()))
    }

    /// Parses a numpy dtype string: `"<f4"`, `"=i8"`, `"|b1"`, `"f4"`, `"?"`.
    ///
    /// Big-endian multi-byte strings (`">f4"`) are refused: every store
    /// keeps little-endian bytes.
    pub fn from_numpy_str(s: &str) -> Result<DType> {
        let unknown = || TensorError::UnknownDType(s.to_owned());
        if s == "?" {
            return Ok(DType::Bool);
        }
        let (order, code) = match s.as_bytes().first() {
            Some(b'<' | b'>' | b'|' | b'=') => (s.as_bytes()[0], &s[1..]),
            _ => (b'=', s),
        };
        let dtype = TABLE
            .iter()
            .find(|row| row.3.is_some_and(|np| &np[1..] == code))
            .map(|row| row.0)
            .ok_or_else(unknown)?;
        if order == b'>' && dtype.size() > 1 {
            return Err(unknown());
        }
        Ok(dtype)
    }

    /// Parses a torch name (`"torch.float32"`, `"torch.half"`, `"torch.long"` ...).
    pub fn from_torch_name(name: &str) -> Result<DType> {
        let found = TABLE.iter().find(|row| row.4 == name).map(|row| row.0);
        found
            .or(match name {
                "torch.half" => Some(DType::F16),
                "torch.float" => Some(DType::F32),
                "torch.double" => Some(DType::F64),
                "torch.short" => Some(DType::I16),
                "torch.int" => Some(DType::I32),
                "torch.long" => Some(DType::I64),
                _ => None,
            })
            .ok_or_else(|| TensorError::UnknownDType(name.to_owned()))
    }

    /// The dtype of a Rust element type.
    pub fn of<T: Element>() -> DType {
        T::DTYPE
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = TensorError;
    fn from_str(s: &str) -> Result<DType> {
        DType::from_name(s).or_else(|_| DType::from_numpy_str(s))
    }
}

impl From<DType> for &'static str {
    fn from(d: DType) -> &'static str {
        d.name()
    }
}

impl TryFrom<String> for DType {
    type Error = TensorError;
    fn try_from(s: String) -> Result<DType> {
        DType::from_name(&s)
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that is the element of one [`DType`].
///
/// # Safety
/// Implementors are plain old data of exactly `DTYPE.size()` bytes with no
/// padding, and every bit pattern accepted by [`Element::check`] is a
/// valid value. The trait is sealed: only this crate implements it.
pub unsafe trait Element: Copy + Send + Sync + 'static + sealed::Sealed {
    /// The dtype this type stands for.
    const DTYPE: DType;
    /// Checks that raw bytes are valid values of this type; `Err(i)` names
    /// the first invalid element.
    fn check(_bytes: &[u8]) -> std::result::Result<(), usize> {
        Ok(())
    }
    /// The element as `f64` (exact for all but 64-bit integers above 2^53).
    fn to_f64(self) -> f64;
}

macro_rules! element {
    ($($t:ty => $d:ident, $conv:expr;)*) => {$(
        impl sealed::Sealed for $t {}
        // SAFETY: a primitive numeric type of the dtype's size, no padding,
        // every bit pattern valid.
        unsafe impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn to_f64(self) -> f64 {
                let conv: fn($t) -> f64 = $conv;
                conv(self)
            }
        }
    )*};
}

element! {
    u8 => U8, f64::from;
    i8 => I8, f64::from;
    u16 => U16, f64::from;
    i16 => I16, f64::from;
    u32 => U32, f64::from;
    i32 => I32, f64::from;
    u64 => U64, |v| v as f64;
    i64 => I64, |v| v as f64;
    f16 => F16, f64::from;
    bf16 => BF16, f64::from;
    f32 => F32, f64::from;
    f64 => F64, |v| v;
}

impl sealed::Sealed for bool {}
// SAFETY: bool is one byte; `check` rejects every byte other than 0 and 1,
// the only valid bool bit patterns.
unsafe impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn check(bytes: &[u8]) -> std::result::Result<(), usize> {
        match bytes.iter().position(|&b| b > 1) {
            Some(i) => Err(i),
            None => Ok(()),
        }
    }
    fn to_f64(self) -> f64 {
        f64::from(u8::from(self))
    }
}
