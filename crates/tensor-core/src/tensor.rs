//! Borrowed and owned tensors over little-endian bytes.

use std::fmt;

use half::{bf16, f16};

use crate::{DType, Element, Result, Shape, TensorError};

/// A borrowed tensor: dtype, shape and C-order little-endian bytes, for
/// example a view into a memory-mapped file. Building one checks that the
/// byte length is exactly `product(shape) * dtype.size()`.
#[derive(Clone, PartialEq, Eq)]
pub struct TensorView<'a> {
    dtype: DType,
    shape: Shape,
    bytes: &'a [u8],
}

impl<'a> TensorView<'a> {
    /// A view over `bytes`, checked against `dtype` and `shape`.
    pub fn new(dtype: DType, shape: impl Into<Shape>, bytes: &'a [u8]) -> Result<Self> {
        let shape = shape.into();
        check_len(dtype, &shape, bytes.len())?;
        Ok(TensorView {
            dtype,
            shape,
            bytes,
        })
    }

    /// A view whose length the caller has already checked.
    pub(crate) fn from_checked(dtype: DType, shape: Shape, bytes: &'a [u8]) -> Self {
        debug_assert_eq!(shape.byte_len(dtype).ok(), Some(bytes.len()));
        TensorView {
            dtype,
            shape,
            bytes,
        }
    }

    /// A view over a typed slice.
    pub fn from_slice<T: Element>(shape: impl Into<Shape>, data: &'a [T]) -> Result<Self> {
        TensorView::new(T::DTYPE, shape, as_bytes(data))
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The raw little-endian bytes, borrowed for the view's whole lifetime.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.bytes.len() / self.dtype.size()
    }

    /// The elements as a typed slice, without copying. Fails when `T` is not
    /// the tensor's dtype, when the bytes are not aligned for `T`, or (for
    /// bool) when a byte is neither 0 nor 1.
    pub fn as_slice<T: Element>(&self) -> Result<&'a [T]> {
        cast_slice(self.dtype, self.bytes)
    }

    /// Every element converted to `f64`, whatever the dtype and alignment
    /// (64-bit integers above 2^53 round).
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        fn conv<const N: usize>(bytes: &[u8], f: impl Fn([u8; N]) -> f64) -> Vec<f64> {
            bytes
                .chunks_exact(N)
                .map(|c| {
                    let mut a = [0u8; N];
                    a.copy_from_slice(c);
                    f(a)
                })
                .collect()
        }
        let b = self.bytes;
        Ok(match self.dtype {
            DType::Bool => {
                bool::check(b).map_err(|index| TensorError::InvalidBool {
                    index,
                    byte: b[index],
                })?;
                b.iter().map(|&v| f64::from(v)).collect()
            }
            DType::U8 => b.iter().map(|&v| f64::from(v)).collect(),
            DType::I8 => b.iter().map(|&v| f64::from(v as i8)).collect(),
            DType::U16 => conv(b, |a| f64::from(u16::from_le_bytes(a))),
            DType::I16 => conv(b, |a| f64::from(i16::from_le_bytes(a))),
            DType::U32 => conv(b, |a| f64::from(u32::from_le_bytes(a))),
            DType::I32 => conv(b, |a| f64::from(i32::from_le_bytes(a))),
            DType::U64 => conv(b, |a| u64::from_le_bytes(a) as f64),
            DType::I64 => conv(b, |a| i64::from_le_bytes(a) as f64),
            DType::F16 => conv(b, |a| f64::from(f16::from_le_bytes(a))),
            DType::BF16 => conv(b, |a| f64::from(bf16::from_le_bytes(a))),
            DType::F32 => conv(b, |a| f64::from(f32::from_le_bytes(a))),
            DType::F64 => conv(b, f64::from_le_bytes),
        })
    }

    /// An owned copy.
    pub fn to_tensor(&self) -> Tensor {
        Tensor {
            dtype: self.dtype,
            shape: self.shape.clone(),
            data: AlignedBytes::copy_from(self.bytes),
        }
    }

    /// A zero-copy `ndarray` view. Fails like [`TensorView::as_slice`].
    #[cfg(feature = "ndarray")]
    pub fn to_ndarray<T: Element>(&self) -> Result<ndarray::ArrayViewD<'a, T>> {
        let slice = self.as_slice::<T>()?;
        // The length was checked against the shape when the view was built.
        ndarray::ArrayViewD::from_shape(ndarray::IxDyn(self.shape.dims()), slice).map_err(|_| {
            TensorError::ShapeOverflow {
                dtype: self.dtype,
                shape: self.shape.clone(),
            }
        })
    }
}

impl fmt::Debug for TensorView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TensorView({} {}, {} bytes)",
            self.dtype,
            self.shape,
            self.bytes.len()
        )
    }
}

/// An owned tensor. Its bytes are 8-byte aligned, so typed access to any
/// dtype always succeeds.
#[derive(Clone, PartialEq, Eq)]
pub struct Tensor {
    dtype: DType,
    shape: Shape,
    data: AlignedBytes,
}

