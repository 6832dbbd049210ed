//! The field schema of a page file: which fields every sample has.

use std::path::Path;

use tensor_core::{DType, Shape};

use crate::{Error, Result};

/// Most fields a schema may have.
pub const MAX_FIELDS: usize = 256;
/// Longest field name, in bytes.
pub const MAX_NAME_LEN: usize = 40;
/// Most dimensions of an array field.
pub const MAX_DIMS: usize = 6;

/// The type of one field of every sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldType {
    /// A signed 64-bit integer, stored inline in the metadata table.
    Int,
    /// A 64-bit float, stored inline in the metadata table.
    Float,
    /// A byte string of any length (0 included), stored in a page.
    Bytes,
    /// A fixed-shape little-endian tensor, stored in a page; every sample's
    /// value has exactly `shape.numel() * dtype.size()` bytes.
    Array {
        /// Element type.
        dtype: DType,
        /// Shape (at most 6 dimensions).
        shape: Shape,
    },
}

impl FieldType {
    /// Whether the value lives in the metadata row (no page allocation).
    pub fn is_inline(&self) -> bool {
        matches!(self, FieldType::Int | FieldType::Float)
    }

    /// Bytes the field takes in a metadata row: 8 inline, 16 for `(ptr, size)`.
    pub(crate) fn meta_len(&self) -> usize {
        if self.is_inline() { 8 } else { 16 }
    }

    /// The exact byte size every value must have, for arrays.
    pub(crate) fn fixed_size(&self) -> Option<u64> {
        match self {
            FieldType::Array { dtype, shape } => shape.byte_len(*dtype).ok().map(|n| n as u64),
            _ => None,
        }
    }

    pub(crate) fn kind_name(&self) -> &'static str {
        match self {
            FieldType::Int => "int",
            FieldType::Float => "float",
            FieldType::Bytes => "bytes",
            FieldType::Array { .. } => "array",
        }
    }
}

/// One named field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The field's name (1 to 40 bytes of UTF-8, unique in the schema).
    pub name: String,
    /// Its type.
    pub ty: FieldType,
}

/// The ordered fields every sample of a file has.
///
/// ```
/// use page_alloc::{FieldType, Schema};
/// use tensor_core::DType;
/// let schema = Schema::new()
///     .int("label")
///     .bytes("jpeg")
///     .array("embedding", DType::F32, [4]);
/// assert_eq!(schema.index_of("jpeg"), Some(1));
/// assert_eq!(schema.fields()[0].ty, FieldType::Int);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Schema {
    fields: Vec<Field>,
}

impl Schema {
    /// An empty schema; add fields with the builder methods.
    pub fn new() -> Schema {
        Schema::default()
    }

    /// A schema from a list of fields.
    pub fn from_fields(fields: Vec<Field>) -> Schema {
        Schema { fields }
    }

    /// Adds a field of any type.
    pub fn field(mut self, name: impl Into<String>, ty: FieldType) -> Schema {
        self.fields.push(Field {
            name: name.into(),
            ty,
        });
        self
    }

    /// Adds an inline `i64` field.
    pub fn int(self, name: impl Into<String>) -> Schema {
        self.field(name, FieldType::Int)
    }

    /// Adds an inline `f64` field.
    pub fn float(self, name: impl Into<String>) -> Schema {
        self.field(name, FieldType::Float)
    }

    /// Adds a variable-size byte field.
    pub fn bytes(self, name: impl Into<String>) -> Schema {
        self.field(name, FieldType::Bytes)
    }

    /// Adds a fixed-shape tensor field.
    pub fn array(self, name: impl Into<String>, dtype: DType, shape: impl Into<Shape>) -> Schema {
        self.field(
            name,
            FieldType::Array {
                dtype,
                shape: shape.into(),
            },
        )
    }

    /// The fields, in order.
    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// Number of fields.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// Whether the schema has no field.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// Position of the field called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|f| f.name == name)
    }

    /// Bytes of one metadata row.
    pub(crate) fn row_len(&self) -> usize {
        self.fields.iter().map(|f| f.ty.meta_len()).sum()
    }

    /// Offset of each field inside a metadata row.
    pub(crate) fn row_offsets(&self) -> Vec<usize> {
        let mut at = 0;
        self.fields
            .iter()
            .map(|f| {
                let here = at;
                at += f.ty.meta_len();
                here
            })
            .collect()
    }

    /// Checks the limits the on-disk format imposes.
    pub(crate) fn validate(&self, path: &Path) -> Result<()> {
        let bad = |reason: String| Err(Error::invalid(path, "schema", reason));
        // A sample must take room in the metadata table, or a sample count
        // read from disk would not be bounded by the file's size.
        if self.fields.is_empty() {
            return bad("a schema needs at least one field".into());
        }
        if self.fields.len() > MAX_FIELDS {
            return bad(format!(
                "{} fields, at most {MAX_FIELDS} allowed",
                self.fields.len()
            ));
        }
        for (i, f) in self.fields.iter().enumerate() {
            if f.name.is_empty() || f.name.len() > MAX_NAME_LEN {
                return bad(format!(
                    "field {i}: name {:?} must have 1 to {MAX_NAME_LEN} bytes",
                    f.name
                ));
            }
            if self.fields[..i].iter().any(|g| g.name == f.name) {
                return bad(format!("field name {:?} appears twice", f.name));
            }
            if let FieldType::Array { dtype, shape } = &f.ty {
                if shape.rank() > MAX_DIMS {
                    return bad(format!(
                        "field {:?}: {} dimensions, at most {MAX_DIMS}",
                        f.name,
                        shape.rank()
                    ));
                }
                if shape.byte_len(*dtype).is_err() {
                    return bad(format!("field {:?}: shape {shape} overflows", f.name));
                }
            }
        }
        Ok(())
    }
}
