//! The values a store holds: tensors, named tensors, tuples, opaque blobs.

use std::sync::Arc;

use arrow_buffer::{Buffer, MutableBuffer};
use tensor_core::{DType, Shape, Tensor, TensorView};

use crate::{Error, Result};

/// A tensor whose bytes live in a reference-counted buffer: a slice of a
/// memory-mapped segment when read from disk, a heap copy when put.
///
/// [`TensorBuf::view`] borrows the bytes without copying;
/// [`TensorBuf::to_tensor`] makes an owned, aligned copy.
#[derive(Clone, PartialEq, Eq)]
pub struct TensorBuf {
    dtype: DType,
    shape: Shape,
    bytes: Buffer,
}

impl TensorBuf {
    /// A tensor over `bytes`, checked against `dtype` and `shape`.
    pub fn new(dtype: DType, shape: impl Into<Shape>, bytes: Buffer) -> Result<TensorBuf> {
        let shape = shape.into();
        TensorView::new(dtype, shape.clone(), bytes.as_slice())
            .map_err(|e| Error::InvalidInput(e.to_string()))?;
        Ok(TensorBuf {
            dtype,
            shape,
            bytes,
        })
    }

    /// Builds without the length check; callers have checked it.
    pub(crate) fn from_checked(dtype: DType, shape: Shape, bytes: Buffer) -> TensorBuf {
        TensorBuf {
            dtype,
            shape,
            bytes,
        }
    }

    /// A copy of an owned or borrowed tensor.
    pub fn copy_from(view: &TensorView<'_>) -> TensorBuf {
        TensorBuf {
            dtype: view.dtype(),
            shape: view.shape().clone(),
            bytes: aligned_copy(view.bytes()),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The raw little-endian bytes.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// A zero-copy view (of the mapped segment, for a tensor read from disk).
    pub fn view(&self) -> TensorView<'_> {
        // The length was checked against dtype and shape when built.
        match TensorView::new(self.dtype, self.shape.clone(), self.bytes.as_slice()) {
            Ok(v) => v,
            Err(e) => unreachable!("TensorBuf invariant broken: {e}"),
        }
    }

    /// An owned, 8-byte-aligned copy.
    pub fn to_tensor(&self) -> Tensor {
        self.view().to_tensor()
    }

    fn detach(&self) -> TensorBuf {
        TensorBuf {
            dtype: self.dtype,
            shape: self.shape.clone(),
            bytes: aligned_copy(self.bytes.as_slice()),
        }
    }
}

impl std::fmt::Debug for TensorBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TensorBuf({} {}, {} bytes)",
            self.dtype,
            self.shape,
            self.bytes.len()
        )
    }
}

impl From<Tensor> for TensorBuf {
    fn from(t: Tensor) -> TensorBuf {
        TensorBuf::copy_from(&t.view())
    }
}

impl From<&Tensor> for TensorBuf {
    fn from(t: &Tensor) -> TensorBuf {
        TensorBuf::copy_from(&t.view())
    }
}

impl From<TensorView<'_>> for TensorBuf {
    fn from(t: TensorView<'_>) -> TensorBuf {
        TensorBuf::copy_from(&t)
    }
}

/// Opaque bytes (for torchcachex caches: a Python pickle).
#[derive(Clone, PartialEq, Eq)]
pub struct Blob(Buffer);

impl Blob {
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_slice()
    }

    pub(crate) fn from_buffer(b: Buffer) -> Blob {
        Blob(b)
    }
}

impl std::fmt::Debug for Blob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Blob({} bytes)", self.0.len())
    }
}

impl From<Vec<u8>> for Blob {
    fn from(v: Vec<u8>) -> Blob {
        Blob(Buffer::from_vec(v))
    }
}

impl From<&[u8]> for Blob {
    fn from(v: &[u8]) -> Blob {
        Blob(aligned_copy(v))
    }
}

/// One member of a dict, tuple or list record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// A tensor.
    Tensor(TensorBuf),
    /// Opaque bytes.
    Blob(Blob),
}

impl Part {
    /// Bytes held (tensor data or blob length).
    pub fn byte_len(&self) -> usize {
        self.bytes().len()
    }

    /// The part's raw bytes (a tensor's elements, or the blob).
    pub fn bytes(&self) -> &[u8] {
        match self {
            Part::Tensor(t) => t.bytes(),
            Part::Blob(b) => b.as_bytes(),
        }
    }

    /// The tensor, if this part is one.
    pub fn as_tensor(&self) -> Option<&TensorBuf> {
        match self {
            Part::Tensor(t) => Some(t),
            Part::Blob(_) => None,
        }
    }

