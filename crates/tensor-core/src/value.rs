//! The value every cachex backend returns: a tensor, named values, a tuple
//! or list, or opaque bytes — whose bytes may live in a memory-mapped file.

use std::fmt;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::{DType, Result, Shape, Tensor, TensorError, TensorView};

/// Whatever keeps a [`SharedBytes`]' memory alive: a mapped file, a
/// store's record, a heap buffer. Only dropped, never read through.
trait Owner: Send + Sync {}
impl<T: Send + Sync + ?Sized> Owner for T {}

/// Immutable bytes that share ownership of the memory they point into —
/// typically a slice of a memory-mapped cache file, kept mapped for as
/// long as any `SharedBytes` (or clone) refers to it.
///
/// Cloning and [`slice`](SharedBytes::slice) copy no bytes: they bump a
/// reference count.
#[derive(Clone)]
pub struct SharedBytes {
    ptr: NonNull<u8>,
    len: usize,
    owner: Arc<dyn Owner>,
}

// SAFETY: the pointer is only ever read through, as a shared `&[u8]`, and
// the memory it points at is owned by `owner`, which is `Send + Sync` and
// never mutated after construction (see `project`), so sharing or sending
// a `SharedBytes` across threads is as safe as sharing `&[u8]`.
unsafe impl Send for SharedBytes {}
// SAFETY: as for `Send`.
unsafe impl Sync for SharedBytes {}

