//! The values a store holds: tensors, named tensors, tuples, opaque blobs.
//!
//! A record *is* a [`tensor_core::Value`] — the value type every cachex
//! backend returns — so a record read here reaches the facade, the Python
//! binding or the caller without a conversion. Segment-store holds values
//! one level deep: a dict, tuple or list whose members are tensors or
//! blobs (a deeper value is refused by the schema check with
//! [`crate::Error::SchemaMismatch`]).

use tensor_core::Value;

/// The shape of a record, as stored in `schema.json`'s `output_structure`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Structure {
    /// A single tensor.
    Tensor,
    /// Named tensors and blobs.
    Dict,
    /// A tuple of tensors and blobs.
    Tuple,
    /// A list of tensors and blobs.
    List,
    /// One opaque blob.
    Blob,
}

impl Structure {
    /// The structure of `record`.
    pub fn of(record: &Value) -> Structure {
        match record {
            Value::Tensor(_) => Structure::Tensor,
            Value::Dict(_) => Structure::Dict,
            Value::Tuple(_) => Structure::Tuple,
            Value::List(_) => Structure::List,
            Value::Blob(_) => Structure::Blob,
        }
    }

    /// The `output_structure` string.
    pub fn name(self) -> &'static str {
        match self {
            Structure::Tensor => "tensor",
            Structure::Dict => "dict",
            Structure::Tuple => "tuple",
            Structure::List => "list",
            Structure::Blob => "blob",
        }
    }

    /// Parses an `output_structure` string.
    pub fn from_name(s: &str) -> Option<Structure> {
        Some(match s {
            "tensor" => Structure::Tensor,
            "dict" => Structure::Dict,
            "tuple" => Structure::Tuple,
            "list" => Structure::List,
            "blob" => Structure::Blob,
            _ => return None,
        })
    }
}

/// The bytes of a part (a tensor's elements or a blob); `None` for a part
/// that is itself a dict, tuple or list (never stored).
pub(crate) fn part_bytes(part: &Value) -> Option<&[u8]> {
    match part {
        Value::Tensor(t) => Some(t.bytes()),
        Value::Blob(b) => Some(b.as_slice()),
        Value::Dict(_) | Value::Tuple(_) | Value::List(_) => None,
    }
}