    /// The blob bytes, if this part is one.
    pub fn as_blob(&self) -> Option<&[u8]> {
        match self {
            Part::Tensor(_) => None,
            Part::Blob(b) => Some(b.as_bytes()),
        }
    }

    fn detach(&self) -> Part {
        match self {
            Part::Tensor(t) => Part::Tensor(t.detach()),
            Part::Blob(b) => Part::Blob(Blob(aligned_copy(b.as_bytes()))),
        }
    }
}

impl From<Tensor> for Part {
    fn from(t: Tensor) -> Part {
        Part::Tensor(t.into())
    }
}

impl From<TensorBuf> for Part {
    fn from(t: TensorBuf) -> Part {
        Part::Tensor(t)
    }
}

impl From<Blob> for Part {
    fn from(b: Blob) -> Part {
        Part::Blob(b)
    }
}

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

/// One cached value.
///
/// Records read from a store hold their tensors as slices of the
/// memory-mapped segment: [`TensorBuf::view`] gives a
/// [`TensorView`] without copying, and the mapping stays alive while any
/// record (or clone) refers to it. [`Record::detach`] copies everything to
/// the heap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A single tensor.
    Tensor(TensorBuf),
    /// Named tensors and blobs, in schema order. The names are shared
    /// (`Arc<str>`): records read from one segment point at one copy.
    Dict(Vec<(Arc<str>, Part)>),
    /// A tuple of tensors and blobs.
    Tuple(Vec<Part>),
    /// A list of tensors and blobs.
    List(Vec<Part>),
    /// One opaque blob.
    Blob(Blob),
}

impl Record {
    /// A dict record from `(name, part)` pairs.
    pub fn dict<N: Into<Arc<str>>, P: Into<Part>>(
        parts: impl IntoIterator<Item = (N, P)>,
    ) -> Record {
        Record::Dict(
            parts
                .into_iter()
                .map(|(n, p)| (n.into(), p.into()))
                .collect(),
        )
    }

    /// A blob record.
    pub fn blob(bytes: impl Into<Blob>) -> Record {
        Record::Blob(bytes.into())
    }

    /// Which structure the record has.
    pub fn structure(&self) -> Structure {
        match self {
            Record::Tensor(_) => Structure::Tensor,
            Record::Dict(_) => Structure::Dict,
            Record::Tuple(_) => Structure::Tuple,
            Record::List(_) => Structure::List,
            Record::Blob(_) => Structure::Blob,
        }
    }

    /// The single tensor of a tensor record.
    pub fn as_tensor(&self) -> Option<&TensorBuf> {
        match self {
            Record::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// The part named `name` of a dict record.
    pub fn get(&self, name: &str) -> Option<&Part> {
        match self {
            Record::Dict(parts) => parts.iter().find(|(n, _)| &**n == name).map(|(_, p)| p),
            _ => None,
        }
    }

    /// The parts of a tuple or list record.
    pub fn items(&self) -> Option<&[Part]> {
        match self {
            Record::Tuple(p) | Record::List(p) => Some(p),
            _ => None,
        }
    }

    /// Tensor and blob bytes held (what the LRU budget counts).
    pub fn byte_len(&self) -> usize {
        match self {
            Record::Tensor(t) => t.bytes().len(),
            Record::Blob(b) => b.as_bytes().len(),
            Record::Dict(p) => p.iter().map(|(n, p)| n.len() + p.byte_len()).sum(),
            Record::Tuple(p) | Record::List(p) => p.iter().map(Part::byte_len).sum(),
        }
    }

    /// A copy that owns its bytes, so it no longer keeps a segment mapped.
    pub fn detach(&self) -> Record {
        match self {
            Record::Tensor(t) => Record::Tensor(t.detach()),
            Record::Blob(b) => Record::Blob(Blob(aligned_copy(b.as_bytes()))),
            Record::Dict(p) => {
                Record::Dict(p.iter().map(|(n, p)| (n.clone(), p.detach())).collect())
            }
            Record::Tuple(p) => Record::Tuple(p.iter().map(Part::detach).collect()),
            Record::List(p) => Record::List(p.iter().map(Part::detach).collect()),
        }
    }
}

impl From<Tensor> for Record {
    fn from(t: Tensor) -> Record {
        Record::Tensor(t.into())
    }
}

impl From<TensorBuf> for Record {
    fn from(t: TensorBuf) -> Record {
        Record::Tensor(t)
    }
}

/// A 64-byte-aligned heap copy (arrow's allocation), so typed access works.
pub(crate) fn aligned_copy(bytes: &[u8]) -> Buffer {
    let mut m = MutableBuffer::new(bytes.len());
    m.extend_from_slice(bytes);
    m.into()
}