impl SharedBytes {
    /// Bytes borrowed from `owner` by `project`, keeping `owner` alive.
    /// No allocation: the `Arc` is shared, not copied.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tensor_core::SharedBytes;
    ///
    /// let file = Arc::new(vec![1u8, 2, 3, 4]); // e.g. a memory map
    /// let tail = SharedBytes::project(file, |f| &f[2..]);
    /// assert_eq!(tail.as_slice(), &[3, 4]);
    /// ```
    pub fn project<O, F>(owner: Arc<O>, project: F) -> SharedBytes
    where
        O: Send + Sync + 'static,
        F: for<'a> FnOnce(&'a O) -> &'a [u8],
    {
        let bytes = project(&owner);
        let (ptr, len) = (bytes.as_ptr(), bytes.len());
        SharedBytes {
            // A slice's pointer is never null.
            ptr: NonNull::new(ptr.cast_mut()).unwrap_or(NonNull::dangling()),
            len,
            owner,
        }
    }

    /// [`project`](SharedBytes::project) with a projection that may fail
    /// (the owner is dropped with the error).
    pub fn try_project<O, E, F>(owner: Arc<O>, project: F) -> std::result::Result<SharedBytes, E>
    where
        O: Send + Sync + 'static,
        F: for<'a> FnOnce(&'a O) -> std::result::Result<&'a [u8], E>,
    {
        let bytes = project(&owner)?;
        let (ptr, len) = (bytes.as_ptr(), bytes.len());
        Ok(SharedBytes {
            // A slice's pointer is never null.
            ptr: NonNull::new(ptr.cast_mut()).unwrap_or(NonNull::dangling()),
            len,
            owner,
        })
    }

    /// Takes ownership of `owner` (a `Vec<u8>`, an Arrow buffer, a memory
    /// map) and shares its bytes.
    pub fn from_owner<O: AsRef<[u8]> + Send + Sync + 'static>(owner: O) -> SharedBytes {
        SharedBytes::project(Arc::new(owner), |o| o.as_ref())
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` was a live `&[u8]` borrowed from `*owner`
        // (see `project`); `owner` sits behind an `Arc` that we hold, so it
        // is neither moved nor dropped while `self` lives, and nothing
        // mutates it (we hand out only shared borrows; the projection's
        // lifetime tied the slice to a shared borrow of the owner, so safe
        // code cannot free or change that memory while the owner lives).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A sub-range, sharing the same owner, or `None` when `range` does not
    /// lie within the bytes.
    pub fn slice(&self, range: Range<usize>) -> Option<SharedBytes> {
        self.as_slice().get(range.clone())?;
        Some(SharedBytes {
            // In bounds (checked above), so neither null nor past the end.
            ptr: NonNull::new(self.ptr.as_ptr().wrapping_add(range.start))?,
            len: range.end - range.start,
            owner: Arc::clone(&self.owner),
        })
    }
}

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::ops::Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl PartialEq for SharedBytes {
    fn eq(&self, other: &SharedBytes) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for SharedBytes {}

impl fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedBytes({} bytes)", self.len)
    }
}

impl From<Vec<u8>> for SharedBytes {
    fn from(v: Vec<u8>) -> SharedBytes {
        SharedBytes::from_owner(v)
    }
}

impl From<&[u8]> for SharedBytes {
    fn from(v: &[u8]) -> SharedBytes {
        SharedBytes::from_owner(v.to_vec())
    }
}

/// A tensor over [`SharedBytes`]: an owned handle (no lifetime) whose
/// elements usually stay in the cache file they were read from.
/// [`view`](SharedTensor::view) borrows them without copying.
#[derive(Clone, PartialEq, Eq)]
pub struct SharedTensor {
    dtype: DType,
    shape: Shape,
    bytes: SharedBytes,
}

impl SharedTensor {
    /// A tensor over `bytes`, checked against `dtype` and `shape`.
    pub fn new(dtype: DType, shape: impl Into<Shape>, bytes: SharedBytes) -> Result<SharedTensor> {
        let shape = shape.into();
        let expected = shape.byte_len(dtype)?;
        if expected != bytes.len() {
            return Err(TensorError::ByteLength {
                dtype,
                shape,
                expected,
                actual: bytes.len(),
            });
        }
        Ok(SharedTensor {
            dtype,
            shape,
            bytes,
        })
    }

    /// A tensor whose bytes are `view`'s, borrowed from `owner` by
    /// `project` — the zero-copy way a store turns a view into its
    /// mapped file into an owned value: `project` must return the bytes of
    /// the view (it is checked against `dtype` and `shape` again).
    pub fn project<O, F>(owner: Arc<O>, dtype: DType, shape: Shape, project: F) -> Result<Self>
    where
        O: Send + Sync + 'static,
        F: for<'a> FnOnce(&'a O) -> &'a [u8],
    {
        SharedTensor::new(dtype, shape, SharedBytes::project(owner, project))
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

    /// The shared bytes (a cheap clone keeps them alive).
    pub fn shared_bytes(&self) -> &SharedBytes {
        &self.bytes
    }

    /// A zero-copy view.
    pub fn view(&self) -> TensorView<'_> {
        TensorView::from_checked(self.dtype, self.shape.clone(), self.bytes.as_slice())
    }

    /// The elements as a typed slice, without copying (see
    /// [`TensorView::as_slice`] for when it fails).
    pub fn as_slice<T: crate::Element>(&self) -> Result<&[T]> {
        self.view().as_slice()
    }

    /// An owned, 8-byte-aligned copy.
    pub fn to_tensor(&self) -> Tensor {
        self.view().to_tensor()
    }
}

impl fmt::Debug for SharedTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SharedTensor({} {}, {} bytes)",
            self.dtype,
            self.shape,
            self.bytes.len()
        )
    }
}

impl From<Tensor> for SharedTensor {
    /// Moves the tensor behind a shared owner (no copy of its bytes).
    fn from(t: Tensor) -> SharedTensor {
        let (dtype, shape) = (t.dtype(), t.shape().clone());
        SharedTensor {
            dtype,
            shape,
            bytes: SharedBytes::project(Arc::new(t), Tensor::bytes),
        }
    }
}

impl From<&TensorView<'_>> for SharedTensor {
    /// Copies the view's bytes into an aligned owned tensor.
    fn from(v: &TensorView<'_>) -> SharedTensor {
        SharedTensor::from(v.to_tensor())
    }
}

/// One cached value, whichever store it came from: a tensor, named values
/// (a dict), a tuple or list, or opaque bytes.
///
/// Values read from a store hold views into its files ([`SharedTensor`],
/// [`SharedBytes`]); a value keeps what it points into alive (a mapping,
/// a decoded record) and copies only on request
/// ([`SharedTensor::to_tensor`]). Cloning a value copies no bytes.
///
/// ```
/// use tensor_core::{Tensor, Value};
///
/// let v = Value::dict([
///     ("features", Value::from(Tensor::from_vec([2], vec![1.0f32, 2.0])?)),
///     ("label", Value::blob(b"cat".to_vec())),
/// ]);
/// assert_eq!(v.get("features").and_then(Value::as_tensor).unwrap().as_slice::<f32>()?, &[1.0, 2.0]);
/// assert_eq!(v.get("label").and_then(Value::as_blob), Some(&b"cat"[..]));
/// # Ok::<(), tensor_core::TensorError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// One tensor.
    Tensor(SharedTensor),
    /// Named values, in order. Names are shared (`Arc<str>`): values read
    /// from one cache point at one copy.
    Dict(Vec<(Arc<str>, Value)>),
    /// A tuple of values.
    Tuple(Vec<Value>),
    /// A list of values.
    List(Vec<Value>),
    /// Opaque bytes (a pickle, an encoded image, a string).
    Blob(SharedBytes),
}

