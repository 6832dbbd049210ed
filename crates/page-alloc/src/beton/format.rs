//! The `.beton` on-disk format (version 2), written down once: constants,
//! field types and the metadata row layout.
//!
//! All integers little-endian, all offsets absolute:
//!
//! ```text
//! 0                    header: version u16 (=2), num_fields u16, page_size u32,
//!                              num_samples u64, alloc_table_ptr u64   (24 B)
//! 24                   field descriptors, 1041 B each: type_id u8,
//!                              name [u8; 16] (ASCII, NUL-padded), arguments [u8; 1024]
//! 24 + 1041 * fields   metadata table: num_samples rows of an aligned numpy
//!                              struct (see below)
//! data_start           pages of exactly page_size bytes; data_start is the
//!                              metadata end rounded up to page_size
//! alloc_table_ptr      allocation table to the end of the file: rows of
//!                              sample_id u64, ptr u64, size u64
//! ```
//!
//! Metadata per field type (type id): Float (0) `<f8`, Int (1) `<i8`,
//! NDArray (4) `<u8` ptr — all aligned to 8 in the row; Bytes (3) and JSON
//! (5) a packed `{ptr <u8, size <u8}`, RGBImage (2) a packed `{mode u1,
//! width <u2, height <u2, data_ptr <u8}` — packed structs have numpy
//! alignment 1, so they sit unpadded. The row size is rounded up to the
//! largest alignment. NDArray arguments: shape `[u64; 32]` (trailing zeros
//! dropped), type_length u64 at 256, then the JSON of `dtype.descr`
//! (`[["", "<f4"]]`). JSON values are stored as text plus a NUL byte.
//! Readers take an allocation's size from the allocation table (looked up
//! by pointer). A file whose writer crashed has `alloc_table_ptr = 0`.

use tensor_core::{DType, Shape, TensorView};

/// The `.beton` format version read and written.
pub const BETON_VERSION: u16 = 2;
/// Size of the `.beton` header.
pub const HEADER_LEN: usize = 24;
/// Size of one field descriptor.
pub const FIELD_DESC_LEN: usize = 1041;
/// Size of a field name in a descriptor.
pub const NAME_LEN: usize = 16;
/// Size of a descriptor's arguments.
pub const ARGS_LEN: usize = 1024;
/// Size of one allocation-table row.
pub const ALLOC_ROW_LEN: usize = 24;
/// FFCV's smallest page size (2 MiB).
pub const MIN_PAGE_SIZE: u64 = 1 << 21;
/// FFCV's default page size (8 MiB).
pub const DEFAULT_PAGE_SIZE: u64 = 1 << 23;
/// NDArray arguments: 32 shape slots then the type length.
pub(crate) const ND_MAX_DIMS: usize = 32;
pub(crate) const ND_TYPE_AT: usize = 8 * ND_MAX_DIMS + 8;

/// The type of a `.beton` field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BetonType {
    /// `FloatField` (type id 0): an `f64` in the metadata row.
    Float,
    /// `IntField` (type id 1): an `i64` in the metadata row.
    Int,
    /// `RGBImageField` (type id 2): raw or JPEG bytes, with mode/width/height.
    RgbImage,
    /// `BytesField` (type id 3).
    Bytes,
    /// `NDArrayField` (type id 4): a fixed dtype and shape.
    NDArray {
        /// Element type.
        dtype: DType,
        /// Shape.
        shape: Shape,
    },
    /// `JSONField` (type id 5): JSON text (stored with a NUL terminator).
    Json,
}

impl BetonType {
    /// FFCV's type id.
    pub fn type_id(&self) -> u8 {
        match self {
            BetonType::Float => 0,
            BetonType::Int => 1,
            BetonType::RgbImage => 2,
            BetonType::Bytes => 3,
            BetonType::NDArray { .. } => 4,
            BetonType::Json => 5,
        }
    }

    /// (size, numpy alignment) of the field's metadata.
    pub(crate) fn meta_layout(&self) -> (usize, usize) {
        match self {
            BetonType::Float | BetonType::Int | BetonType::NDArray { .. } => (8, 8),
            BetonType::Bytes | BetonType::Json => (16, 1),
            BetonType::RgbImage => (13, 1),
        }
    }

    pub(crate) fn element_size(&self) -> Option<u64> {
        match self {
            BetonType::NDArray { dtype, shape } => shape.byte_len(*dtype).ok().map(|n| n as u64),
            _ => None,
        }
    }
}

impl std::fmt::Display for BetonType {
    /// FFCV's field name in snake case; arrays with their dtype and shape
    /// (`ndarray float32 [3, 2]`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BetonType::Float => f.write_str("float"),
            BetonType::Int => f.write_str("int"),
            BetonType::RgbImage => f.write_str("rgb_image"),
            BetonType::Bytes => f.write_str("bytes"),
            BetonType::NDArray { dtype, shape } => write!(f, "ndarray {dtype} {shape}"),
            BetonType::Json => f.write_str("json"),
        }
    }
}

/// A named `.beton` field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BetonField {
    /// Name (ASCII, at most 16 bytes).
    pub name: String,
    /// Type.
    pub ty: BetonType,
}

impl BetonField {
    /// A field called `name` of type `ty`.
    pub fn new(name: impl Into<String>, ty: BetonType) -> BetonField {
        BetonField {
            name: name.into(),
            ty,
        }
    }
}

/// One field value of a `.beton` sample: read (borrowed from the file) or
/// to be written.
#[derive(Debug, Clone, PartialEq)]
pub enum BetonValue<'a> {
    /// Float field.
    Float(f64),
    /// Int field.
    Int(i64),
    /// Bytes field.
    Bytes(&'a [u8]),
    /// NDArray field.
    NDArray(TensorView<'a>),
    /// JSON field: the text, without FFCV's NUL terminator.
    Json(&'a str),
    /// RGBImage field: header and stored bytes (raw `h*w*3` pixels for mode
    /// 1, JPEG for mode 0); never decoded here.
    RgbImage {
        /// 0 JPEG, 1 raw.
        mode: u8,
        /// Width in pixels.
        width: u16,
        /// Height in pixels.
        height: u16,
        /// The stored bytes.
        data: &'a [u8],
    },
}

/// Row layout: offset of each field, and the row size.
pub(crate) fn row_layout(fields: &[BetonField]) -> (Vec<usize>, usize) {
    let mut at: usize = 0;
    let mut max_align: usize = 1;
    let offsets = fields
        .iter()
        .map(|f| {
            let (size, align) = f.ty.meta_layout();
            at = at.div_ceil(align) * align;
            let here = at;
            at += size;
            max_align = max_align.max(align);
            here
        })
        .collect();
    (offsets, at.div_ceil(max_align) * max_align)
}