impl Tensor {
    /// A tensor holding a copy of `bytes`, checked against `dtype` and `shape`.
    pub fn new(dtype: DType, shape: impl Into<Shape>, bytes: &[u8]) -> Result<Tensor> {
        Ok(TensorView::new(dtype, shape, bytes)?.to_tensor())
    }

    /// A tensor from typed elements.
    pub fn from_vec<T: Element>(shape: impl Into<Shape>, data: Vec<T>) -> Result<Tensor> {
        Tensor::new(T::DTYPE, shape, as_bytes(&data))
    }

    /// A zero-filled tensor.
    pub fn zeros(dtype: DType, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        let len = shape.byte_len(dtype)?;
        Ok(Tensor {
            dtype,
            shape,
            data: AlignedBytes::zeroed(len),
        })
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
        self.data.as_slice()
    }

    /// The raw bytes, writable (the length is fixed by the shape).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.data.as_mut_slice()
    }

    /// A borrowed view.
    pub fn view(&self) -> TensorView<'_> {
        TensorView {
            dtype: self.dtype,
            shape: self.shape.clone(),
            bytes: self.data.as_slice(),
        }
    }

    /// The elements as a typed slice (see [`TensorView::as_slice`]).
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        cast_slice(self.dtype, self.data.as_slice())
    }

    /// A tensor with a copy of an `ndarray` array's elements in logical
    /// (C) order, whatever its memory layout.
    #[cfg(feature = "ndarray")]
    pub fn from_ndarray<T, S, D>(array: &ndarray::ArrayBase<S, D>) -> Tensor
    where
        T: Element,
        S: ndarray::Data<Elem = T>,
        D: ndarray::Dimension,
    {
        let shape = Shape::from(array.shape());
        let data = match array.as_slice() {
            Some(contiguous) => AlignedBytes::copy_from(as_bytes(contiguous)),
            None => AlignedBytes::copy_from(as_bytes(&array.iter().copied().collect::<Vec<T>>())),
        };
        Tensor {
            dtype: T::DTYPE,
            shape,
            data,
        }
    }

    /// A zero-copy `ndarray` view of this tensor.
    #[cfg(feature = "ndarray")]
    pub fn as_ndarray<T: Element>(&self) -> Result<ndarray::ArrayViewD<'_, T>> {
        self.view().to_ndarray()
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({} {}, {} bytes)",
            self.dtype, self.shape, self.data.len
        )
    }
}

impl<'a> From<&'a Tensor> for TensorView<'a> {
    fn from(t: &'a Tensor) -> TensorView<'a> {
        t.view()
    }
}

fn check_len(dtype: DType, shape: &Shape, actual: usize) -> Result<()> {
    let expected = shape.byte_len(dtype)?;
    if expected != actual {
        return Err(TensorError::ByteLength {
            dtype,
            shape: shape.clone(),
            expected,
            actual,
        });
    }
    Ok(())
}

fn as_bytes<T: Element>(data: &[T]) -> &[u8] {
    // SAFETY: `Element` types are plain old data without padding, so every
    // byte of the slice is initialised; u8 has alignment 1 and the length
    // in bytes is exactly size_of_val(data).
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

fn cast_slice<T: Element>(dtype: DType, bytes: &[u8]) -> Result<&[T]> {
    if T::DTYPE != dtype {
        return Err(TensorError::DTypeMismatch {
            expected: T::DTYPE,
            actual: dtype,
        });
    }
    let align = std::mem::align_of::<T>();
    let address = bytes.as_ptr() as usize;
    if !address.is_multiple_of(align) {
        return Err(TensorError::Misaligned {
            dtype,
            address,
            align,
        });
    }
    T::check(bytes).map_err(|index| TensorError::InvalidBool {
        index,
        byte: bytes[index],
    })?;
    // SAFETY: the pointer is aligned for T (checked above), `bytes.len()` is
    // a multiple of size_of::<T>() (views check their length against the
    // shape), T::check accepted every element's bit pattern, and the result
    // borrows `bytes`, so it cannot outlive the memory.
    Ok(unsafe {
        std::slice::from_raw_parts(
            bytes.as_ptr().cast::<T>(),
            bytes.len() / std::mem::size_of::<T>(),
        )
    })
}

/// A byte buffer aligned to 8 bytes (the largest dtype), so owned tensors
/// always allow typed access.
#[derive(Clone, PartialEq, Eq)]
struct AlignedBytes {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBytes {
    fn zeroed(len: usize) -> AlignedBytes {
        AlignedBytes {
            words: vec![0; len.div_ceil(8)],
            len,
        }
    }

    fn copy_from(bytes: &[u8]) -> AlignedBytes {
        let mut out = AlignedBytes::zeroed(bytes.len());
        out.as_mut_slice().copy_from_slice(bytes);
        out
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialised bytes (len.div_ceil(8)
        // words) and u8 has alignment 1.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and the unique borrow of self makes the
        // byte slice the only access to the words.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }
}
