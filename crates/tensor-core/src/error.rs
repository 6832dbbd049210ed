//! The crate's one error type.

use crate::{DType, Shape};

/// Everything that can go wrong building or reading a tensor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TensorError {
    /// The byte buffer does not hold exactly `product(shape) * dtype.size()` bytes.
    #[error("{dtype} tensor of shape {shape} needs {expected} bytes, got {actual}")]
    ByteLength {
        /// Element type of the tensor.
        dtype: DType,
        /// Shape of the tensor.
        shape: Shape,
        /// Bytes the shape and dtype call for.
        expected: usize,
        /// Bytes that were supplied.
        actual: usize,
    },
    /// The number of elements or bytes of a shape overflows `usize`.
    #[error("shape {shape} of {dtype} overflows the address space")]
    ShapeOverflow {
        /// Element type of the tensor.
        dtype: DType,
        /// The offending shape.
        shape: Shape,
    },
    /// Typed access asked for another element type than the tensor holds.
    #[error("tensor holds {actual}, asked for {expected}")]
    DTypeMismatch {
        /// The dtype the caller asked for.
        expected: DType,
        /// The dtype the tensor holds.
        actual: DType,
    },
    /// The bytes are not aligned for typed access to this dtype.
    #[error("{dtype} data at address {address:#x} is not aligned to {align} bytes")]
    Misaligned {
        /// Element type asked for.
        dtype: DType,
        /// Start address of the bytes.
        address: usize,
        /// Alignment the dtype needs.
        align: usize,
    },
    /// A bool tensor holds a byte other than 0 or 1.
    #[error("bool element {index} holds byte {byte:#04x}, not 0 or 1")]
    InvalidBool {
        /// Flat index of the element.
        index: usize,
        /// The byte found there.
        byte: u8,
    },
    /// A dtype name or numpy dtype string was not recognised.
    #[error("unknown dtype {0:?}")]
    UnknownDType(String),
    /// A value of another kind was asked for as a tensor.
    #[error("a {0} value is not a tensor")]
    NotATensor(&'static str),
    /// The dtype has no numpy equivalent (bfloat16).
    #[error("{0} has no numpy dtype string (numpy has no bfloat16)")]
    NoNumpyDType(DType),
}

/// Result alias for this crate.
pub type Result<T, E = TensorError> = std::result::Result<T, E>;