impl Value {
    /// A dict from `(name, value)` pairs.
    pub fn dict<N: Into<Arc<str>>, V: Into<Value>>(
        items: impl IntoIterator<Item = (N, V)>,
    ) -> Value {
        Value::Dict(
            items
                .into_iter()
                .map(|(n, v)| (n.into(), v.into()))
                .collect(),
        )
    }

    /// A blob value.
    pub fn blob(bytes: impl Into<SharedBytes>) -> Value {
        Value::Blob(bytes.into())
    }

    /// What kind of value this is: `"tensor"`, `"dict"`, `"tuple"`,
    /// `"list"` or `"blob"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Tensor(_) => "tensor",
            Value::Dict(_) => "dict",
            Value::Tuple(_) => "tuple",
            Value::List(_) => "list",
            Value::Blob(_) => "blob",
        }
    }

    /// The tensor of a tensor value.
    pub fn as_tensor(&self) -> Option<&SharedTensor> {
        match self {
            Value::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// The bytes of a blob value.
    pub fn as_blob(&self) -> Option<&[u8]> {
        match self {
            Value::Blob(b) => Some(b.as_slice()),
            _ => None,
        }
    }

    /// The member `name` of a dict value.
    pub fn get(&self, name: &str) -> Option<&Value> {
        match self {
            Value::Dict(items) => items.iter().find(|(n, _)| &**n == name).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The members of a tuple or list value.
    pub fn items(&self) -> Option<&[Value]> {
        match self {
            Value::Tuple(items) | Value::List(items) => Some(items),
            _ => None,
        }
    }

    /// A copy that owns its bytes (tensors 8-byte aligned), so it no
    /// longer keeps a mapped file or a shared batch alive.
    pub fn detach(&self) -> Value {
        match self {
            Value::Tensor(t) => Value::Tensor(SharedTensor::from(t.to_tensor())),
            Value::Blob(b) => Value::Blob(SharedBytes::from(b.as_slice())),
            Value::Dict(items) => Value::Dict(
                items
                    .iter()
                    .map(|(n, v)| (Arc::clone(n), v.detach()))
                    .collect(),
            ),
            Value::Tuple(items) => Value::Tuple(items.iter().map(Value::detach).collect()),
            Value::List(items) => Value::List(items.iter().map(Value::detach).collect()),
        }
    }

    /// Tensor and blob bytes held, all members included.
    pub fn byte_len(&self) -> usize {
        match self {
            Value::Tensor(t) => t.bytes().len(),
            Value::Blob(b) => b.len(),
            Value::Dict(items) => items.iter().map(|(_, v)| v.byte_len()).sum(),
            Value::Tuple(items) | Value::List(items) => items.iter().map(Value::byte_len).sum(),
        }
    }
}

impl From<Tensor> for Value {
    fn from(t: Tensor) -> Value {
        Value::Tensor(t.into())
    }
}

impl From<SharedTensor> for Value {
    fn from(t: SharedTensor) -> Value {
        Value::Tensor(t)
    }
}

impl TryFrom<&Value> for Tensor {
    type Error = TensorError;

    /// An owned copy of a tensor value; any other kind is
    /// [`TensorError::NotATensor`].
    fn try_from(v: &Value) -> Result<Tensor> {
        v.as_tensor()
            .map(SharedTensor::to_tensor)
            .ok_or(TensorError::NotATensor(v.kind()))
    }
}
